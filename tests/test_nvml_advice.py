"""NVML-based recommendations: each rule fires on its evidence and stays silent otherwise.

Telemetry comes from the real sampler (window_summary over real Sample objects), topology from
topology_from_backend over a fake host, so the rules read what production code writes.
"""

from __future__ import annotations

import pytest

from tb_gpuprof.analysis.rules import recommend
from tb_gpuprof.analysis.rules.nvml import (
    MIN_SAMPLES,
    batch_size_advice,
    gpu_placement_advice,
    throttling_advice,
)
from tb_gpuprof.nvml import NvmlSampler, Sample
from tb_gpuprof.nvml.fields import decode_clock_events
from tb_gpuprof.nvml.topology import topology
from tests.nvml_fake import FakeGpu, FakeNvml
from tests.nvml_replay import ReplayBackend

GIB_MIB = 1024.0


def summary(per_gpu: dict[int, list[tuple[dict[str, float], int]]]) -> dict:
    """window_summary of a sampler over given samples ({gpu: [(values, clock mask)]})."""
    data = {"format": "tb_gpuprof-nvml-replay", "version": 1, "recorded": {"pid": 1},
            "devices": [{"index": g, "uuid": f"GPU-{g}", "name": "H200"} for g in per_gpu],
            "ticks": []}
    sampler = NvmlSampler(backend=ReplayBackend(data), cuda_visible_devices=None)
    assert sampler.open()
    samples = [Sample(time=float(t), gpu=g, values=v, clock_events=decode_clock_events(mask))
               for g, rows in per_gpu.items() for t, (v, mask) in enumerate(rows)]
    return sampler.window_summary(samples)


def busy(sm_active: float, own_mib: float, n: int = 10, mask: int = 0) -> list:
    return [({"sm_active_pct": sm_active, "sm_util_pct": 100.0, "process_mem_mib": own_mib,
              "fb_total_mib": 140 * GIB_MIB, "fb_used_pct": 90.0, "sm_clock_mhz": 1700.0}, mask)
            ] * n


def test_batch_size_fires_on_low_memory_and_low_sm_activity() -> None:
    rec = batch_size_advice(summary({0: busy(20.0, 10 * GIB_MIB)}))
    assert rec is not None and rec["id"] == "batch_size" and rec["severity"] == "high"
    ev = rec["evidence"]["gpus"][0]
    assert ev["memory_source"] == "process"  # this process's memory, not the whole device's
    assert ev["memory_used_pct"] == pytest.approx(100 * 10 / 140, abs=0.1)
    assert set(rec["fix"]) >= {"pytorch", "keras", "jax"}


@pytest.mark.parametrize(("sm_active", "own_gib"), [(80.0, 10.0), (20.0, 100.0)])
def test_batch_size_silent_when_memory_or_activity_is_high(sm_active, own_gib) -> None:
    assert batch_size_advice(summary({0: busy(sm_active, own_gib * GIB_MIB)})) is None


def test_batch_size_needs_every_gpu_underused_and_enough_samples() -> None:
    assert batch_size_advice(summary({0: busy(20.0, 5 * GIB_MIB),
                                      1: busy(90.0, 5 * GIB_MIB)})) is None
    assert batch_size_advice(summary({0: busy(20.0, 5 * GIB_MIB, n=MIN_SAMPLES - 1)})) is None
    assert batch_size_advice(None) is None


def test_batch_size_without_gpm_uses_nvml_utilization() -> None:
    rows = [({"sm_util_pct": 40.0, "fb_used_pct": 30.0}, 0)] * 10
    rec = batch_size_advice(summary({0: rows}))
    assert rec is not None and "sm_util_pct" in rec["evidence"]["gpus"][0]
    assert rec["evidence"]["gpus"][0]["memory_source"] == "device"


def test_throttling_fires_on_power_cap_share_and_names_it() -> None:
    rows = busy(90.0, 100 * GIB_MIB, n=6, mask=0x4) + busy(90.0, 100 * GIB_MIB, n=4)
    rec = throttling_advice(summary({0: rows}))
    assert rec is not None and rec["id"] == "throttling"
    assert rec["evidence"]["gpus"][0]["power_pct"] == pytest.approx(60.0)
    assert "power cap" in rec["title"] and rec["severity"] == "high"


def test_throttling_thermal_is_high_even_when_brief() -> None:
    rows = busy(90.0, 1.0, n=2, mask=0x40) + busy(90.0, 1.0, n=8)
    rec = throttling_advice(summary({0: rows}))
    assert rec is not None and "thermal" in rec["title"] and rec["severity"] == "high"


def test_throttling_silent_for_idle_or_rare_events() -> None:
    idle = busy(0.0, 1.0, n=20, mask=0x1)  # gpu_idle is not throttling
    assert throttling_advice(summary({0: idle})) is None
    rare = busy(90.0, 1.0, n=1, mask=0x4) + busy(90.0, 1.0, n=19)  # 5% < threshold
    assert throttling_advice(summary({0: rare})) is None


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU0<->GPU1 and GPU2<->GPU3 NVLink pairs; other pairs cross the SMP interconnect."""
    bus = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0", "00000000:AB:00.0"]
    peers = {0: 1, 1: 0, 2: 3, 3: 2}
    FakeNvml([FakeGpu(f"GPU-{i}", bus[i], nvlink_peers=[bus[peers[i]]] * 18)
              for i in range(4)]).install(monkeypatch)


def test_gpu_placement_fires_when_job_straddles_pcie_and_suggests_linked_gpus(host) -> None:
    rec = gpu_placement_advice(topology(cuda_visible_devices="1,2"))
    assert rec is not None and rec["id"] == "gpu_placement"
    assert rec["evidence"]["job_gpus"] == [1, 2]
    assert rec["evidence"]["nvlink_gpus"] == [0, 1]
    assert "CUDA_VISIBLE_DEVICES=0,1" in rec["fix"]["pytorch"]
    assert rec["evidence"]["pcie_pairs"] == ["GPU1-GPU2: SYS"]


def test_gpu_placement_silent_when_linked_single_or_no_alternative(host) -> None:
    assert gpu_placement_advice(topology(cuda_visible_devices="2,3")) is None
    assert gpu_placement_advice(topology(cuda_visible_devices="1")) is None
    # three GPUs: no three are pairwise NVLinked here, so there is nothing better to suggest
    assert gpu_placement_advice(topology(cuda_visible_devices="0,1,2")) is None
    assert gpu_placement_advice(None) is None


def test_the_registry_orders_nvml_advice_high_first() -> None:
    rows = busy(20.0, 5 * GIB_MIB, n=10, mask=0x40)
    recs = recommend({"telemetry": summary({0: rows})})  # no GPU work: only NVML advice fires
    assert [r["id"] for r in recs] == ["throttling", "batch_size"]
    for r in recs:
        assert set(r) >= {"id", "severity", "title", "problem", "evidence", "fix",
                          "estimated_saving_ms", "estimated_saving_pct"}
