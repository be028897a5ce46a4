"""gpu/hook_alternation.py on CPU (smoke sizes): the in-process alternation that issue 13's
launch-bound figures come from runs a real loop with one long-lived hook, alternates hooked
and bare blocks in ABBA order, and counts the hook's threads and the window's export stall."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "..", "gpu", "hook_alternation.py")
sys.path.insert(0, os.path.join(HERE, "..", "gpu"))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))


def test_blocks_alternate_abba_and_pairs_keep_only_one_host_state():
    from hook_alternation import Alternation, pair_ratios

    alt = Alternation(k=2, pairs=4, sync=lambda: None)
    order = []
    for alt.block_no in range(8):
        order.append(alt.hooked())
    assert order == [False, True, True, False] * 2  # ABBA: drift cancels within a group
    blocks = [{"hooked": False, "ms": 10.0, "probe": 1.0, "probe_after": 1.1},
              {"hooked": True, "ms": 10.5, "probe": 1.0, "probe_after": 1.1},
              {"hooked": True, "ms": 20.0, "probe": 1.0, "probe_after": 2.0},  # a state switch
              {"hooked": False, "ms": 10.0, "probe": 1.0, "probe_after": 2.0}]
    assert pair_ratios(blocks) == [1.05]
    # by the training threads' CPU time instead: the same pairs, another clock
    for b, cpu in zip(blocks, (8.0, 8.4, 9.0, 9.0), strict=True):
        b["cpu_ms"] = cpu
    assert pair_ratios(blocks, "cpu_ms") == [pytest.approx(1.05)]


def test_the_training_clock_counts_this_threads_cpu_and_not_a_sleep():
    import threading
    import time

    from hook_alternation import TrainingClock

    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"):
        pytest.skip("no schedstat in this kernel")
    clock = TrainingClock(threading.get_native_id())
    clock.refresh()
    assert clock.tids[0] == threading.get_native_id()
    run0, _ = clock.read()
    t_end = time.perf_counter() + 0.2
    while time.perf_counter() < t_end:
        pass
    run1, _ = clock.read()
    time.sleep(0.2)
    run2, _ = clock.read()
    assert (run1 - run0) / 1e9 > 0.1  # a busy 0.2 s: mostly CPU
    assert (run2 - run1) / 1e9 < 0.05  # a sleep: none


def test_the_cupti_check_says_why_it_cannot_tell_without_libcupti():
    from launch_after_window import cupti_subscriber

    state = cupti_subscriber()
    assert state in ("free", "held") or state.startswith("unknown: ")


def test_a_smoke_run_measures_every_phase_with_the_real_torch_hook(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "alt.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--hook", "torch", "--smoke", "--replays",
                           "1", "--out", str(out)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(out.read_text())
    assert row["report"] is True
    before = row["blocks"]["before"]
    assert len(before) == 2 * row["pairs"] and len(row["blocks"]["after"]) == 2 * row["pairs"]
    assert [b[0] for b in before[:4]] == [0, 1, 1, 0]
    assert all(len(b) == 7 and b[4] > 0 for b in before)  # + the training threads' CPU
    assert all(a[6] == b[6] > 0 for a, b in zip(before[0::2], before[1::2], strict=True))
    assert row["before_hooked_over_bare_cpu"]["n"] == row["before_hooked_over_bare"]["n"]
    assert "cupti_after" in row and row["replay_on_over_off_cpu"]["n"] == 1
    assert row["before_hooked_over_bare"]["n"] + row["after_hooked_over_bare"]["n"] > 0
    counts = row["counts"]
    assert set(counts) == {"before", "window", "during", "after"}
    assert counts["before"]["iterations"] == 2 * row["pairs"] * row["k"]
    assert counts["before"]["per_iteration"]["training"]["cpu_us"] > 0
    assert "tb_gpuprof-scalars" in counts["after"]["per_iteration"]  # the hook's own thread
    # the hook's own calls, timed on the training thread in the hooked iterations only
    calls = counts["before"]["hook_calls_us"]
    assert 0 < calls["median"] <= calls["max"] and counts["before"]["calls_share"] > 0
    assert "hook_calls_us" not in counts["window"]
    # the export is timed on the hook, at the window's stop: its cost is the window's
    assert row["export_s"] > 0 and "window_extra_s" in row
    assert row["during_phase_over_before_phase"] > 0 and row["during_over_neighbours"] > 0
    # the analysis thread ran under the harness's CPU clock, for the whole analysis
    assert 0 < row["analysis_thread"]["cpu_s"] <= row["analysis_thread"]["wall_s"]
    assert row["analysis_thread"]["wall_s"] >= row["analysis_s"] * 0.99
    assert row["during_counted"] > 1
    # one replay pair: the analysis once more beside a bare block of as many iterations
    on, off = sorted(row["replay_blocks"], key=lambda b: -b[0])
    assert on[0] == 1 and off[0] == 0 and on[1] == off[1] > 0
    assert row["replay_on_over_off"]["n"] == 1 and row["replay_analysis_cpu_share"] > 0
    assert row["replay_copy_ms"] > 0  # the trace copy, timed apart from the blocks


def test_replay_blocks_alternate_abba_and_each_off_block_matches_the_last_on_block():
    from hook_alternation import Replay

    class Analysis:  # stands in for the analysis thread: alive for ``iterations`` steps
        def __init__(self, iterations: int) -> None:
            self.left = iterations

        def is_alive(self) -> bool:
            return self.left > 0

    lengths = iter([3, 5])
    replay = Replay(pairs=2, sync=lambda: None)
    replay.prepare = lambda: lambda: Analysis(next(lengths))  # type: ignore[assignment,return-value]
    going = True
    while going:
        replay.iteration_start()
        if replay.thread is not None:
            replay.thread.left -= 1  # type: ignore[attr-defined]
        going = replay.iteration_end()
    assert [(b["on"], b["iterations"]) for b in replay.blocks] == [
        (True, 3), (False, 3), (False, 3), (True, 5)]
    assert len(replay.ratios()) == 2


def test_repeated_windows_time_the_analysis_against_the_blocks_each_side(monkeypatch):
    import argparse
    import time

    from hook_alternation import NEAR_BLOCKS, repeated_windows

    class Hook:  # a window opens at ``first - 1``; its analysis runs for 4 blocks' worth
        def __init__(self, first: int) -> None:
            self.first, self.n, self.analysis_left = first, 0, 0
            self._analysis = None
            self.report, self.closed = {"ok": 1}, False
            self.export_seconds = self.analysis_seconds = 0.1
            self.analysis_timing = {"telemetry_s": 0.5, "child_s": 1.25}

        def step(self) -> None:
            self.n += 1
            if self.n == self.first + 3:  # the window's stop
                self._analysis, self.analysis_left = object(), 4 * 2

        def wait(self, timeout: float) -> bool:
            if self.analysis_left:
                self.analysis_left -= 1  # asked once per block
                return False
            return self._analysis is not None

        def close(self) -> None:
            self.closed = True

    hooks: list[Hook] = []

    def new_hook(first: int) -> Hook:
        hooks.append(Hook(first))
        return hooks[-1]

    args = argparse.Namespace(k=2, windows=3, window_control=False)
    out = repeated_windows(args, lambda: None, lambda: None, new_hook)
    assert len(hooks) == 3 and all(h.closed for h in hooks)
    assert hooks[0].first == NEAR_BLOCKS * 2 + 2
    row = out["windows"][0]
    assert len(row["ms"]["pre"]) == len(row["ms"]["post"]) == NEAR_BLOCKS
    assert row["during_blocks"] == 8 and row["during_over_near"] > 0
    assert out["windows_during_over_near"]["n"] == 3
    assert not any(r["control"] for r in out["windows"])
    assert not any("_analyze_in_child" in vars(h) for h in hooks)

    # --window-control: every other window's analysis is a sleep as long as the last real one
    hooks.clear()
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    out = repeated_windows(argparse.Namespace(k=2, windows=4, window_control=True),
                           lambda: None, lambda: None, new_hook)
    assert [r["control"] for r in out["windows"]] == [False, True, False, True]
    hooks[1]._analyze_in_child("trace", {}, 0.0, 1.0, 3)
    assert slept == [1.75]  # hooks[0]'s telemetry wait and child
    assert "_analyze_in_child" not in vars(hooks[2])
    assert out["windows_during_over_near"]["n"] == 2
    assert out["control_windows_during_over_near"]["n"] == 2
    assert out["windows_real_over_control"]["n"] == 2


def test_child_away_starts_children_off_the_training_threads_cpus(monkeypatch):
    import subprocess
    import threading

    import hook_alternation as ha

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nowhere else to put the child")
    monkeypatch.setattr(subprocess, "Popen", subprocess.Popen)  # restored afterwards
    monkeypatch.setattr(ha, "CHILD_CPUS", [])
    ha.keep_children_away(threading.get_native_id())
    script = "import os, time; time.sleep(0.5); print(len(os.sched_getaffinity(0)))"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=60)
    assert ha.CHILD_CPUS, "the child was not pinned"
    assert 0 < ha.CHILD_CPUS[-1] < len(os.sched_getaffinity(0))  # not this thread's CPU
    assert int(out) == ha.CHILD_CPUS[-1]  # the child runs on the CPUs it was given


def test_pooled_replays_group_by_hook_and_child_threads_and_keep_steady_pairs(tmp_path):
    from pool_replays import pooled

    def record(hook: str, limits: dict, blocks: list) -> dict:
        return {"hook": hook, "workload": "gpt2", "child_thread_limits": limits,
                "replay_blocks": blocks}

    steady = [[1, 20, 42.0, 1.2], [0, 20, 40.0, 1.2], [0, 20, 40.0, 1.3], [1, 20, 44.0, 1.3]]
    switched = [[1, 20, 60.0, 2.3], [0, 20, 40.0, 1.2]]  # the host changed state between
    out = pooled([record("torch", {"X": "1"}, steady),
                  record("torch", {"X": "1"}, switched),
                  record("torch", {}, steady[:2])])
    assert set(out) == {"torch gpt2", "torch gpt2 (child BLAS threads)"}
    assert out["torch gpt2"]["all"]["n"] == 3 and out["torch gpt2"]["same_state"]["n"] == 2
    assert out["torch gpt2"]["same_state"]["median"] == pytest.approx(1.075)
    assert out["torch gpt2"]["all"]["median"] == pytest.approx(1.1)
    assert out["torch gpt2 (child BLAS threads)"]["all"]["median"] == pytest.approx(1.05)

    # the always-on pairs pool the same way, from the ``blocks`` rows of a phase
    rows = [[0, 40.0, 1.2, 0, 40.0, 0.0, 1.2], [1, 41.0, 1.2, 0, 41.0, 0.0, 1.2],
            [1, 42.0, 1.2, 0, 42.0, 0.0, 2.4], [0, 40.0, 1.2, 0, 40.0, 0.0, 2.4],
            [1, 44.0, 1.3, 0, 44.0, 0.0], [0, 40.0, 1.3, 0, 40.0, 0.0]]  # an older record
    always_on = pooled([{"hook": "torch", "workload": "resnet50", "batch": 512,
                         "blocks": {"before": rows}}], "before")
    assert set(always_on) == {"torch resnet50 b512"}
    assert always_on["torch resnet50 b512"]["all"]["n"] == 3
    assert always_on["torch resnet50 b512"]["same_state"]["median"] == pytest.approx(1.0625)
    assert pooled([{"hook": "torch", "workload": "gpt2", "blocks": {"before": rows}}],
                  "after") == {}
    parts_off = pooled([{"hook": "torch", "workload": "gpt2", "off": "memory,nvtx",
                         "blocks": {"before": rows}}], "before")
    assert set(parts_off) == {"torch gpt2 off=memory,nvtx"}  # not pooled with the whole hook

    bad = tmp_path / "bad.json"
    bad.write_text("{")
    other = tmp_path / "contention.json"  # another harness's record: no hook, no workload
    other.write_text(json.dumps({"cpu": 0, "blocks": []}))
    for path in (bad, other):
        proc = subprocess.run([sys.executable, os.path.join(HERE, "..", "gpu",
                                                            "pool_replays.py"), str(path)],
                              capture_output=True, text=True, cwd=HERE)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert str(path) in proc.stderr


def test_the_null_makes_no_hook_call_outside_the_window_and_opens_the_window_early():
    import argparse

    from hook_alternation import Alternation, window_start

    calls: list[str] = []
    null, real = Alternation(1, 2, lambda: None, null=True), Alternation(1, 2, lambda: None)
    for alt in (null, real):
        alt.begin_phase("before")
        for _ in range(4):
            alt.iteration_start()
            if alt.hooked():
                alt.call(calls.append, "null" if alt.null else "real")
            alt.iteration_end(False)
        alt.end_phase()
    assert calls == ["real", "real"]  # the null's two hooked blocks made none
    assert null.counts["before"]["hook_calls_us"]["max"] == 0
    null.begin_phase("window")
    null.call(calls.append, "window")  # the window is hooked throughout, null or not
    assert calls[-1] == "window"
    args = argparse.Namespace(pairs=40, k=3, null=False)
    assert window_start(args) == 123
    args.null = True  # the hook saw no iteration before the window phase
    assert window_start(args) == 3


def test_the_hooks_calls_are_timed_by_name_and_off_names_the_options_to_turn_off():
    import argparse

    from hook_alternation import Alternation, off_options

    def batch_ready() -> None:
        time.sleep(0.002)

    def step() -> None:
        pass

    alt = Alternation(1, 2, lambda: None)
    alt.begin_phase("before")
    for _ in range(4):
        alt.iteration_start()
        if alt.hooked():
            alt.call(batch_ready)
            alt.call(step)
        alt.iteration_end(False)
    alt.end_phase()
    by = alt.counts["before"]["hook_calls_by_us"]
    assert set(by) == {"batch_ready", "step"}
    assert by["batch_ready"]["median"] >= 2000 > by["step"]["median"]
    total = alt.counts["before"]["hook_calls_us"]["median"]
    assert by["batch_ready"]["median"] <= total <= by["batch_ready"]["median"] + 1000
    assert off_options(argparse.Namespace(off="memory,nvtx")) == {"memory": False,
                                                                  "nvtx": False}
    assert off_options(argparse.Namespace(off="")) == {}
