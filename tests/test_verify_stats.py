"""Verified savings' statistics and trial state machine, on iteration times whose answer is
known by construction (seeded RNG, no wall clock), plus one short real sleeping loop."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import msgspec
import numpy as np
import pytest

from tb_gpuprof.analysis.verify import (
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_NOISE_ITERATIONS,
    MAX_BLOCK_ITERS,
    MIN_BLOCK_ITERS,
    MIN_PAIRS,
    PATTERN,
    Trial,
    VerifiedSaving,
    block_noise,
    block_size,
    noise_curve,
    not_verifiable,
    t_quantile,
)

BASE_MS, NOISE_MS, FIX_MS = 10.0, 0.3, 2.0  # the fix removes 2 ms of 10: a 20 % saving
NOISE_RUN = DEFAULT_NOISE_ITERATIONS  # un-switched iterations measured before a trial

Loop = Callable[[int, bool], float]  # (iteration, fix on) -> iteration time, ms


def drive(trial: Trial, loop: Loop, limit: int = 100_000) -> VerifiedSaving:
    """The hook's part: ask the state, run the iteration, record its time."""
    for i in range(limit):
        if trial.done:
            return trial.result()
        trial.record(loop(i, trial.next_state()))
    raise AssertionError("the trial never finished")


def noisy(seed: int, saving_ms: float = 0.0, drift_ms: float = 0.0) -> Loop:
    rng = np.random.default_rng(seed)
    return lambda i, on: BASE_MS + drift_ms * i - saving_ms * on + rng.normal(0.0, NOISE_MS)


def sized_trial(seed: int, **kw: float) -> Trial:
    """A trial whose block size comes from the loop's own un-switched noise."""
    times = BASE_MS + np.random.default_rng(10_000 + seed).normal(0.0, NOISE_MS, NOISE_RUN)
    return Trial(block=block_size(times), **kw)  # type: ignore[arg-type]


def slow_after_switch(loop: Loop, factor: float = 10.0) -> Loop:
    """The first iteration after each switch (the loop ran with the fix off) is slower."""
    prev = [False]

    def timed(i: int, on: bool) -> float:
        switched, prev[0] = on != prev[0], on
        return loop(i, on) * (factor if switched else 1.0)
    return timed


def half_width(r: VerifiedSaving) -> float:
    assert r.interval_pct is not None
    return (r.interval_pct[1] - r.interval_pct[0]) / 2.0


# --- Student t ----------------------------------------------------------------------------

@pytest.mark.parametrize("p,df,table", [
    (0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 3, 3.182), (0.975, 5, 2.571),
    (0.975, 10, 2.228), (0.975, 30, 2.042), (0.975, 100, 1.984), (0.95, 1, 6.314),
    (0.995, 1, 63.657), (0.995, 5, 4.032), (0.995, 30, 2.750), (0.9995, 2, 31.599),
])
def test_t_quantile_matches_the_table(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=1e-3)
    assert t_quantile(1.0 - p, df) == pytest.approx(-table, abs=1e-3)


@pytest.mark.parametrize("p", [0.6, 0.8, 0.9, 0.975, 0.999])
def test_t_quantile_matches_closed_forms(p):
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-7)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-7)
    assert t_quantile(p, 10_000) == pytest.approx(
        float(np.sqrt(2.0) * _erfinv(2 * p - 1)), abs=1e-3)  # the normal limit


def _erfinv(y: float) -> float:
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return lo


# --- block sizing -------------------------------------------------------------------------

def test_block_size_grows_with_noise():
    rng = np.random.default_rng(1)
    sizes = [block_size(BASE_MS + rng.normal(0.0, sd, NOISE_RUN)) for sd in (0.02, 0.3, 0.6, 3)]
    assert sizes[0] == MIN_BLOCK_ITERS  # a quiet loop: the floor
    assert sizes[0] < sizes[1] < sizes[2] < sizes[3] == MAX_BLOCK_ITERS  # CV 30 %: the cap
    # iteration CV 3 %, block means within 1 %: about (3 / 1)^2 = 9 iterations; CV 6 %: 36
    assert 5 <= sizes[1] <= 15 and 20 <= sizes[2] <= 55


