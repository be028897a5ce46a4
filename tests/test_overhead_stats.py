"""benchmarks/overhead_stats.py: the host-state matching the hook-overhead figures rest on."""

from __future__ import annotations

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

from overhead_stats import (
    Plan,
    from_recorded,
    pair_ratios,
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
