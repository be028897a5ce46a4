"""``verify=``: the report's top fixes tried inside the running training loop, then undone.

After the window's report exists, the hook hands every iteration's wall time to a
:class:`LoopVerifier`, which tells it what to switch before the next iteration:

1. **noise**: ``noise_iterations`` un-switched iterations (fewer in a slow loop: at most
   about ``NOISE_TIME_SHARE`` of the cap) give the loop's own block-to-block
   noise, which sizes the blocks (analysis/verify.block_size), and the speed before the trials;
2. **trials**, one fix after another: blocks without and with the fix, ABBA BAAB ..., the
   first iterations after each switch discarded (analysis/verify.Trial); an A/A control
   ("aa": a switch that changes nothing) runs first, as a check on the statistics in this loop;
3. **after**: every switch restored, as many iterations as the noise run timed again; their
   median must lie within that run's noise (``after_within_noise``); a snapshot of every
   setting a switch may touch (capture/switches.snapshot) taken before and after the trials
   must be equal (``restored``).

The GPU is synchronised (once) before each switch, so the work queued in one state is timed in
that state's block. A switch that raises fails its trial (``failed``, with the reason) after
it is restored; training goes on. The whole verification is capped by ``max_seconds``.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..analysis import verify as stats
from ..analysis.schema import VerifiedSaving
from .verify_options import DEFAULT_MAX_SECONDS, verify_options

NULL_FIX = "aa"  # the A/A control's id in the report's ``verification.trials``
DEFAULT_TOP_FIXES = 3  # verify=True: this many of the report's top fixes
AFTER_TOLERANCE_FLOOR_PCT = 1.0  # "within the noise" is never asked tighter than this


class NullSwitch:
    """The A/A control: a fix that changes nothing."""
    fix_id = NULL_FIX
    warmup_hint_iterations = 0

    def unavailable(self) -> str | None:
        return None

    def apply(self) -> None:
        pass

    def restore(self) -> None:
        pass


@dataclass
class _Planned:
    fix_id: str
    switch: Any | None  # an InLoopSwitch (capture/switches.py) or None
    reason: str | None = None  # why there is no switch
    # the fix the prediction counts this one after (Retiming.after), on in both arms
    after_id: str | None = None
    after_switch: Any | None = None


@dataclass
class LoopVerifier:
    """The state machine :class:`~tb_gpuprof.torch.GpuProfiler` drives once per iteration."""
    plan: list[_Planned]
    sync: Callable[[], None]  # waits for the GPU (torch.cuda.synchronize)
    snapshot: Callable[[], Any]  # every setting a switch may touch
    requested: list[str]
    noise_iterations: int = stats.DEFAULT_NOISE_ITERATIONS
    max_seconds: float = DEFAULT_MAX_SECONDS
    max_trial_seconds: float = stats.DEFAULT_MAX_SECONDS
    warn: Callable[[str], None] = lambda msg: None
    phase: str = "noise"  # noise | trial | after | done
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    results: dict[str, VerifiedSaving] = field(default_factory=dict)
    block: int | None = None
    noise_pct: float | None = None
    noise_curve_pct: dict[str, float] | None = None
    _trial: stats.Trial | None = None
    _current: _Planned | None = None
    _on: bool = False
    _t0: float = field(default_factory=time.perf_counter)
    _iterations: int = 0
    _state_before: Any = None
    _capped: bool = False
    _switch_started: float | None = None
    _applied_once: bool = False
    _warmup_s: float | None = None

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def settle_if_nothing_to_try(self) -> bool:
        """When no fix but the A/A control can be switched in this process, give each its
        reason now and end at once (True): no iteration of the loop is spent on a noise run
        and a control that would measure nothing. Otherwise nothing changes (False)."""
        reasons: dict[str, str] = {}
        for planned in self.plan:
            if planned.fix_id == NULL_FIX:
                continue
            why = planned.reason if planned.switch is None else planned.switch.unavailable()
            if planned.switch is not None and not why:
                return False
            reasons[planned.fix_id] = why or ""
        self.results = {k: stats.not_verifiable(v) for k, v in reasons.items()}
        self.plan, self.phase = [], "done"
        return True

    def on_step(self, iteration_ms: float) -> None:
        """One iteration ended: record it, then set the fixes for the next one."""
        self._iterations += 1
        if self.phase == "noise":
            self._noise(iteration_ms)
        elif self.phase == "trial":
            self._in_trial(iteration_ms)
        elif self.phase == "after":
            self.after.append(iteration_ms)
            if len(self.after) >= len(self.before):
                self.phase = "done"
        if self.phase in ("noise", "trial") and \
                time.perf_counter() - self._t0 > self.max_seconds:
            self._cap()

    # -- phases ------------------------------------------------------------------------------

    def _noise(self, ms: float) -> None:
        self.before.append(ms)
        if len(self.before) < self.noise_iterations and not self._noise_time_spent():
            return
        self.block = stats.block_size(self.before)
        noise = stats.block_noise(self.before, self.block)
        self.noise_pct = round(100.0 * noise, 3) if noise is not None else None
        self.noise_curve_pct = {str(k): round(100.0 * cv, 3)
                                for k, cv in stats.noise_curve(self.before).items()}
        self._state_before = self.snapshot()
        self.phase = "trial"
        self._next_fix()

    def _noise_time_spent(self) -> bool:
        """Whether a slow loop's noise run has had its share of the time cap (and enough
        iterations for a block size from measured points)."""
        return (len(self.before) >= stats.MIN_NOISE_ITERATIONS and sum(self.before)
                >= 1000.0 * stats.NOISE_TIME_SHARE * self.max_seconds)

    def _next_fix(self) -> None:
        while self.plan:
            planned = self.plan.pop(0)
            if planned.switch is None:
                self.results[planned.fix_id] = stats.not_verifiable(planned.reason or "")
                continue
            why = planned.switch.unavailable()
            if why:
                self.results[planned.fix_id] = stats.not_verifiable(why)
                continue
            assert self.block is not None
            warmup = max(stats.DEFAULT_WARMUP,
                         int(getattr(planned.switch, "warmup_hint_iterations", 0) or 0))
            self._current = planned
            seconds = self._trial_seconds()
            block = stats.affordable_block(self.block, seconds,
                                           statistics.median(self.before), warmup)
            self._trial = stats.Trial(block, warmup=warmup, max_seconds=seconds)
            self._switch_started = None
            if self._apply_prerequisite(planned):
                self._set(self._trial.next_state())
            return
        self._finish_trials()

    def _trial_seconds(self) -> float:
        """This trial's share of the time left: the trials still to run split it evenly,
        after the after-run's expected time is set aside (an A/A control in a noisy loop
        would otherwise spend the whole cap and leave the fixes untried)."""
        elapsed = time.perf_counter() - self._t0
        left = self.max_seconds - elapsed - sum(self.before) / 1000.0
        trials = 1 + sum(1 for p in self.plan if p.switch is not None)
        return max(min(self.max_trial_seconds, left / trials), 1.0)

    def _apply_prerequisite(self, planned: _Planned) -> bool:
        """Put the fix's prerequisite on for the whole trial (both arms); False when that
        raised: the trial is then failed and closed."""
        if planned.after_switch is None:
            return True
        trial = self._trial
        assert trial is not None
        why = planned.after_switch.unavailable()
        if why:  # measured from the loop as it is: the result says no prerequisite
            planned.after_id, planned.after_switch = None, None
            return True
        try:
            self.sync()
            planned.after_switch.apply()
            return True
        except Exception as e:
            trial.fail(f"switching {planned.after_id} (counted before {planned.fix_id}) "
                       f"raised {type(e).__name__}: {e}")
            self._close_trial()
            return False

    def _in_trial(self, ms: float) -> None:
        trial, planned = self._trial, self._current
        assert trial is not None and planned is not None
        one_off = self._switch_started is not None and self._one_off_cost(planned)
        if self._switch_started is not None:  # the fix's first switch-on (compile): its cost
            self._warmup_s = time.perf_counter() - self._switch_started
            self._switch_started = None
        failure = getattr(planned.switch, "failure", None)
        if failure:  # the fix broke the loop's own code: this iteration ran without it
            trial.fail(failure)
            self.warn(f"tb_gpuprof: verifying {planned.fix_id} failed and was undone: "
                      f"{failure}")
            self._close_trial()
            return
        if trial.closes_block:  # the block's queued GPU work is counted in the block
            t = time.perf_counter()
            self.sync()
            ms += (time.perf_counter() - t) * 1e3
        trial.record(ms, one_off=one_off)
        if one_off:  # reported as warmup_seconds; the caps count the time spent measuring
            self._t0 += ms / 1000.0
        if trial.done:
            self._close_trial()
            return
        self._set(trial.next_state())

    @staticmethod
    def _one_off_cost(planned: _Planned) -> bool:
        """Whether the first iteration with this fix pays a one-off cost (compilation) that
        its trial and the verification's cap leave out."""
        return _compiles(planned.fix_id)

    def _set(self, on: bool) -> None:
        """Switch the current fix for the next iteration (a no-op when already so)."""
        planned, trial = self._current, self._trial
        assert planned is not None and planned.switch is not None and trial is not None
        if on == self._on:
            return
        try:
            self.sync()  # the work queued in the last state is timed in its own block
            if on:
                first = not self._applied_once
                planned.switch.apply()
                if first:
                    self._applied_once = True
                    self._switch_started = time.perf_counter()
            else:
                planned.switch.restore()
            self._on = on
        except Exception as e:  # the fix failed in this loop: undo it, say so, train on
            trial.fail(f"switching {planned.fix_id} raised {type(e).__name__}: {e}")
            self.warn(f"tb_gpuprof: verifying {planned.fix_id} failed and was undone: {e}")
            self._close_trial()

    def _close_trial(self) -> None:
        planned, trial = self._current, self._trial
        assert planned is not None and planned.switch is not None and trial is not None
        try:
            self.sync()
            planned.switch.restore()
            if planned.after_switch is not None:
                planned.after_switch.restore()
        except Exception as e:
            trial.fail(f"restoring {planned.fix_id} raised {type(e).__name__}: {e}")
        self._on = False
        result = trial.result()
        warm = self._warmup_s
        hint = int(getattr(planned.switch, "warmup_hint_iterations", 0) or 0)
        if warm is not None and hint > 0:
            result = _with(result, warmup_seconds=round(warm, 3))
        if result.status not in ("failed", "not_verifiable"):
            result = _with(result, block_iterations=trial.block)
        if planned.after_id is not None:
            result = _with(result, measured_after=planned.after_id)
        self.results[planned.fix_id] = result
        self._current, self._trial, self._applied_once, self._warmup_s = None, None, False, None
        self._next_fix()

    def _finish_trials(self) -> None:
        self.phase = "after" if self.before else "done"

    def stop(self) -> None:
        """Training ended (or a failure of ours) mid-verification: undo the fix in trial."""
        if not self.done:
            self._cap()
            self.phase = "done"

    def _cap(self) -> None:
        """The whole verification ran out of time: undo the fix in trial, skip the rest."""
        self._capped = True
        if self._current is not None and self._trial is not None:
            self._close_trial_quietly()  # what it measured so far (``stopped`` if too little)
        for planned in self.plan:
            if planned.switch is None:  # it could never have been tried: say why
                self.results[planned.fix_id] = stats.not_verifiable(planned.reason or "")
                continue
            self.results[planned.fix_id] = VerifiedSaving(
                status="stopped", verdict="not tried: the verification's time cap was reached",
                reason=f"capped at {self.max_seconds:.0f} s")
        self.plan = []
        if self.phase == "noise":
            self.phase = "done"
        else:
            self._finish_trials()

    def _close_trial_quietly(self) -> None:
        plan, self.plan = self.plan, []
        self._close_trial()
        self.plan = plan

    # -- the answer --------------------------------------------------------------------------

    def section(self) -> dict[str, Any]:
        """The report's ``verification`` section (schema.Verification)."""
        before = statistics.median(self.before) if self.before else None
        after = statistics.median(self.after) if self.after else None
        restored = self._state_before is None or self.snapshot() == self._state_before
        failed = any(r.status == "failed" for r in self.results.values())
        return {
            "requested": self.requested, "block_iterations": self.block,
            "noise_pct": self.noise_pct, "noise_curve_pct": self.noise_curve_pct,
            "iterations": self._iterations,
            "seconds": round(time.perf_counter() - self._t0, 3),
            "before_ms": round(before, 4) if before else None,
            "after_ms": round(after, 4) if after else None,
            "after_within_noise": _within_noise(self.before, self.after),
            "restored": restored,
            "status": "capped" if self._capped else ("failed" if failed else "done"),
            "note": None if restored else "a setting a switch touched differs from before the "
                                          "trials (capture/switches.snapshot)",
            "trials": {k: _builtins(v) for k, v in self.results.items()},
        }