def test_noise_curve_falls_with_block_length():
    curve = noise_curve(BASE_MS + np.random.default_rng(2).normal(0.0, NOISE_MS, 800))
    assert curve[1] == pytest.approx(NOISE_MS / BASE_MS, rel=0.15)
    assert curve[16] == pytest.approx(curve[1] / 4.0, rel=0.5)  # 1/sqrt(k)
    assert max(curve) == 800 // 8


def test_a_slowly_wandering_level_does_not_lengthen_blocks():
    rng = np.random.default_rng(1)
    noise = BASE_MS + rng.normal(0.0, NOISE_MS, NOISE_RUN)
    wander = noise + 1.0 * np.sin(2 * np.pi * np.arange(NOISE_RUN) / 1000)  # 1 ms level swing
    plain_cv = float(np.std(wander[:192].reshape(-1, 8).mean(axis=1)) / np.mean(wander))
    assert plain_cv > 0.02  # blocks of 8 by their plain CV: >= (2 / 1)^2 * 8 = 32 iterations
    assert block_size(noise) <= block_size(wander) <= 15  # what the pairs see: a little more


def test_block_size_needs_a_noise_run():
    with pytest.raises(ValueError):
        block_size([10.0] * 7)
    assert block_noise([10.0] * 100, 0) is None


# --- measuring ----------------------------------------------------------------------------

def test_a_known_saving_is_measured():
    r = drive(sized_trial(0), noisy(0, saving_ms=FIX_MS))
    assert r.status == "measured" and r.verdict.startswith("saves ")
    lo, hi = r.interval_pct
    assert lo <= 20.0 <= hi and hi - lo < 3.0
    assert r.saving_pct == pytest.approx(100 * (1 - r.ratio))
    assert r.iterations < DEFAULT_MAX_ITERATIONS  # it stopped once precise


def test_a_fix_that_slows_reads_slower():
    r = drive(sized_trial(1), noisy(1, saving_ms=-FIX_MS))
    assert r.status == "measured" and r.verdict.startswith("slower by ")
    assert r.interval_pct[0] <= -20.0 <= r.interval_pct[1]


@pytest.mark.parametrize("drift_ms", [0.0, 0.01])  # 0.01 ms per iteration: +10 % per 100
def test_a_fix_that_changes_nothing_reads_no_change(drift_ms):
    results = [drive(sized_trial(s), noisy(s, drift_ms=drift_ms)) for s in range(100)]
    no_change = [r for r in results if r.status == "no_change"]
    assert len(no_change) >= 95, [r.verdict for r in results if r.status != "no_change"]
    assert all(r.verdict.startswith("no measurable change (within ±") for r in no_change)
    assert all(r.interval_pct[0] <= 0.0 <= r.interval_pct[1] for r in no_change)


def test_a_drifting_real_saving_is_not_biased():
    r = drive(sized_trial(2), noisy(2, saving_ms=FIX_MS, drift_ms=0.01))
    assert r.status == "measured"
    # the saving is against the drifting base: between 2/10 and 2/(10 + drift over the run)
    assert r.interval_pct[0] <= 20.0 and r.interval_pct[1] >= 100 * 2 / (10 + 0.01 * r.iterations)


# --- the trial's order, warm-up and stop rule ---------------------------------------------

def states_of(trial: Trial, n: int) -> str:
    out = []
    for _ in range(n):
        out.append("B" if trial.next_state() else "A")
        trial.record(10.0)
    return "".join(out)


def test_blocks_run_abba_baab():
    assert "".join("B" if s else "A" for s in PATTERN) == "ABBABAAB"
    no_warmup = Trial(block=1, warmup=0, min_pairs=10**6)
    assert states_of(no_warmup, 16) == "ABBABAAB" * 2


