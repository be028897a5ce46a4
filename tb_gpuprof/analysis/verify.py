"""Verified savings: a fix's saving measured inside the user's own running training loop.

The what-if replay (:mod:`savings`) *predicts* a fix's saving; this module *measures* it. The
training hook only sees step boundaries, so a trial is a state machine advanced once per step:
the hook asks :meth:`Trial.next_state` whether the fix should be on for the next iteration,
applies it, and after that iteration hands its wall time to :meth:`Trial.record`. Nothing here
knows about frameworks or clocks; the tests drive it with synthetic times.

Design, and the defaults (module constants below):

* **Block size.** Before the trials, a run of un-switched iterations gives the loop's own
  block-to-block noise (``DEFAULT_NOISE_ITERATIONS`` = 200 of them): :func:`noise_curve`
  cuts consecutive iteration times into blocks of k and takes the coefficient of variation
  (CV) of the block means, from the differences of adjacent blocks: that is the noise the
  trial's pairs see, and a level that wanders slowly against the block length hardly enters
  it (the plain CV would count it whole).
  :func:`block_size` picks k so that the CV is at most ``BLOCK_NOISE_SHARE`` (0.5) of the
  smallest effect worth resolving, ``DEFAULT_MIN_EFFECT_PCT`` (2 %), i.e. block means within
  1 %: each point of the curve, extrapolated with the 1/sqrt(k) of independent iterations,
  asks for a k; the median of those is robust to the long-block points' spread (few blocks
  each). Clamped to ``MIN_BLOCK_ITERS`` (3) .. ``MAX_BLOCK_ITERS`` (100).
* **Order.** Blocks without the fix (A) and with it (B) follow ABBA BAAB ABBA ... . Adjacent
  blocks pair up (AB, BA, BA, AB, ...); within ABBA a linear drift adds +d to one pair's log
  ratio and -d to the other's, so the mean over a whole ABBA group is drift-free. Only whole
  groups (an even number of pairs) enter the statistics.
* **Warm-up.** The first ``warmup`` iterations of a block that follows a switch are run but
  not counted (``DEFAULT_WARMUP`` = 2): the first iteration after a switch still drains GPU
  work queued in the other state (the host runs ahead of the GPU), the next re-warms caches,
  the allocator and autotuners. Blocks not preceded by a switch (the second B of ABBA) need
  none. The first block is warmed up too: a previous trial may just have restored its fix.
  Fixes with a long first call (torch.compile) pass a larger ``warmup``.
* **Statistics.** Each pair gives ``log(mean_B / mean_A)``; a Student t interval on their mean
  (:func:`t_quantile`, the t distribution's own CDF inverted, no scipy) at ``confidence``
  (``DEFAULT_CONFIDENCE`` = 0.99: several fixes are verified per run, and a saving claimed
  for a fix that changes nothing is worse than a small real one missed) becomes
  ``ratio = exp(mean)`` and ``saving_pct = 100 (1 - ratio)``.
* **Stop rule.** Early, once at least ``MIN_PAIRS`` (8 pairs, two ABBA BAAB periods) give an
  interval whose half-width is at most ``target_pct`` (``DEFAULT_TARGET_PCT`` = 1 point: half
  the smallest effect, so a 2 % saving reads as non-zero) or ``target_share`` of the saving
  itself (``DEFAULT_TARGET_SHARE`` = 5 %: a 50 % saving is known well enough at ±2.5 points);
  else at ``DEFAULT_MAX_ITERATIONS``
  (1000) or ``DEFAULT_MAX_SECONDS`` (120 s of recorded iteration time). The trial's
  iterations still train the model, so the caps bound the time spent in the slower state and
  with altered numerics, not wasted work. Why 8 pairs: stopping when the interval is narrow
  selects runs whose sample spread is small by chance, so the interval under-covers; with 4
  pairs an A/A trial (blocks of 13, iteration CV 3 %, 400 seeds) claimed a saving in 10.5 %
  of runs at 95 % confidence, with 8 in 5.5 % (a fixed-length trial: 4.9 %).
* **Verdict.** "saves X% [lo%, hi%]" when the interval excludes no saving ("slower by ..."
  when it lies below it), else "no measurable change (within ±Y%)", Y the interval's larger
  end in magnitude. Statuses: ``measured``, ``no_change``, ``failed`` (switching the fix
  raised), ``not_verifiable`` (with a reason), ``stopped`` (a cap hit before one whole ABBA
  group, too few pairs for an interval).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from .schema import VerifiedSaving

DEFAULT_MIN_EFFECT_PCT = 2.0  # the smallest saving worth resolving
BLOCK_NOISE_SHARE = 0.5  # block-mean CV allowed, as a share of that effect
MIN_BLOCK_ITERS = 3  # shorter blocks are dominated by the switch and its warm-up
MAX_BLOCK_ITERS = 100  # beyond this a trial cannot finish a few groups within the caps
MIN_NOISE_BLOCKS = 8  # blocks needed for one point of the noise curve
MIN_SIZING_BLOCK = 4  # noise-curve points from this block size up size the blocks
# Un-switched iterations the hook should time before the trials: the curve then reaches
# blocks of 25, and an iteration CV up to ~5 % is sized from measured points, not extrapolated.
DEFAULT_NOISE_ITERATIONS = 200
# A slow loop ends its noise run earlier: at this share of the verification's time cap, once
# it has MIN_NOISE_ITERATIONS (the after-run repeats it, so the two take twice that share;
# the H100 SD-UNet at 446 ms/iteration spent a 90 s cap on its 200 noise iterations alone).
NOISE_TIME_SHARE = 0.15
MIN_NOISE_ITERATIONS = MIN_NOISE_BLOCKS * MIN_SIZING_BLOCK  # the first point that sizes
# An interval that spans zero and reaches further than this either way rules nothing out: a
# fix could save a quarter of the iteration, or cost it. It is reported as ``stopped``
# ("inconclusive"), not as "no measurable change" (the H100 SD-UNet at 447 ms/iteration: 2
# block pairs in a 13 s share, ±1336 %).
INCONCLUSIVE_PCT = 25.0
DEFAULT_WARMUP = 2  # iterations discarded after each switch
DEFAULT_MAX_ITERATIONS = 1000
DEFAULT_MAX_SECONDS = 120.0
DEFAULT_TARGET_PCT = 1.0  # interval half-width, in points of saving, that stops early
DEFAULT_TARGET_SHARE = 0.05  # ... or this share of the saving itself, if that is wider
DEFAULT_CONFIDENCE = 0.99
MIN_PAIRS = 8  # pairs before an early stop (two ABBA BAAB periods; see the docstring)
MIN_PAIRS_FOR_INTERVAL = 2  # one whole ABBA group
# One period of the block order: False = A (fix off), True = B (fix on).
PATTERN: tuple[bool, ...] = (False, True, True, False, True, False, False, True)

Status = Literal["measured", "no_change", "failed", "not_verifiable", "stopped"]


def not_verifiable(reason: str) -> VerifiedSaving:
    """A fix the hook cannot switch in a running loop (e.g. a changed input pipeline)."""
    return VerifiedSaving(status="not_verifiable", reason=reason,
                          verdict=f"not verifiable: {reason}")


# --- block sizing -------------------------------------------------------------------------

def affordable_block(block: int, seconds: float, iteration_ms: float, warmup: int,
                     pairs: int = MIN_PAIRS) -> int:
    """``block``, shortened so that ``pairs`` pairs of blocks (and the warm-up after each of
    their switches) fit in ``seconds`` of iterations of ``iteration_ms``; never below
    MIN_BLOCK_ITERS. A trial whose blocks cannot all run ends with too few pairs for any
    verdict (the H100 MoE: blocks of 100, 3 blocks in its 20 s); shorter blocks give a wider
    interval, but one."""
    blocks = 2 * pairs
    switches = sum(1 for i in range(blocks) if i == 0 or PATTERN[i % len(PATTERN)]
                   != PATTERN[(i - 1) % len(PATTERN)])
    iterations = seconds * 1000.0 / iteration_ms if iteration_ms > 0 else float("inf")
    fits = (iterations - switches * warmup) / blocks
    return max(MIN_BLOCK_ITERS, min(block, math.floor(fits) if math.isfinite(fits) else block))


def block_noise(times_ms: Sequence[float], k: int) -> float | None:
    """CV of the means of consecutive blocks of ``k`` iterations; None below MIN_NOISE_BLOCKS.

    From adjacent differences (sd = rms(diff) / sqrt 2), as the trial's pairs see it: a level
    that wanders slowly cancels in a pair, so it must not make blocks longer."""
    t = np.asarray(times_ms, dtype=float)
    n = len(t) // k if k >= 1 else 0
    if n < MIN_NOISE_BLOCKS:
        return None
    means = t[: n * k].reshape(n, k).mean(axis=1)
    sd = math.sqrt(float(np.mean(np.diff(means) ** 2)) / 2.0)
    return sd / float(means.mean())


def noise_curve(times_ms: Sequence[float]) -> dict[int, float]:
    """Block-mean CV for every block size k with at least MIN_NOISE_BLOCKS blocks."""
    curve = {}
    for k in range(1, len(times_ms) // MIN_NOISE_BLOCKS + 1):
        cv = block_noise(times_ms, k)
        if cv is not None:
            curve[k] = cv
    return curve


def block_size(times_ms: Sequence[float], min_effect_pct: float = DEFAULT_MIN_EFFECT_PCT,
               share: float = BLOCK_NOISE_SHARE) -> int:
    """Iterations per block so that a block mean's noise is at most ``share`` of the smallest
    effect. Each point (k, cv) of the curve, extrapolated with 1/sqrt(k), asks for
    k (cv / target)^2; the median over the curve, because its long-block points rest on few
    blocks each and a first-k-below-target rule would take their chance dips."""
    curve = noise_curve(times_ms)
    if not curve:
        raise ValueError(f"need at least {MIN_NOISE_BLOCKS} un-switched iterations")
    target = share * min_effect_pct / 100.0
    # Blocks shorter than the host's run-ahead are not independent: a GPU-bound loop's
    # iteration times come in bursts (the host queues a few iterations, then blocks), which
    # longer blocks average out (the H200 ResNet-50 asked for blocks of 100 from its
    # single-iteration points); the points from MIN_SIZING_BLOCK up decide where they exist.
    points = {k: cv for k, cv in curve.items() if k >= MIN_SIZING_BLOCK} or curve
    k = statistics.median(k * (cv / target) ** 2 for k, cv in points.items())
    return min(max(math.ceil(k), MIN_BLOCK_ITERS), MAX_BLOCK_ITERS)


# --- Student t, without scipy -------------------------------------------------------------

def _lentz_step(aa: float, c: float, d: float) -> tuple[float, float, float]:
    """One term of Lentz's continued-fraction evaluation: new (c, d, factor)."""
    d = 1.0 + aa * d
    c = 1.0 + aa / c
    d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
    c = c if abs(c) > 1e-300 else 1e-300
    return c, d, c * d


