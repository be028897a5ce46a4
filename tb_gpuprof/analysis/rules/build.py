"""The one recommendation builder every rule uses (the report schema's ``Recommendation``)."""

from __future__ import annotations

from typing import Any

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


def recommendation(rid: str, severity: str, title: str, problem: str,
                   evidence: dict[str, Any], fix: dict[str, str], saving_ms: float | None,
                   mean_ms: float | None, removable_ms: float | None = None) -> dict[str, Any]:
    """A recommendation; its saving as a share of ``mean_ms`` (the iteration) when both are
    known. ``removable_ms``: the most its fix can remove per iteration (the time of the work
    it changes), the bound every estimate of its saving stays under. Re-timing
    (analysis/savings.py) may later replace the saving and the severity."""
    if saving_ms is not None and removable_ms is not None:
        saving_ms = round(min(saving_ms, removable_ms), 3)
    return {
        "id": rid, "severity": severity, "title": title, "problem": problem,
        "evidence": evidence, "fix": fix,
        "estimated_saving_ms": saving_ms,
        "estimated_saving_pct": round(100.0 * saving_ms / mean_ms, 1)
        if saving_ms is not None and mean_ms else None,
        "removable_ms": round(removable_ms, 3) if removable_ms is not None else None,
    }


def by_saving(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Severity first (it follows the saving: analysis/savings.py), then the largest estimated
    saving (stable for ties). Recommendations without an estimate keep their rule's severity
    and come after the estimated ones of that severity."""
    return sorted(recs, key=lambda r: (SEVERITY_ORDER.get(r["severity"], 3),
                                       -(r["estimated_saving_ms"] or 0.0)))
