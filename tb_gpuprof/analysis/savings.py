"""Each recommendation's estimated saving, from re-timing the window with its fix applied.

A rule says *what* to change; this module says *how much* it buys, by replaying the window
(:mod:`whatif`) with the fix's effect on the kernels and host segments it touches. The range
comes from the low and high ends of the speed-up table. Severity then follows the saving.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .rules import RULES, SEVERITY_ORDER, by_saving, retimed
from .whatif import Fix, Replay, predicted_ms

SEVERITY_HIGH_PCT = 20.0
SEVERITY_MEDIUM_PCT = 5.0
# A fix predicted to save less than this share of the iteration is not advice: run-to-run
# spread of the un-profiled iteration on the H200 loops is larger (docs/recommendations.md).
MIN_SAVING_PCT = 0.5
RANGE_MIN_WIDTH_PCT = 1.0  # ranges are printed in whole percent


def retime(recs: list[dict[str, Any]], replay: Replay | None, measured_ms: float,
           host_scale: float, basis: str, host_note: str = "") -> None:
    """Replace the rules' savings by re-timed ones (in place); :func:`finalize` then sets
    severity from them and drops what saves nothing. ``host_note``: how the host scale was
    found, where the estimate should say so."""
    ids = {r["id"] for r in recs}
    for rec in recs:
        estimator = retimed(rec["id"])
        if estimator is None or replay is None or measured_ms <= 0:
            continue
        build = estimator.fix(rec, replay)
        first = estimator.counted_after(rec, ids)
        after = _plain_fix(first, replay)
        start = ([predicted_ms(replay, after(v), measured_ms, host_scale) for v in (0, 1, 2)]
                 if after else [measured_ms] * 3)
        typical, low, high = (predicted_ms(replay, build(v), measured_ms, host_scale,
                                           after(v) if after else None) for v in (0, 1, 2))
        bound = rec.get("removable_ms")
        cap = bound if bound is not None else float("inf")
        saving = min(max(start[0] - typical, 0.0), cap)
        pcts = sorted(100.0 * min(max(s0 - t, 0.0), cap) / measured_ms
                      for s0, t in ((start[1], low), (start[2], high)))
        rec["estimated_saving_ms"] = round(saving, 3)
        rec["estimated_saving_pct"] = round(100.0 * saving / measured_ms, 1)
        rec["estimated_range_pct"] = range_pct(pcts[0], pcts[1])
        rec["predicted_iteration_ms"] = round(start[0] - saving, 3)
        capped = bound is not None and max(start[0] - typical, 0.0) > bound
        rec["estimate_basis"] = (
            f"re-timed the window with the fix applied ({estimator.what(rec)}), on the "
            f"{basis} {measured_ms:.1f} ms iteration; the range uses the low and high "
            "speed-up factors"
            + (f"; capped at the {bound:.2f} ms of work the fix changes" if capped else "")
            + (f"; counted after `{first}`" if first else "") + host_note)


def _plain_fix(rule_id: str | None, replay: Replay) -> Callable[[int], Fix] | None:
    """The fix of the rule an estimate is counted after, as that rule applies it plainly."""
    estimator = retimed(rule_id) if rule_id else None
    return estimator.fix(None, replay) if estimator else None


def range_pct(low: float, high: float) -> list[float] | None:
    """[low, high] when they differ at the precision a range is printed with (whole
    percent); a range narrower than one point prints as "75%–75%": one value, None."""
    return [round(low, 1), round(high, 1)] if high - low >= RANGE_MIN_WIDTH_PCT else None


def finalize(recs: list[dict[str, Any]], iteration_ms: float,
             syncs_bound: bool = False) -> list[dict[str, Any]]:
    """Severity from each re-timed saving (a rule's own severity stands where none could be
    re-timed: ``communication``); a fix predicted to save less than
    :data:`MIN_SAVING_PCT` of the iteration is left out; then the order: severity, saving,
    and a fix counted after another (its ``Retiming.after``) right after that one. ``syncs_bound``:
    host syncs are the largest share of the iteration, so ``host_sync`` comes before
    ``compile`` whatever their estimates (a compiled graph still waits at every sync)."""
    kept = []
    for rec in recs:
        pct = rec.get("estimated_saving_pct")
        if rec.get("estimated_saving_ms") is not None and pct is None and iteration_ms > 0:
            pct = rec["estimated_saving_pct"] = round(
                100.0 * rec["estimated_saving_ms"] / iteration_ms, 1)
        # a rule that fired on work the GPU may hide asks the re-timing to confirm it
        confirm = (rec.get("evidence") or {}).get("confirm_min_pct")
        if pct is None and confirm is not None:
            continue  # not re-timed: nothing confirms the work is on the critical path
        if pct is not None:
            if pct < max(MIN_SAVING_PCT, confirm or 0.0):
                continue
            if rec.get("predicted_iteration_ms") is not None:  # re-timed: severity follows
                rec["severity"] = severity_for(pct)
        kept.append(rec)
    ordered = by_saving(kept)
    ids = [r["id"] for r in ordered]
    for rule in RULES:  # the registry's order: amp after tf32 is settled before compile
        estimator, rid = rule.retiming, rule.id
        first = estimator.after if estimator else None
        if estimator is None or first is None or rid not in ids or first not in ids \
                or ids.index(first) < ids.index(rid):
            continue
        if estimator.counted_after(ordered[ids.index(rid)], set(ids)) is not None or (
                estimator.after_when_syncs_bound and syncs_bound):
            # the prerequisite moves up to its dependent's place and takes its severity:
            # the dependent's saving needs it
            pre = ordered.pop(ids.index(first))
            at = ids.index(rid)
            pre["severity"] = min(pre["severity"], ordered[at]["severity"],
                                  key=lambda s: SEVERITY_ORDER.get(s, 3))
            pre.setdefault("evidence", {})["prerequisite_of"] = rid
            ordered.insert(at, pre)
            ids = [r["id"] for r in ordered]
    return ordered


def severity_for(saving_pct: float | None) -> str:
    if saving_pct is None:
        return "medium"
    if saving_pct >= SEVERITY_HIGH_PCT:
        return "high"
    return "medium" if saving_pct >= SEVERITY_MEDIUM_PCT else "low"
