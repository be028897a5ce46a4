"""The one recommendation builder every rule uses (the report schema's ``Recommendation``)."""

from __future__ import annotations

from typing import Any

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


def recommendation(rid: str, severity: str, title: str, problem: str,
                   evidence: dict[str, Any], fix: dict[str, str], saving_ms: float | None,
                   mean_ms: float | None) -> dict[str, Any]:
    """A recommendation; its saving as a share of ``mean_ms`` (the iteration) when both are
    known. Re-timing (analysis/savings.py) may later replace the saving and the severity."""
    return {
        "id": rid, "severity": severity, "title": title, "problem": problem,
        "evidence": evidence, "fix": fix,
        "estimated_saving_ms": saving_ms,
        "estimated_saving_pct": round(100.0 * saving_ms / mean_ms, 1)
        if saving_ms is not None and mean_ms else None,
    }


def by_saving(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Largest estimated saving first, then by severity (stable for ties)."""
    return sorted(recs, key=lambda r: (-(r["estimated_saving_ms"] or 0.0),
                                       SEVERITY_ORDER.get(r["severity"], 3)))
