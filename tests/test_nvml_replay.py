"""The sampler, dmon, topology and advice fed with raw NVML answers recorded on an H200
(tests/data/nvml_h200.json, by tools/record_nvml.py: idle, then bf16 matmul loops; its
"recorded.note" says what else ran).

Expectations are computed from the recording's raw answers or from physics (a matmul loop is
busier than idle), never copied from the code's output.
"""

from __future__ import annotations

import io
import json
import statistics
from pathlib import Path

import pytest

from tb_gpuprof.analysis.rules.nvml import THROTTLE_PCT, batch_size_advice, throttling_advice
from tb_gpuprof.nvml import NvmlSampler, NvmlUnavailableError
from tb_gpuprof.nvml.dmon import header_lines, run_dmon
from tb_gpuprof.nvml.fields import POWER_REASONS, THERMAL_REASONS, decode_clock_events
from tb_gpuprof.nvml.topology import topology_from_backend
from tests.nvml_replay import FaultBackend, ReplayBackend

DATA = Path(__file__).parent / "data"
RECORDING = DATA / "nvml_h200.json"

pytestmark = pytest.mark.skipif(not RECORDING.exists(), reason="H200 NVML recording not present")


@pytest.fixture(scope="module")
def rec() -> dict:
    return json.loads(RECORDING.read_text())


def uuid0(rec: dict) -> str:
    return next(d["uuid"] for d in rec["devices"] if d.get("mig_parent_uuid") is None)


def run_all(rec: dict, backend=None) -> tuple[NvmlSampler, list[tuple[str, list]]]:
    """One sampler tick per recorded tick; returns (sampler, [(phase, samples)])."""
    sampler = NvmlSampler(backend=backend or ReplayBackend(rec), cuda_visible_devices=None)
    assert sampler.open(), sampler.unavailable_reason
    out = [(tick["phase"], sampler.sample_once()) for tick in rec["ticks"]]
    return sampler, out


def phase_values(ticks: list[tuple[str, list]], phase: str, metric: str) -> list[float]:
    return [s.values[metric] for p, samples in ticks if p == phase for s in samples
            if metric in s.values]


def test_recording_has_idle_and_load(rec) -> None:
    phases = [t["phase"] for t in rec["ticks"]]
    assert phases.count("idle") >= 5 and phases.count("load") >= 20
    assert rec["devices"][0]["name"].startswith("NVIDIA")


def test_raw_answers_become_metrics_with_units(rec) -> None:
    _, ticks = run_all(rec)
    u = uuid0(rec)
    for tick, (_, samples) in zip(rec["ticks"], ticks, strict=True):
        raw = tick["devices"][u]["raw"]
        values = samples[0].values
        if isinstance(raw.get("power_usage"), int):
            assert values["power_w"] == pytest.approx(raw["power_usage"] / 1000)
        if isinstance(raw.get("memory_info"), dict):
            assert values["fb_used_mib"] == pytest.approx(raw["memory_info"]["used"] / 2**20)
        if isinstance(raw.get("clock_event_reasons"), int):
            assert samples[0].clock_events == decode_clock_events(raw["clock_event_reasons"])


def test_load_is_busier_than_idle(rec) -> None:
    _, ticks = run_all(rec)
    for metric in ("sm_util_pct", "power_w", "sm_clock_mhz"):
        idle, load = phase_values(ticks, "idle", metric), phase_values(ticks, "load", metric)
        assert idle and load, metric
        assert statistics.mean(load) > statistics.mean(idle), metric
    if rec["devices"][0].get("gpm_supported"):
        for metric in ("sm_active_pct", "tensor_active_pct", "hmma_tensor_active_pct"):
            load = phase_values(ticks, "load", metric)
            idle = phase_values(ticks, "idle", metric)
            assert statistics.mean(load) > 50 > statistics.mean(idle or [0.0]), metric
        # a bf16 GEMM is tensor-core work, not FP64 or INT8
        load = phase_values(ticks, "load", "hmma_tensor_active_pct")
        assert statistics.mean(load) > statistics.mean(
            phase_values(ticks, "load", "imma_tensor_active_pct") or [0.0])


def test_process_memory_appears_once_torch_holds_memory(rec) -> None:
    _, ticks = run_all(rec)
    load = phase_values(ticks, "load", "process_mem_mib")
    reserved = rec["recorded"].get("load", {}).get("memory_reserved_mib")
    if not load or not reserved:
        pytest.skip("NVML did not attribute memory to the recorder's PID (container PIDs)")
    # NVML counts the CUDA context too, so it sees at least what torch reserved
    assert max(load) >= reserved


