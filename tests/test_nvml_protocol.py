"""nvml/protocol.py: the three backends implement NvmlApi, and a backend written only against
the Protocol drives the real sampler and topology (so the Protocol is all they need)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tb_gpuprof.nvml import NvmlSampler
from tb_gpuprof.nvml.backend import DeviceInfo, FieldError, NvmlBackend
from tb_gpuprof.nvml.protocol import NvmlApi
from tb_gpuprof.nvml.topology import topology_from_backend
from tests.nvml_replay import FaultBackend, ReplayBackend

RECORDING = Path(__file__).parent / "data" / "nvml_h200.json"


class TwoGpus:
    """Answers from a dict per GPU; nothing beyond the Protocol's members."""

    name = "two-gpus"
    pid = 4242

    def __init__(self) -> None:
        self.infos = [DeviceInfo(i, f"GPU-{i}", "NVIDIA H200", f"0000:{i:02x}:00.0",
                                 141 << 30) for i in range(2)]
        self.opened = False

    def init(self) -> None:
        self.opened = True

    def shutdown(self) -> None:
        self.opened = False

    def system_info(self) -> dict[str, Any]:
        return {"driver_version": "580.159"}

    def devices(self) -> list[DeviceInfo]:
        return list(self.infos)

    def read(self, uuid: str, fields: tuple[str, ...] | list[str]) -> dict[str, Any]:
        gpu = int(uuid.split("-")[1])
        answers = {"utilization": {"gpu": 50 + 40 * gpu, "memory": 20},
                   "power_usage": 300_000 + gpu * 100_000, "power_limit": 700_000,
                   "memory_info": {"used": 10 << 30, "total": 141 << 30},
                   "processes": [[self.pid, 8 << 30]]}
        return {f: answers.get(f, FieldError("NOT_SUPPORTED")) for f in fields}

    def gpm_supported(self, uuid: str) -> bool:
        return False

    def gpm_read(self, uuid: str, metric_ids: list[int]) -> dict[int, Any] | None:
        return None

    def topology_level(self, uuid_a: str, uuid_b: str, /) -> int | None:
        return 40  # NODE

    def nvlinks(self, uuid: str) -> list[dict[str, Any]]:
        return []

    def p2p_nvlink(self, uuid_a: str, uuid_b: str, /) -> bool | None:
        return False

    def cpu_affinity(self, uuid: str) -> list[int] | None:
        return [0, 1, 2, 3]

    def numa_node(self, uuid: str) -> int | None:
        return 0


def test_every_backend_implements_the_protocol():
    assert isinstance(NvmlBackend(), NvmlApi)  # nothing loaded until init()
    assert isinstance(TwoGpus(), NvmlApi)
    if RECORDING.exists():
        replay = ReplayBackend(RECORDING)
        assert isinstance(replay, NvmlApi)
        assert isinstance(FaultBackend(replay), NvmlApi)
    assert not isinstance(object(), NvmlApi)


def test_a_protocol_only_backend_drives_the_sampler_and_topology():
    backend = TwoGpus()
    sampler = NvmlSampler(backend=backend, cuda_visible_devices="0,1")
    with pytest.raises(RuntimeError):
        _ = NvmlSampler(backend=None).backend  # not opened: no backend yet
    assert sampler.open() and backend.opened
    samples = sampler.sample_once()
    scalars = sampler.scalars(samples)
    assert scalars["gpu0/sm_util_pct"] == 50 and scalars["gpu1/sm_util_pct"] == 90
    assert scalars["gpu1/power_w"] == pytest.approx(400.0)
    assert scalars["gpu0/process_mem_mib"] == pytest.approx(8 * 1024)
    topo = topology_from_backend(sampler.backend, [i.uuid for _, i in sampler.devices])
    assert topo["matrix"][0][1] == "NODE"
    sampler.stop()
    assert not backend.opened


def _produced(sampler: NvmlSampler, pause_s: float = 0.0) -> set[str]:
    assert sampler.open()
    samples = []
    for _ in range(4):
        samples += sampler.sample_once()
        time.sleep(pause_s)
    sampler.stop()
    produced = {name for s in samples for name in s.values}
    return produced | {k.split("/", 1)[1] for k in sampler.scalars(samples)}


@pytest.mark.skipif(not RECORDING.exists(), reason="H200 NVML recording not present")
def test_every_metric_the_replayed_h200_produces_is_declared():
    from tb_gpuprof.nvml.fields import METRICS

    produced = _produced(NvmlSampler(backend=ReplayBackend(RECORDING), cuda_visible_devices="0"))
    assert produced and produced <= {m.name for m in METRICS}, produced - {m.name for m in METRICS}


def test_every_metric_the_real_backend_produces_is_declared(monkeypatch):
    """NvmlBackend over a fake libnvidia-ml answering every field and GPM metric."""
    from tb_gpuprof.nvml.fields import GPM_METRICS, METRICS
    from tests.nvml_fake import FakeGpu, FakeNvml

    FakeNvml([FakeGpu("GPU-aaaa-1111", "00000000:18:00.0")]).install(monkeypatch)
    # GPM rates need two samples >= 100 ms apart (backend.GPM_MIN_INTERVAL_S)
    produced = _produced(NvmlSampler(backend=NvmlBackend(), cuda_visible_devices="0"), 0.11)
    declared = {m.name for m in METRICS}
    assert produced <= declared, produced - declared
    assert {"sm_util_pct", "power_w"} <= produced
    gpm = set(GPM_METRICS.values()) & produced
    assert {"sm_active_pct", "tensor_active_pct", "dram_bw_pct"} <= gpm  # GPM went through
