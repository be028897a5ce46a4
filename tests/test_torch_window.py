"""The one torch.profiler window both torch-side hooks use (tb_gpuprof.capture.torch_window),
on a real CPU torch.profiler: its two ways of being driven, the other-profiler check, CUPTI's
teardown plan and hold, the exported trace, and aborting."""

from __future__ import annotations

import json
import os
import warnings
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tb_gpuprof.capture.hookcore import GpuProfWarning  # noqa: E402
from tb_gpuprof.capture.torch_env import CuptiTeardownHold  # noqa: E402
from tb_gpuprof.capture.torch_window import OTHER_PROFILER, TorchProfilerWindow  # noqa: E402

OPTIONS = SimpleNamespace(record_shapes=True, with_flops=True, with_stack=False,
                          record_memory=False)


def work(tag: str) -> None:
    """One iteration's CPU work, named so the trace says which iteration it came from."""
    with torch.profiler.record_function(tag):
        torch.mm(torch.randn(16, 16), torch.randn(16, 16))


def trace_names(path: str) -> set[str]:
    with open(path) as f:
        return {e.get("name", "") for e in json.load(f)["traceEvents"]}


def no_profiler_running() -> bool:
    return not torch._C._autograd._profiler_enabled()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)


def test_scheduled_window_warms_up_then_records_and_exports(tmp_path):
    win = TorchProfilerWindow(torch, CuptiTeardownHold(), OPTIONS, cuda=False, record_from=5)
    assert win.start(4) is False  # iteration 4 is the warm-up
    work("iter4")
    win.step()
    for i in (5, 6):
        work(f"iter{i}")
        win.step()
    win.stop()
    assert no_profiler_running()
    path = str(tmp_path / "w.pt.trace.json")
    win.export(path)
    names = trace_names(path)
    assert {"iter5", "iter6", "ProfilerStep#5", "ProfilerStep#6"} <= names
    assert "iter4" not in names and "ProfilerStep#4" not in names  # warm-up keeps nothing
    assert win.prof is None  # the results are freed at the export, not left to the GC


def test_a_window_starting_on_its_first_recorded_step_records_at_once(tmp_path):
    win = TorchProfilerWindow(torch, CuptiTeardownHold(), OPTIONS, cuda=False, record_from=0)
    assert win.start(0) is True
    work("iter0")
    win.step()
    win.stop()
    win.export(str(tmp_path / "t.json"))
    assert {"iter0", "ProfilerStep#0"} <= trace_names(str(tmp_path / "t.json"))


def test_phased_window_records_between_record_and_stop_with_step_markers(tmp_path):
    win = TorchProfilerWindow(torch, CuptiTeardownHold(), OPTIONS, cuda=False)
    win.prepare()
    work("before")
    win.record()
    with win.step_marker(7):
        work("inside")
    win.stop()
    assert no_profiler_running()
    win.export(str(tmp_path / "p.json"))
    names = trace_names(str(tmp_path / "p.json"))
    assert {"inside", "ProfilerStep#7"} <= names and "before" not in names
    with pytest.raises(TypeError, match="record_from"):
        TorchProfilerWindow(torch, CuptiTeardownHold(), OPTIONS, cuda=False).start(0)


def test_another_running_profiler_is_refused_before_anything_changes():
    hold = CuptiTeardownHold()
    outside = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    outside.start()
    try:
        with pytest.raises(RuntimeError) as err:
            TorchProfilerWindow(torch, hold, OPTIONS, cuda=False, record_from=0)
        assert str(err.value) == OTHER_PROFILER
        assert "another profiler" in OTHER_PROFILER and "no window report" in OTHER_PROFILER
    finally:
        outside.stop()
    # once the other profiler is gone a window starts
    win = TorchProfilerWindow(torch, hold, OPTIONS, cuda=False, record_from=0)
    win.start(0)
    win.abort()
    assert no_profiler_running()


@pytest.mark.parametrize("record_from", [None, 3])
def test_abort_stops_a_window_that_never_recorded(tmp_path, record_from):
    win = TorchProfilerWindow(torch, CuptiTeardownHold(), OPTIONS, cuda=False,
                              record_from=record_from)
    calls: list[str] = []
    for phase in ("start_trace", "stop_trace"):
        real = getattr(win.prof, phase)
        setattr(win.prof, phase, lambda real=real, phase=phase: (calls.append(phase), real()))
    if record_from is None:
        win.prepare()
        win.abort()
        assert calls == ["start_trace", "stop_trace"]  # a prepared trace ends started
    else:
        assert win.start(2) is False  # warm-up: torch's own exit starts, then stops it
        win.abort()
    assert no_profiler_running()
    win.prof = None
    win.abort()  # nothing left to stop: no error
    # nothing was left running: the next window records
    again = TorchProfilerWindow(torch, CuptiTeardownHold(), OPTIONS, cuda=False, record_from=0)
    again.start(0)
    work("next")
    again.stop()
    again.export(str(tmp_path / "next.json"))
    assert "next" in trace_names(str(tmp_path / "next.json"))


def test_teardown_sets_the_variable_for_the_start_and_holds_it_after_the_stop():
    hold = CuptiTeardownHold(hold_s=0.0, hold_steps=1)
    win = TorchProfilerWindow(torch, hold, OPTIONS, cuda=False)
    win.teardown = True
    seen = []
    real_prepare = win.prof.prepare_trace
    win.prof.prepare_trace = lambda: (seen.append(os.environ.get("TEARDOWN_CUPTI")),
                                      real_prepare())
    win.record()
    assert seen == ["1"] and "TEARDOWN_CUPTI" not in os.environ  # only inside the start
    win.stop()
    assert hold.held and os.environ.get("TEARDOWN_CUPTI") == "1"  # until Kineto tore down
    hold.step()
    assert not hold.held and "TEARDOWN_CUPTI" not in os.environ


def test_without_teardown_the_stop_leaves_the_environment_alone():
    hold = CuptiTeardownHold()
    win = TorchProfilerWindow(torch, hold, OPTIONS, cuda=False, record_from=0)
    win.start(0)
    win.stop()
    assert not hold.held and "TEARDOWN_CUPTI" not in os.environ


def test_plan_teardown_releases_an_earlier_hold_and_warns_once(monkeypatch):
    hold = CuptiTeardownHold(hold_s=60.0)
    hold.stop(lambda: None)  # an earlier window's stop, still held
    warned: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CPU only: CUPTI is never attached, nothing to say
        assert TorchProfilerWindow.plan_teardown(torch, hold, cuda=False, warned=warned) is False
    assert not hold.held and "TEARDOWN_CUPTI" not in os.environ and not warned

    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # the user's (or torch's CUDA-graph) value
    with pytest.warns(GpuProfWarning, match="no CUPTI teardown after the window"):
        assert TorchProfilerWindow.plan_teardown(torch, hold, cuda=True, warned=warned) is False
    assert warned == {"cupti teardown"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per hook
        assert TorchProfilerWindow.plan_teardown(torch, hold, cuda=True, warned=warned) is False
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")  # Kineto tears down anyway
    assert TorchProfilerWindow.plan_teardown(torch, hold, cuda=True, warned=set()) is False
