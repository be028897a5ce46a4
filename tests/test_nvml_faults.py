"""NVML failure modes through the real NvmlBackend (libnvidia-ml replaced by tests/nvml_fake.py)
and through FaultBackend: none may raise into the caller."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pynvml
import pytest

from tb_gpuprof.nvml import NvmlSampler, NvmlUnavailableError, topology
from tb_gpuprof.nvml.backend import NvmlBackend
from tb_gpuprof.nvml.dmon import header_lines, run_dmon
from tb_gpuprof.nvml.fields import MIB
from tests.nvml_fake import FakeGpu, FakeNvml


def _gpus(**first: object) -> list[FakeGpu]:
    return [FakeGpu("GPU-aaaa-1111", "00000000:18:00.0", **first),  # type: ignore[arg-type]
            FakeGpu("GPU-bbbb-2222", "00000000:2A:00.0")]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml(_gpus())
    nvml.install(monkeypatch)
    return nvml


def _nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_loads(), reason="this machine has a working NVML")
def test_no_driver_sampler_reports_reason_and_dmon_exits_2_with_one_line(tmp_path) -> None:
    sampler = NvmlSampler()
    assert sampler.start() is False
    assert sampler.unavailable_reason and sampler.unavailable_reason.startswith("NVML unavailable")
    assert sampler.drain() == [] and sampler.scalars([]) == {}
    sampler.stop()  # harmless when never started
    p = subprocess.run([sys.executable, "-m", "tb_gpuprof", "dmon", "--count", "1",
                        "--logdir", str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tb-gpuprof dmon: error: NVML unavailable")
    assert not (tmp_path / "run").exists()  # nothing recorded


@pytest.mark.parametrize(("code", "words"), [
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so not found"),
])
def test_init_failure_is_one_clear_reason(monkeypatch, code: int, words: str) -> None:
    FakeNvml(_gpus(), init_error=code).install(monkeypatch)
    sampler = NvmlSampler()
    assert sampler.start() is False
    assert words in sampler.unavailable_reason
    assert "\n" not in sampler.unavailable_reason
    with pytest.raises(NvmlUnavailableError, match=words):
        topology()
    with pytest.raises(NvmlUnavailableError, match=words):
        run_dmon(0.1, 1, None, out=io.StringIO())


def test_no_gpu_visible_is_unavailable(fake) -> None:
    sampler = NvmlSampler(cuda_visible_devices="")
    assert sampler.start() is False
    assert "no GPU visible" in sampler.unavailable_reason
    sampler = NvmlSampler(devices=[5], cuda_visible_devices=None)
    assert sampler.start() is False
    assert "GPU 5 requested" in sampler.unavailable_reason


def test_field_not_supported_is_dropped_once_and_never_queried_again(monkeypatch) -> None:
    nvml = FakeNvml(_gpus(not_supported={"nvmlDeviceGetFieldValues"}))
    nvml.install(monkeypatch)
    sampler = NvmlSampler(cuda_visible_devices="0")
    assert sampler.open()
    rounds = [sampler.sample_once() for _ in range(5)]
    assert all(len(r) == 1 for r in rounds)
    assert all("mem_temp_c" not in r[0].values for r in rounds)
    assert all(r[0].values["gpu_temp_c"] == 45 for r in rounds)  # neighbours unaffected
    assert nvml.calls.count("nvmlDeviceGetFieldValues") == 1
    assert sampler.unsupported[0]["temperature_memory"] == "NOT_SUPPORTED"
    summary = sampler.window_summary([s for r in rounds for s in r])
    assert summary["gpus"][0]["unsupported"]["temperature_memory"] == "NOT_SUPPORTED"
    sampler.stop()


def test_transient_errors_skip_values_then_retire_the_field(monkeypatch) -> None:
    nvml = FakeNvml(_gpus())
    nvml.install(monkeypatch)

    def flaky(h: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", flaky)
    sampler = NvmlSampler(cuda_visible_devices="0", gpm=False)
    assert sampler.open()
    first = sampler.sample_once()[0]
    assert "power_w" not in first.values and "power" not in str(sampler.unsupported)
    for _ in range(4):
        sampler.sample_once()
    assert sampler.unsupported[0]["power_usage"] == "UNKNOWN"
    assert any("power_usage failed 3 times" in w for w in sampler.warnings)
    sampler.stop()


def test_gpu_lost_mid_run_stops_that_gpu_with_one_warning(fake, caplog) -> None:
    sampler = NvmlSampler(interval_s=0.02)
    assert sampler.start()
    deadline = time.monotonic() + 10
    seen: list = []
    while len(seen) < 6 and time.monotonic() < deadline:
        seen += sampler.drain()
        time.sleep(0.02)
    fake.gpus[0].lost = True
    before = sampler.ticks
    while sampler.ticks < before + 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    seen += sampler.drain()
    lost_warnings = [w for w in sampler.warnings if "lost" in w]
    assert len(lost_warnings) == 1 and "GPU 0" in lost_warnings[0]
    assert caplog.text.count("is lost") == 1
    last = max(s.time for s in seen if s.gpu == 0)
    assert any(s.gpu == 1 and s.time > last for s in seen)  # the other GPU carried on
    gpus = sampler.window_summary(seen)["gpus"]
    assert gpus[0]["lost"] is True and gpus[1]["lost"] is False


def test_all_gpus_lost_ends_dmon_cleanly(fake) -> None:
    for g in fake.gpus:
        g.lost = True
    out = io.StringIO()
    assert run_dmon(0.01, 50, None, out=out) == 0
    assert "all GPUs lost" in out.getvalue()


def test_gpm_unsupported_falls_back_to_nvml_pcie(monkeypatch) -> None:
    FakeNvml(_gpus(gpm=False)).install(monkeypatch)
    sampler = NvmlSampler(cuda_visible_devices="0,1")
    assert sampler.open()
    sampler.sample_once()
    time.sleep(0.12)  # GPM pairs need >= 100 ms
    by_gpu = {s.gpu: s for s in sampler.sample_once()}
    assert "sm_active_pct" not in by_gpu[0].values
    assert by_gpu[0].values["pcie_tx_mib_s"] == pytest.approx(2048 * 1000 / MIB)
    assert sampler.unsupported[0]["gpm"] == "NOT_SUPPORTED"
    # the GPM GPU measures PCIe through GPM and skips the blocking 20 ms NVML call
    assert by_gpu[1].values["sm_active_pct"] == pytest.approx(12.0)
    assert by_gpu[1].values["pcie_tx_mib_s"] == pytest.approx(30.0)
    sampler.stop()


def test_gpm_metric_not_supported_is_retired(fake) -> None:
    sampler = NvmlSampler(cuda_visible_devices="0")
    assert sampler.open()
    assert sampler.sample_once()[0].values.get("sm_active_pct") is None  # first GPM sample
    time.sleep(0.12)
    values = sampler.sample_once()[0].values
    assert values["tensor_active_pct"] == pytest.approx(15.0)
    assert "nvlink_rx_mib_s" not in values
    assert sampler.unsupported[0]["nvlink_rx_mib_s"] == "NOT_SUPPORTED"
    calls = fake.calls.count("nvmlGpmMetricsGet")
    time.sleep(0.12)
    sampler.sample_once()
    assert fake.calls.count("nvmlGpmMetricsGet") == calls + 1  # GPM itself keeps going
    sampler.stop()


def test_gpm_pairs_are_at_least_100ms_apart(fake) -> None:
    sampler = NvmlSampler(cuda_visible_devices="0")
    assert sampler.open()
    for _ in range(5):  # back to back: far less than 100 ms
        sampler.sample_once()
    assert fake.calls.count("nvmlGpmMetricsGet") == 0
    sampler.stop()


def test_process_memory_is_this_pid_only(fake, monkeypatch) -> None:
    backend = NvmlBackend()
    monkeypatch.setattr(backend, "pid", 4242)
    sampler = NvmlSampler(cuda_visible_devices="0", backend=backend)
    assert sampler.open()
    assert sampler.sample_once()[0].values["process_mem_mib"] == pytest.approx(3 * 1024)
    sampler.stop()


def read_run(run_dir: str) -> tuple[dict[str, list[tuple[int, float]]], dict[str, object]]:
    """Scalars {tag: [(step, value)]} and JSON blobs {tag: obj} of a run, via the store."""
    from tb_gpuprof.store import schema
    from tb_gpuprof.store.reader import event_files, iter_events

    scalars: dict[str, list[tuple[int, float]]] = {}
    blobs: dict[str, object] = {}
    for path in event_files(run_dir):
        for event in iter_events(path):
            for v in event.summary.value:
                if v.HasField("tensor"):
                    blobs[v.tag] = schema.decode_json(v.tensor.string_val[0], v.tag)
                else:
                    scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars, blobs


def test_dmon_prints_header_and_rows_and_records_a_run(fake, tmp_path) -> None:
    out = io.StringIO()
    assert run_dmon(0.11, 3, str(tmp_path), out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[:2] == header_lines()
    rows = [ln.split() for ln in lines if not ln.startswith("#")]
    assert [r[0] for r in rows] == ["0", "1"] * 3
    cols = lines[0][1:].split()
    assert int(rows[0][cols.index("pwr")]) == 350 and rows[0][cols.index("pclk")] == "1980"
    scalars, blobs = read_run(str(tmp_path))
    assert [step for step, _ in scalars["gpuprof/gpu0/sm_util_pct"]] == [0, 1, 2]
    assert scalars["gpuprof/gpu1/power_w"][0][1] == pytest.approx(350.0)
    topo = blobs["gpuprof/topology"]
    assert topo["labels"] == ["GPU0", "GPU1"] and topo["job_nvml_indices"] == [0, 1]


def test_old_binding_without_a_function_retires_only_that_field(fake, monkeypatch) -> None:
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    sampler = NvmlSampler(cuda_visible_devices="0")
    assert sampler.open()
    for _ in range(3):
        samples = sampler.sample_once()
    assert samples[0].clock_events is None and samples[0].values["power_w"] == 350
    assert sampler.unsupported[0]["clock_event_reasons"] == "FUNCTION_NOT_FOUND"
    assert sampler.warnings == []
    sampler.stop()