def test_warmup_iterations_follow_each_switch_only():
    # blocks of 2 counted; one warm-up iteration before a block that follows a switch (and
    # before the first): A(1+2) B(1+2) B(2) A(1+2) B(1+2) A(1+2) A(2) B(1+2)
    trial = Trial(block=2, warmup=1, min_pairs=10**6)
    assert states_of(trial, 22) == "AAA" "BBB" "BB" "AAA" "BBB" "AAA" "AA" "BBB"
    assert trial.result().blocks == 8 and trial.iterations == 22


def test_slow_first_iterations_after_a_switch_are_discarded():
    rng = np.random.default_rng(3)

    def loop(i: int, on: bool) -> float:
        return BASE_MS - FIX_MS * on + rng.normal(0.0, 0.01)
    warmed = drive(Trial(block=4, warmup=1), slow_after_switch(loop))
    assert warmed.status == "measured" and warmed.saving_pct == pytest.approx(20.0, abs=0.2)
    assert warmed.interval_pct[0] <= 20.0 <= warmed.interval_pct[1]
    # the control: counting them wrecks the same measurement
    cold = drive(Trial(block=4, warmup=0), slow_after_switch(loop))
    assert half_width(cold) > 20 * half_width(warmed)


def test_the_iteration_cap_stops_an_imprecise_trial():
    rng = np.random.default_rng(4)
    trial = Trial(block=3, max_iterations=150)
    r = drive(trial, lambda i, on: BASE_MS + rng.normal(0.0, 3.0))
    assert r.iterations == 150
    assert r.status == "stopped" and r.verdict.startswith("inconclusive"), r  # ±33 %
    assert trial.next_state() is False  # done: the fix stays off


def test_the_seconds_cap_stops_an_imprecise_trial():
    rng = np.random.default_rng(5)
    times: list[float] = []

    def loop(i: int, on: bool) -> float:
        times.append(BASE_MS + abs(rng.normal(0.0, 3.0)))
        return times[-1]
    r = drive(Trial(block=3, max_seconds=0.5), loop)
    assert r.seconds == pytest.approx(sum(times) / 1000)
    assert r.seconds >= 0.5 > r.seconds - times[-1] / 1000  # stopped at the iteration crossing


def test_a_cap_before_any_pair_is_stopped():
    r = drive(Trial(block=10, max_iterations=15), noisy(6))
    assert r.status == "stopped" and r.saving_pct is None and r.interval_pct is None
    assert r.reason and r.verdict.startswith("not verified: stopped after 15 iterations")


def test_a_precise_trial_stops_early():
    rng = np.random.default_rng(7)
    trial = Trial(block=3)
    r = drive(trial, lambda i, on: BASE_MS - FIX_MS * on + rng.normal(0.0, 0.001))
    assert trial.pairs == MIN_PAIRS and r.blocks == 2 * MIN_PAIRS
    assert r.iterations < 100 and half_width(r) < 1.0


def test_a_noisier_loop_runs_longer():
    def its(sd: float) -> int:
        rng = np.random.default_rng(8)
        return drive(Trial(block=5), lambda i, on: BASE_MS + rng.normal(0.0, sd)).iterations
    assert its(0.05) < its(0.3) < its(0.6)


def test_records_after_done_are_ignored_and_bad_times_refused():
    trial = Trial(block=1, max_iterations=2)
    trial.record(10.0)
    trial.record(10.0)
    trial.record(10.0)
    assert trial.done and trial.iterations == 2
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            Trial(block=1).record(bad)
    with pytest.raises(ValueError):
        Trial(block=0)


# --- results ------------------------------------------------------------------------------

def test_a_failed_trial_and_a_not_verifiable_fix():
    trial = Trial(block=2)
    trial.record(10.0)
    trial.fail("RuntimeError: cannot switch the autocast dtype")
    r = trial.result()
    assert trial.done and r.status == "failed" and "autocast" in (r.reason or "")
    assert r.iterations == 1 and r.saving_pct is None
    nv = not_verifiable("the input pipeline is built before the hook")
    assert nv.status == "not_verifiable" and nv.verdict.startswith("not verifiable: ")