def _beta_cf(a: float, b: float, x: float) -> float:
    """The incomplete beta function's continued fraction (Numerical Recipes, 6.4)."""
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
    c, h = 1.0, d
    for m in range(1, 500):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        c, d, f = _lentz_step(even, c, d)
        h *= f
        c, d, f = _lentz_step(odd, c, d)
        h *= f
        if abs(f - 1.0) < 1e-15:
            break
    return h


def _beta_inc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):  # where the fraction converges fast
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    return 0.5 * _beta_inc(df / 2.0, 0.5, df / (df + t * t))


@lru_cache(maxsize=256)  # the trials ask for the same few (p, df) over and over
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t (bisection on :func:`t_tail`, to ~1e-9)."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile({p}, {df})")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    tail, lo, hi = 1.0 - p, 0.0, 1.0
    while t_tail(hi, df) > tail:
        lo, hi = hi, hi * 2.0
    for _ in range(80):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_tail(mid, df) > tail else (lo, mid)
    return (lo + hi) / 2.0


def log_interval(log_ratios: Sequence[float], confidence: float) -> tuple[float, float]:
    """Mean of the pairs' log ratios and the t interval's half-width around it."""
    n = len(log_ratios)
    mean = statistics.fmean(log_ratios)
    se = statistics.stdev(log_ratios) / math.sqrt(n)
    return mean, t_quantile(0.5 + confidence / 2.0, n - 1) * se


