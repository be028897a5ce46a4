"""benchmarks/overhead_stats.py: the host-state matching the hook-overhead figures rest on."""

from __future__ import annotations

import ast
import itertools
import os
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

from overhead_stats import (
    Plan,
    TurnCoordinator,
    from_recorded,
    pair_ratios,
    paired_summary,
    state_matched_ratios,
    steady,
)

FAST, SLOW = (1.1, 27.0), (2.1, 38.0)  # (probe ms, loop ms) of the two vCPU states measured


def block(state: tuple[float, float], cost: float, rng: random.Random,
          switch_to: tuple[float, float] | None = None) -> tuple[float, float, float, float]:
    probe_after = (switch_to or state)[0]
    return (state[1] * cost * rng.uniform(0.99, 1.01), state[0], probe_after, 1.8)


def test_blocks_are_compared_within_their_host_state_only() -> None:
    rng = random.Random(1)
    states = [FAST if rng.random() < 0.3 else SLOW for _ in range(60)]
    bare = [block(s, 1.0, rng) for s in states]
    after = [block(s, 1.02, rng) for s in reversed(states)]  # a true 2% cost
    ratios = state_matched_ratios(after, bare)
    assert len(ratios) == 60
    assert 1.01 < sorted(ratios)[30] < 1.03
    # without matching, the median of after / median of bare depends on the state mix
    skewed = [block(FAST, 1.02, rng) for _ in range(40)] + [block(SLOW, 1.02, rng)
                                                            for _ in range(5)]
    raw = sorted(b[0] for b in skewed)[22] / sorted(b[0] for b in bare)[30]
    matched = sorted(state_matched_ratios(skewed, bare))[22]
    assert abs(raw - 1.02) > 0.1 and abs(matched - 1.02) < 0.01


def test_a_block_whose_state_switched_is_left_out() -> None:
    rng = random.Random(2)
    switched = block(FAST, 1.0, rng, switch_to=SLOW)
    assert not steady(switched) and steady(block(FAST, 1.0, rng))
    bare = [block(FAST, 1.0, rng) for _ in range(5)]
    assert state_matched_ratios([switched], bare) == []
    pairs = [(bare[0], switched), (bare[1], block(FAST, 1.05, rng))]
    assert len(pair_ratios(pairs, matched=True)) == 1
    assert len(pair_ratios(pairs, matched=False)) == 2


def test_a_recorded_row_summarises_as_the_run_did() -> None:
    rng = random.Random(3)
    plan = Plan(5, 4, 10, 1)
    order = plan.always_on_order()
    plan.record_always_on([(h, block(FAST, 1.01 if h else 1.0, rng)) for h in order])
    plan.begin_window()
    for _ in range(3):
        plan.record_post(block(SLOW, 1.0, rng), analysis_was_running=False)
    live = plan.result({"hook": "torch", "workload": "gpt2"})
    again = from_recorded(live)
    assert again["always_on_ratio"] == live["always_on_ratio"]
    assert 1.0 < live["always_on_ratio"] < 1.02
    assert again["after_window_n"] == 0  # no bare block of the slow state to compare with


def paired_run(turns: int, bare_turns: int, rng: random.Random,
               scale: Callable[[int, bool], float],
               state: Callable[[int], tuple[float, float]] = lambda i: SLOW,
               ) -> tuple[dict[str, Any], list[list[float]]]:
    """A treated and a control process taking turns, one block each per turn: the treated
    one's first ``bare_turns`` blocks are its bare (always-on) blocks, the rest "after".
    ``scale(turn, treated)``: a block's time factor; ``state(turn)``: the host state then.
    Returns the treated row (Plan.result) and the control blocks."""
    treated, control, t = [], [], 0.0
    for i in range(turns):
        for who in (control, treated):
            who.append((t, t + 0.15, block(state(i), scale(i, who is treated), rng)))
            t += 0.16
    control.append((t, t + 0.15, block(state(turns), scale(turns, False), rng)))
    plan = Plan(5, 0, 0, 1)
    plan.pairs = [(b, b) for _, _, b in treated[:bare_turns]]
    plan.bare = [b for _, b in plan.pairs]
    plan.post = [b for _, _, b in treated[bare_turns:]]
    plan.timeline = treated
    return plan.result({}), [[t0, t1, *b] for t0, t1, b in control]