def test_verified_saving_round_trips_with_its_field_names():
    r = drive(sized_trial(0), noisy(0, saving_ms=FIX_MS))
    raw = msgspec.json.decode(msgspec.json.encode(r))
    assert set(raw) == {"saving_pct", "interval_pct", "blocks", "iterations", "seconds",
                        "status", "reason", "verdict", "ratio", "warmup_seconds",
                        "measured_after", "block_iterations", "pairs_ms"}
    assert msgspec.convert(raw, VerifiedSaving) == r
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**raw, "status": "great"}, VerifiedSaving)


# --- a real loop --------------------------------------------------------------------------

def test_a_real_sleeping_loop():
    """2 ms of work, plus 2 ms more without the fix: the fix saves 50 %."""
    trial = Trial(block=3, warmup=1, max_seconds=1.0, target_pct=5.0)
    last = time.perf_counter()
    while not trial.done:  # the hook's step(): time since the previous step
        time.sleep(0.002 if trial.next_state() else 0.004)
        now = time.perf_counter()
        trial.record((now - last) * 1000.0)
        last = now
    r = trial.result()
    assert r.status == "measured" and r.seconds < 1.1
    assert 25.0 < r.saving_pct < 75.0
    assert r.interval_pct[0] < 75.0 and r.interval_pct[1] > 25.0


def test_blocks_shorten_to_what_the_trials_time_share_holds():
    from tb_gpuprof.analysis.verify import affordable_block

    # 20 s of 75 ms iterations: 266; 16 blocks and 11 switch warm-ups of 2 leave 15 a block
    assert affordable_block(100, 20.0, 75.0, 2) == 15
    assert affordable_block(6, 20.0, 75.0, 2) == 6  # already short enough: kept
    assert affordable_block(100, 0.5, 75.0, 2) == MIN_BLOCK_ITERS  # never below the floor
    # the blocks it gives do fit: 8 pairs of them and their warm-ups within the share
    t = Trial(affordable_block(100, 20.0, 75.0, 2), warmup=2, max_seconds=20.0,
              target_pct=0.0, target_share=0.0)
    while not t.done:
        t.next_state()
        t.record(75.0)
    assert t.pairs >= MIN_PAIRS


def test_an_interval_too_wide_to_rule_anything_out_is_inconclusive_not_no_change():
    from tb_gpuprof.analysis.verify import INCONCLUSIVE_PCT, verdict

    status, text = verdict(4.2, -1336.1, 93.6)  # 2 block pairs of a 447 ms loop
    assert status == "stopped" and text.startswith("inconclusive: within ±1336%")
    status, _ = verdict(0.3, -INCONCLUSIVE_PCT + 1, INCONCLUSIVE_PCT - 1)
    assert status == "no_change"
    assert verdict(70.0, 5.0, 96.0)[0] == "measured"  # wide, but it rules out no saving


def test_the_pairs_behind_the_interval_are_kept_with_the_fix_first():
    """Blocks of 1, no warm-up, ABBA BAAB: with the fix 8 ms, without it 10 ms, except one
    stalled block (the fifth, which runs with the fix) at 40 ms; each pair reads [with,
    without] whatever order it ran in."""
    times = iter([10.0, 8.0, 8.0, 10.0, 40.0, 10.0, 10.0, 8.0])
    trial = Trial(block=1, warmup=0, min_pairs=10**6)
    for _ in range(8):
        trial.next_state()
        trial.record(next(times))
    r = trial.result()
    assert r.pairs_ms == [[8.0, 10.0], [8.0, 10.0], [40.0, 10.0], [8.0, 10.0]]
    assert r.ratio == pytest.approx(math.exp(sum(math.log(w / o) for w, o in r.pairs_ms) / 4))
