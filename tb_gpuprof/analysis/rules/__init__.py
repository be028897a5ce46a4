"""Every recommendation rule, in one registry, with declared precedence.

A rule is one :class:`Rule` object (rule.py): its detection, its one estimator, its fix per
framework, the flags that show the fix is in place, its in-loop switch and its doc row. Rules
come from the trace (trace.py), distributed training (distributed.py) and NVML telemetry and
topology (nvml.py); each file ends with its ``RULES``. ``supersedes`` names rules whose
recommendation is dropped when this one fires: a bigger batch (NVML's batch_size) is no advice
while the input pipeline stalls.

Adding a rule: write its detection, fix and estimator and one ``Rule`` in its kind's file, and
its test; docs/recommendations.md's table is generated from :data:`RULES`
(``python tools/rule_docs.py``; tests/test_rule_docs.py fails while it is stale).
"""

from __future__ import annotations

from typing import Any

from . import distributed, nvml, trace
from .build import SEVERITY_ORDER, by_saving, recommendation
from .rule import Rec, Retiming, Rule, RuleDoc, RuleInput

# Order is the tie-break among equal savings and severities (the registry's order is kept).
RULES: tuple[Rule, ...] = (*trace.RULES, *distributed.RULES, *nvml.RULES)


def rule(rule_id: str) -> Rule:
    """The registered rule of that id (``KeyError`` names an unknown one)."""
    for r in RULES:
        if r.id == rule_id:
            return r
    raise KeyError(f"no rule {rule_id!r}: known are {', '.join(r.id for r in RULES)}")


def retimed(rec_id: str) -> Retiming | None:
    """The estimator of the recommendation with that id, where a rule re-times it."""
    return next((r.retiming for r in RULES if r.id == rec_id and r.retiming), None)


def has_gpu_activity(report: dict[str, Any]) -> bool:
    """Whether the window holds any GPU work (kernels, copies, memsets)."""
    return bool(report.get("kernels")) or bool(report.get("gpu_time_us"))


def recommend(report: dict[str, Any], topology: dict[str, Any] | None = None,
              rules: tuple[Rule, ...] = RULES) -> list[Rec]:
    """The recommendations that fire and are not superseded, largest saving first."""
    inp = RuleInput(report, topology)
    gpu = has_gpu_activity(report)
    fired = [(r, rec) for r in rules
             if (gpu or not r.needs_gpu) and (rec := r.detect(inp)) is not None]
    dropped = {name for r, _ in fired for name in r.supersedes}
    return by_saving([rec for r, rec in fired if r.id not in dropped])


def recommend_across_ranks(summary: dict[str, Any], reports: list[dict[str, Any]],
                           rules: tuple[Rule, ...] = RULES) -> list[Rec]:
    """The recommendations of the rules that judge all ranks of a window together."""
    recs = [rec for r in rules if r.across_ranks is not None
            and (rec := r.across_ranks(summary, reports)) is not None]
    return by_saving(recs)


def applied_flags() -> dict[str, tuple[str, ...]]:
    """Rule id -> the recorded flags that say its fix is in place (``compare``)."""
    return {r.id: r.applied_flags for r in RULES if r.applied_flags}


__all__ = ["RULES", "SEVERITY_ORDER", "Rule", "RuleDoc", "RuleInput", "applied_flags",
           "by_saving", "has_gpu_activity", "recommend", "recommend_across_ranks",
           "recommendation", "retimed", "rule"]