def _with(result: VerifiedSaving, **changes: Any) -> VerifiedSaving:
    import msgspec

    return msgspec.structs.replace(result, **changes)


def _builtins(result: VerifiedSaving) -> dict[str, Any]:
    import msgspec

    return msgspec.to_builtins(result)


def _within_noise(before: list[float], after: list[float]) -> bool | None:
    """Whether the after-run's median is the before-run's, within 3 standard errors of the
    difference of two medians (iteration spread from the before-run), and at least
    :data:`AFTER_TOLERANCE_FLOOR_PCT`."""
    if len(before) < 3 or len(after) < 3:
        return None
    mb, ma = statistics.median(before), statistics.median(after)
    # the median's standard error is ~1.25 sigma / sqrt(n); sigma from the IQR (robust)
    q = statistics.quantiles(before, n=4)
    sigma = (q[2] - q[0]) / 1.349
    se = 1.25 * sigma * (1 / len(before) + 1 / len(after)) ** 0.5
    tolerance = max(3 * se, mb * AFTER_TOLERANCE_FLOOR_PCT / 100.0)
    return abs(ma - mb) <= tolerance


def rule_switch(fix_id: str) -> tuple[str | None, str | None]:
    """(the ``"module:Class"`` of the in-loop switch the fix's rule names, None) or (None, why
    there is none): analysis/rules owns it; an unknown id's reason names the known ones."""
    from ..analysis.rules import rule

    try:
        r = rule(fix_id)
    except KeyError as e:
        return None, str(e).strip("'\"")
    if r.switch is None:
        return None, r.not_verifiable
    return r.switch, None


