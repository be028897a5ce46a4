"""After a window, every later iteration's scalars carry the window's model TFLOP/s and MFU
(the hooks' shared flush path, with a real H200 report and a real event writer)."""

from __future__ import annotations

import threading

import pytest

from tb_gpuprof.capture.hookcore import HookCore
from tb_gpuprof.store.writer import EventWriter
from tests.h200 import report
from tests.runs import read_scalars


class Core(HookCore):
    def __init__(self, logdir: str) -> None:
        self._init_core(logdir, 3, 5, key=None, nvml_interval_s=None, with_stack=False,
                        record_shapes=True, with_flops=True, flush_secs=60.0)
        self._on = {"scalars": True}
        self._writer = EventWriter(logdir)


def test_later_iterations_wait_for_the_report_then_carry_its_flops(tmp_path):
    core = Core(str(tmp_path))
    done = threading.Event()
    core._analysis = threading.Thread(target=done.wait)  # the window's analysis, running
    core._analysis.start()
    for step in range(9):
        core._out.append((step, 0.0, {"gpuprof/iteration_time_ms": 100.0 + step}))
    core._flush_scalars()
    assert [s for s, _, _ in core._out] == [5, 6, 7, 8]  # held until the report exists
    rep = report("resnet50_amp")  # a real H200 window: FLOPs and an H200 peak
    core.report = rep
    done.set()
    core._analysis.join()
    core._flush_scalars()
    core._writer.close()
    scalars = read_scalars(str(tmp_path))
    flops = rep["throughput"]["flops_per_iteration"]
    peak = rep["throughput"]["peak_tflops"]
    assert flops > 1e12 and peak > 100
    assert sorted(scalars["gpuprof/model_tflops"]) == [5, 6, 7, 8]
    for step, v in scalars["gpuprof/model_tflops"].items():
        assert v == pytest.approx(flops / ((100.0 + step) * 1e-3) / 1e12, rel=1e-4)
        assert scalars["gpuprof/mfu_pct"][step] == pytest.approx(100 * v / peak, rel=1e-4)
    assert sorted(scalars["gpuprof/iteration_time_ms"]) == list(range(9))


def test_a_failed_analysis_releases_the_held_scalars(tmp_path):
    core = Core(str(tmp_path))
    core._analysis = threading.Thread(target=lambda: None)
    core._analysis.start()
    core._analysis.join()  # finished without a report
    for step in range(8):
        core._out.append((step, 0.0, {"gpuprof/iteration_time_ms": 10.0}))
    core._flush_scalars()
    core._writer.close()
    scalars = read_scalars(str(tmp_path))
    assert sorted(scalars["gpuprof/iteration_time_ms"]) == list(range(8))
    assert "gpuprof/model_tflops" not in scalars