def test_a_paired_ratio_cancels_a_drift_the_in_process_one_reports() -> None:
    # The host slows by 20% over the run; the treated process costs a true 1% after its
    # window (and 3% throughout: the two processes' fixed difference). In-process, the late
    # "after" blocks look 20% slower than the early bare ones; against a control process
    # timed in turn with it, the 1% is what remains.
    def scale(i: int, treated: bool) -> float:
        return (1.0 + 0.2 * i / 200) * ((1.03 * (1.01 if i >= 100 else 1.0)) if treated
                                         else 1.0)

    row, control_blocks = paired_run(200, 100, random.Random(4), scale)
    assert row["after_window_ratio"] > 1.1  # the drift
    paired = paired_summary(row, control_blocks)
    assert 1.005 < paired["after_window_paired"] < 1.015
    assert 1.005 < paired["after_window_paired_mean"] < 1.015
    assert paired["after_window_paired_n"] == 100
    assert 1.02 < paired["paired_null_ratio"] < 1.04  # the processes' fixed difference
    again = from_recorded({**row, "control_blocks": control_blocks})
    assert again["after_window_paired"] == paired["after_window_paired"]


def test_matched_pairs_leave_out_the_blocks_where_the_shared_vcpu_switched() -> None:
    # Both processes on one vCPU that switches between its fast and slow state every few
    # blocks; the treated one costs 1 % after its window. A pair that straddles a switch
    # compares a fast block with slow neighbours: the matched ratio leaves those out.
    rng = random.Random(6)
    states = [FAST]
    for _ in range(400):
        states.append((SLOW if states[-1] is FAST else FAST) if rng.random() < 0.15
                      else states[-1])
    row, control_blocks = paired_run(
        400, 200, rng, lambda i, treated: 1.01 if treated and i >= 200 else 1.0,
        lambda i: states[i])
    paired = paired_summary(row, control_blocks)
    assert paired["after_window_paired_matched_n"] < paired["after_window_paired_n"]
    lo, hi = paired["after_window_paired_matched_ci90"]
    assert lo < 1.01 < hi and hi - lo < 0.01
    assert 1.005 < paired["after_window_paired_matched"] < 1.015


def test_the_paired_mean_sees_a_stall_in_one_block_that_the_median_hides() -> None:
    row, control_blocks = paired_run(
        120, 100, random.Random(7),
        lambda i, treated: 1.5 if treated and i >= 100 and i % 10 == 0 else 1.0)  # 1 in 10
    paired = paired_summary(row, control_blocks)
    assert paired["after_window_paired"] < 1.01
    assert 1.04 < paired["after_window_paired_mean"] < 1.06


CHILD = """
import sys, time
sys.path.insert(0, {bench!r})
from overhead_stats import Plan, Turns
plan = Plan(1, 0, 0, 0, turns=Turns.from_env(), control={control})
n = 0
while n < {blocks} and plan.start_block():
    time.sleep(0.02)
    plan.end_block(20.0)
    n += 1
print(repr([(t0, t1) for t0, t1, _ in plan.timeline]))
"""