def saving_interval(mean: float, half: float) -> tuple[float, float, float]:
    """(saving_pct, lo, hi) from a log ratio's mean and half-width (lo from the slow end)."""
    return (100.0 * (1.0 - math.exp(mean)), 100.0 * (1.0 - math.exp(mean + half)),
            100.0 * (1.0 - math.exp(mean - half)))


def verdict(saving: float, lo: float, hi: float) -> tuple[Status, str]:
    if lo > 0.0:
        return "measured", f"saves {saving:.1f}% [{lo:.1f}%, {hi:.1f}%]"
    if hi < 0.0:
        return "measured", f"slower by {-saving:.1f}% [{-hi:.1f}%, {-lo:.1f}%]"
    if max(-lo, hi) > INCONCLUSIVE_PCT:
        return "stopped", (f"inconclusive: within ±{max(-lo, hi):.0f}%, too wide to tell "
                           "(a longer verify_max_s gives it more block pairs)")
    return "no_change", f"no measurable change (within ±{max(-lo, hi):.1f}%)"


# --- the trial ----------------------------------------------------------------------------

@dataclass(eq=False)
class Trial:
    """One fix's interleaved A/B measurement, advanced once per training step.

    Per step: ``on = trial.next_state()`` (apply it), run the iteration, then
    ``trial.record(ms)``; stop switching once ``trial.done`` (``next_state`` is then False:
    the fix off, as the loop was) and read ``trial.result()``."""
    block: int  # counted iterations per block (see block_size)
    warmup: int = DEFAULT_WARMUP
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_seconds: float = DEFAULT_MAX_SECONDS
    target_pct: float = DEFAULT_TARGET_PCT
    target_share: float = DEFAULT_TARGET_SHARE
    confidence: float = DEFAULT_CONFIDENCE
    min_pairs: int = MIN_PAIRS
    iterations: int = field(default=0, init=False)
    seconds: float = field(default=0.0, init=False)
    _index: int = field(default=0, init=False, repr=False)  # current block
    _warm_left: int = field(default=0, init=False, repr=False)
    _sum_ms: float = field(default=0.0, init=False, repr=False)
    _count: int = field(default=0, init=False, repr=False)
    _means: list[float] = field(default_factory=list, init=False, repr=False)
    _log_ratios: list[float] = field(default_factory=list, init=False, repr=False)
    _done: bool = field(default=False, init=False, repr=False)
    _error: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.block < 1 or self.warmup < 0 or self.min_pairs < MIN_PAIRS_FOR_INTERVAL:
            raise ValueError(f"bad trial: {self!r}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence {self.confidence} not in (0, 1)")
        self._warm_left = self.warmup

    @staticmethod
    def arm(index: int) -> bool:
        """Whether block ``index`` runs with the fix (ABBA BAAB ...)."""
        return PATTERN[index % len(PATTERN)]

    @property
    def done(self) -> bool:
        return self._done

    @property
    def pairs(self) -> int:
        return len(self._log_ratios)

    @property
    def closes_block(self) -> bool:
        """Whether the next recorded iteration ends a block: the caller waits for the GPU
        before timing it, so the work the host queued in this block is counted in it."""
        return not self._done and self._warm_left == 0 and self._count == self.block - 1

    def next_state(self) -> bool:
        """Whether the fix should be on for the next iteration (off once done)."""
        return False if self._done else self.arm(self._index)

    def record(self, iteration_ms: float, one_off: bool = False) -> None:
        """The wall time of the iteration just run in ``next_state()``; ignored once done.

        ``one_off``: the iteration paid the fix's one-off cost (a compile, reported on its
        own); it does not count against ``max_seconds``, or a compile that takes most of the
        trial's share leaves no time to measure the code it made (the H100 LoRA: a 24 s
        compile in a 22 s share, 7 iterations, no verdict)."""
        if self._done:
            return
        if not (math.isfinite(iteration_ms) and iteration_ms > 0.0):
            raise ValueError(f"iteration time {iteration_ms!r} ms")
        self.iterations += 1
        self.seconds += 0.0 if one_off else iteration_ms / 1000.0
        if self._warm_left > 0:
            self._warm_left -= 1
        else:
            self._sum_ms += iteration_ms
            self._count += 1
            if self._count == self.block:
                self._close_block()
        if self.iterations >= self.max_iterations or self.seconds >= self.max_seconds:
            self._done = True

    def fail(self, reason: str) -> None:
        """Switching the fix raised: the trial ends, its result says why."""
        self._error, self._done = reason, True

    def _close_block(self) -> None:
        self._means.append(self._sum_ms / self._count)
        self._sum_ms, self._count = 0.0, 0
        self._index += 1
        switched = self.arm(self._index) != self.arm(self._index - 1)
        self._warm_left = self.warmup if switched else 0
        if self._index % 2 == 0:
            self._close_pair()

    def _close_pair(self) -> None:
        first, second = self._means[-2:]
        with_fix, without = (first, second) if self.arm(self._index - 2) else (second, first)
        self._log_ratios.append(math.log(with_fix / without))
        n = self.pairs
        if n >= self.min_pairs and n % 2 == 0 and self._narrow_enough():
            self._done = True

    def _narrow_enough(self) -> bool:
        saving, lo, hi = saving_interval(*log_interval(self._log_ratios, self.confidence))
        return (hi - lo) / 2.0 <= max(self.target_pct, self.target_share * abs(saving))

    def result(self) -> VerifiedSaving:
        """The measurement so far (final once ``done``)."""
        if self._error is not None:
            return self._unmeasured("failed", self._error,
                                    f"not verified: the trial failed ({self._error})")
        used = self._log_ratios[: self.pairs - self.pairs % 2]  # whole ABBA groups only
        if len(used) < MIN_PAIRS_FOR_INTERVAL:
            reason = (f"stopped after {self.iterations} iterations ({self.seconds:.1f} s) "
                      f"with {self.pairs} block pair(s): too few for an interval")
            return self._unmeasured("stopped", reason, f"not verified: {reason}")
        mean, half = log_interval(used, self.confidence)
        saving, lo, hi = saving_interval(mean, half)
        status, text = verdict(saving, lo, hi)
        return VerifiedSaving(status=status, verdict=text, saving_pct=saving,
                              interval_pct=[lo, hi], ratio=math.exp(mean),
                              blocks=len(self._means), iterations=self.iterations,
                              seconds=self.seconds, pairs_ms=self.pairs_ms())

    def pairs_ms(self) -> list[list[float]]:
        """Each completed pair's block means, [with the fix, without it], in order."""
        out = []
        for k in range(0, len(self._means) - 1, 2):
            a, b = self._means[k], self._means[k + 1]
            out.append([round(a, 4), round(b, 4)] if self.arm(k) else [round(b, 4), round(a, 4)])
        return out

    def _unmeasured(self, status: Status, reason: str, text: str) -> VerifiedSaving:
        return VerifiedSaving(status=status, reason=reason, verdict=text,
                              blocks=len(self._means), iterations=self.iterations,
                              seconds=self.seconds, pairs_ms=self.pairs_ms() or None)


# --- on the report -----------------------------------------------------------------------

def gives_nothing(verified: dict[str, Any] | None) -> bool:
    """A fix its trial measured to save nothing: no measurable change, or slower."""
    if not verified:
        return False
    if verified.get("status") == "no_change":
        return True
    saving = verified.get("saving_pct")
    return verified.get("status") == "measured" and saving is not None and saving <= 0.0


def attach_verification(report: dict[str, Any], verification: dict[str, Any]) -> None:
    """Lay the hook's trials (the report's ``verification`` section, schema.Verification) on
    the report, in place: each tried recommendation gets its ``verified`` trial, and a fix
    measured to give nothing moves below the ones that help (their order otherwise kept)."""
    trials = verification.get("trials") or {}
    recs = report.get("recommendations") or []
    for rec in recs:
        if rec.get("id") in trials:
            rec["verified"] = trials[rec["id"]]
    report["recommendations"] = ([r for r in recs if not gives_nothing(r.get("verified"))]
                                 + [r for r in recs if gives_nothing(r.get("verified"))])
    report["verification"] = verification