def test_recorded_errors_retire_fields_once(rec) -> None:
    u = uuid0(rec)
    first = rec["ticks"][0]["devices"][u]["raw"]
    recorded_unsupported = {k for k, v in first.items()
                            if isinstance(v, dict) and v.get("error") == "NOT_SUPPORTED"}
    inject = {"temperature_memory"} if not recorded_unsupported else set()
    backend = FaultBackend(ReplayBackend(rec), unsupported=inject)
    sampler, ticks = run_all(rec, backend)
    for field in recorded_unsupported | inject:
        assert sampler.unsupported[0][field] == "NOT_SUPPORTED"
        assert backend.requests[(u, field)] == 1
    assert all(s.values.get("gpu_temp_c") is not None for _, samples in ticks for s in samples)


def test_gpu_lost_mid_replay_never_raises(rec) -> None:
    u = uuid0(rec)
    half = len(rec["ticks"]) // 2
    backend = FaultBackend(ReplayBackend(rec), lost_after={u: half})
    sampler, ticks = run_all(rec, backend)
    assert sum(len(samples) for _, samples in ticks) == half
    assert sampler.all_lost and len([w for w in sampler.warnings if "lost" in w]) == 1


def test_gpm_unsupported_on_real_data_keeps_nvml_fields(rec) -> None:
    sampler, ticks = run_all(rec, FaultBackend(ReplayBackend(rec), gpm_unsupported=True))
    assert not phase_values(ticks, "load", "sm_active_pct")
    assert phase_values(ticks, "load", "sm_util_pct")
    assert sampler.unsupported[0]["gpm"] == "NOT_SUPPORTED"


def test_dmon_rows_match_the_recording(rec, tmp_path) -> None:
    out = io.StringIO()
    n = len(rec["ticks"]) - 1  # dmon's first tick primes GPM and prints nothing
    assert run_dmon(0.001, n, None, backend=ReplayBackend(rec), out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[:2] == header_lines()
    cols = lines[0][1:].split()
    rows = [ln.split() for ln in lines if not ln.startswith("#")]
    assert len(rows) == n
    u = uuid0(rec)
    for tick, row in zip(rec["ticks"][1:], rows, strict=True):
        raw = tick["devices"][u]["raw"]
        if isinstance(raw.get("clock_sm"), int):
            assert row[cols.index("pclk")] == str(raw["clock_sm"])
        if isinstance(raw.get("temperature_gpu"), int):
            assert row[cols.index("gtemp")] == str(raw["temperature_gpu"])
        gpm = tick["devices"][u].get("gpm") or {}
        if isinstance(gpm.get("5"), float):
            assert row[cols.index("tensor")] == f"{gpm['5']:.0f}"


def test_advice_on_the_recording(rec) -> None:
    sampler, ticks = run_all(rec)
    load = [s for p, samples in ticks if p == "load" for s in samples]
    summary = sampler.window_summary(load)
    # the matmul loop keeps the SMs busy: never "increase the batch size"
    assert batch_size_advice(summary) is None
    # throttling fires exactly when the raw clock-event bits say so
    u = uuid0(rec)
    masks = [t["devices"][u]["raw"].get("clock_event_reasons") for t in rec["ticks"]
             if t["phase"] == "load"]
    masks = [m for m in masks if isinstance(m, int)]
    names = [set(decode_clock_events(m)) for m in masks]
    share = max(100 * sum(bool(n & kind) for n in names) / len(names)
                for kind in (POWER_REASONS, THERMAL_REASONS, {"hw_slowdown"}))
    assert (throttling_advice(summary) is not None) == (share >= THROTTLE_PCT)


def test_topology_from_the_recording(rec) -> None:
    backend = ReplayBackend(rec)
    backend.init()
    topo = topology_from_backend(backend, [uuid0(rec)])
    n = len([d for d in rec["devices"] if d.get("mig_parent_uuid") is None])
    assert len(topo["matrix"]) == n and topo["matrix"][0][0] == "X"
    assert topo["job_nvml_indices"] == [rec["devices"][0]["index"]]


def test_bad_replay_files_are_one_line_errors(tmp_path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(NvmlUnavailableError, match=r"x\.json: cannot read NVML replay file"):
        ReplayBackend(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(NvmlUnavailableError, match="not an NVML replay file"):
        ReplayBackend(bad)