def test_the_coordinator_alternates_two_real_processes_until_the_treated_one_exits() -> None:
    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
    coord = TurnCoordinator()
    procs = {}
    for name, control, blocks in (("a", False, 6), ("b", True, 10**6)):
        env, fds = coord.child_env(name)
        code = CHILD.format(bench=bench, control=control, blocks=blocks)
        procs[name] = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env},
                                       pass_fds=fds, stdout=subprocess.PIPE, text=True)
    coord.started()
    assert coord.run(timeout=60) == 6
    out = {name: p.communicate(timeout=30)[0] for name, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values())
    a, b = (ast.literal_eval(out[k].strip()) for k in ("a", "b"))
    assert len(a) == 6 and len(b) == 6  # the control stops once the treated process is done
    merged = sorted([(t0, t1, "a") for t0, t1 in a] + [(t0, t1, "b") for t0, t1 in b])
    assert [w for _, _, w in merged] == ["a", "b"] * 6  # strictly in turn
    assert all(x[1] <= y[0] for x, y in itertools.pairwise(merged))  # never overlapping


class CountingWork:
    """A stand-in for work_counter.WorkCounter's hardware counts (CI machines have none): it
    counts what the test says the thread did, 1000 instructions per unit of work."""

    def __init__(self) -> None:
        self.done = 0
        self.cycles = 0

    def read(self) -> list[int]:
        return [self.done * 1000, self.cycles, 0, 0, 0, 0, 0]


def test_the_work_ratios_see_a_cost_that_time_hides_in_drift() -> None:
    counter = CountingWork()
    plan = Plan(5, 10, 25, 1, work_counter=counter)
    rng = random.Random(5)
    times = []
    for hooked in plan.always_on_order():
        plan.start_block()
        plan.clock_started()
        counter.done += 100 * (1.004 if hooked else 1.0)  # a 0.4 % cost of the hook
        counter.cycles += 50
        times.append((hooked, plan.end_block(rng.uniform(20, 40))))  # time: drift only
    plan.record_always_on(times)
    plan.begin_window()
    while True:
        plan.start_block()
        plan.clock_started()
        counter.done += 103  # 3 % more work after the window
        counter.cycles += 50
        if not plan.record_post(plan.end_block(rng.uniform(20, 40)), False):
            break
    work = plan.result({})["work"]
    assert work["always_on_instructions_ratio"] == 1.004
    assert work["after_window_instructions_ratio"] == 1.03
    assert work["after_window_instructions_n"] == 5
    assert work["always_on_cycles_ratio"] == 1.0
    # a recorded row gives the same figures again
    again = from_recorded({**plan.result({}), "hook": "torch", "workload": "gpt2"})
    assert again["work"] == work
    # work done outside the timed part (hook start-up, the probes) is not counted
    plan2 = Plan(5, 1, 5, 1, work_counter=counter)
    plan2.start_block()
    counter.done += 500
    plan2.clock_started()
    counter.done += 100
    plan2.end_block(30.0)
    assert list(plan2.work_of.values()) == [[100000, 0, 0, 0, 0, 0, 0, 150_000_000]]


def test_the_work_counter_counts_the_other_threads_cpu_and_its_own() -> None:
    import hashlib
    import threading
    import time

    from work_counter import WorkCounter

    counter = WorkCounter.open()
    go, done, stop = threading.Event(), threading.Event(), threading.Event()
    own: list[int] = []

    def worker() -> None:  # a hook thread: idle, a burst of work (GIL released), idle
        go.wait()
        t0 = time.thread_time_ns()
        data = b"x" * (8 << 20)
        for _ in range(20):
            hashlib.sha256(data).digest()
        own.append(time.thread_time_ns() - t0)
        done.set()
        stop.wait()

    thread = threading.Thread(target=worker)
    thread.start()
    before = counter.read()
    go.set()
    done.wait()
    after = counter.read()
    stop.set()
    thread.join()
    delta = [b - a for a, b in zip(before, after, strict=True)]
    assert own[0] > 0.02e9
    assert 0.9 * own[0] < delta[3] < 1.1 * own[0] + 5e6  # the burst, as the thread saw it
    assert delta[2] < 0.5 * own[0]  # this thread mostly waited
    if counter.hardware:  # where the kernel has hardware counters
        assert delta[0] > 0 and delta[1] > 0
    else:
        assert delta[0] == delta[1] == 0