def switch_for(fix_id: str, model: Any, optimizer: Any) -> tuple[Any | None, str | None]:
    """The PyTorch loop's switch for ``fix_id`` (built as ``Cls(model, optimizer)``), or why
    there is none."""
    path, reason = rule_switch(fix_id)
    if path is None:
        return None, reason
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)(model, optimizer), None


def counted_after(report: dict[str, Any], fix_id: str) -> str | None:
    """The fix the report's predicted saving of ``fix_id`` is counted after (its rule's
    Retiming.after, where that rule fired too), or None. A fix asked for that the report
    left out (re-timed after its prerequisite, it saved too little to be advised) is counted
    after that prerequisite too: the trial then tests what the report said of it."""
    from ..analysis.rules import retimed

    recs = {r["id"]: r for r in report.get("recommendations") or []}
    estimator = retimed(fix_id)
    if estimator is None:
        return None
    if fix_id not in recs:
        return estimator.after if estimator.after in recs else None
    return estimator.counted_after(recs[fix_id], set(recs))


def plan_fixes(report: dict[str, Any], verify: bool | list[str], verify_compile: bool,
               make_switch: Callable[[str], tuple[Any | None, str | None]],
               counted_after: Callable[[str], str | None] = lambda fix_id: None,
               ) -> list[_Planned]:
    """What to try, in order: the A/A control, then the fixes asked for (``verify=True``: the
    report's top :data:`DEFAULT_TOP_FIXES`; torch.compile only with ``verify_compile``).
    ``counted_after(fix_id)``: the fix the report's prediction counts this one after; the
    trial then runs with that one on in both arms, so that it measures what was predicted."""
    if verify is True:
        ids = [r["id"] for r in report.get("recommendations") or []][:DEFAULT_TOP_FIXES]
    else:
        ids = list(verify or [])
    plan = [_Planned(NULL_FIX, NullSwitch())]
    for fix_id in ids:
        if _compiles(fix_id) and not verify_compile:
            plan.append(_Planned(fix_id, None, "compiling costs its compile time: "
                                 "verify_compile=True tries it"))
            continue
        switch, reason = make_switch(fix_id)
        planned = _Planned(fix_id, switch, reason)
        first = counted_after(fix_id) if switch is not None else None
        if first is not None and (verify_compile or not _compiles(first)):
            planned.after_id, planned.after_switch = first, make_switch(first)[0]
            if planned.after_switch is None:
                planned.after_id = None
        plan.append(planned)
    return plan


def _compiles(fix_id: str) -> bool:
    return fix_id in ("compile", "dispatch_overhead")


__all__ = ["DEFAULT_MAX_SECONDS", "DEFAULT_TOP_FIXES", "NULL_FIX", "LoopVerifier",
           "NullSwitch", "counted_after", "plan_fixes", "rule_switch", "switch_for",
           "verify_options"]
