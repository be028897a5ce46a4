"""Invariants of the advice over every real trace in tests/data (tests/real_traces.py): a
saving never exceeds the time its fix can remove, ranges are real ranges, severity follows
the saving, the order follows severity and saving, and nothing predicted to save (almost)
nothing is listed. Each check is also run on one hand-made violating list, so it can fail."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

from tb_gpuprof.analysis.savings import MIN_SAVING_PCT, severity_for
from tests.real_traces import real_report, trace_ids

SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}
Recs = list[dict[str, Any]]


def over_bound(recs: Recs) -> list[str]:
    """Recommendations whose saving exceeds the time their fix can remove."""
    return [r["id"] for r in recs if r.get("estimated_saving_ms") is not None
            and r.get("removable_ms") is not None
            and r["estimated_saving_ms"] > r["removable_ms"] + 1e-3]


def fake_ranges(recs: Recs) -> list[str]:
    """Ranges that print as one value ("75%–75%") or run backwards."""
    bad = []
    for r in recs:
        rng = r.get("estimated_range_pct")
        if rng is not None and (rng[1] - rng[0] < 1.0 or f"{rng[0]:.0f}" == f"{rng[1]:.0f}"):
            bad.append(r["id"])
    return bad


def severity_off_saving(recs: Recs) -> list[str]:
    """Re-timed recommendations whose severity is not the one their saving gives (a
    prerequisite may carry its dependent's, higher, severity)."""
    bad = []
    for r in recs:
        pct = r.get("estimated_saving_pct")
        if pct is None or r.get("predicted_iteration_ms") is None:
            continue
        given, due = SEVERITY_RANK[r["severity"]], SEVERITY_RANK[severity_for(pct)]
        prerequisite = (r.get("evidence") or {}).get("prerequisite_of")
        if given > due or (given != due and not prerequisite):
            bad.append(r["id"])
    return bad


def misordered(recs: Recs) -> list[str]:
    """A less severe fix above a more severe one, or a smaller saving above a larger one of
    the same severity, unless the first is the second's declared prerequisite."""
    bad = []
    for a, b in pairwise(recs):
        if (a.get("evidence") or {}).get("prerequisite_of") == b["id"]:
            continue
        ra, rb = SEVERITY_RANK[a["severity"]], SEVERITY_RANK[b["severity"]]
        if ra > rb or (ra == rb and (a["estimated_saving_ms"] or 0.0)
                       < (b["estimated_saving_ms"] or 0.0) - 1e-9
                       and a["estimated_saving_ms"] is not None):
            bad.append(f"{a['id']}>{b['id']}")
    return bad


def saving_nothing(recs: Recs) -> list[str]:
    return [r["id"] for r in recs if r.get("estimated_saving_pct") is not None
            and r["estimated_saving_pct"] < MIN_SAVING_PCT]


CHECKS = (over_bound, fake_ranges, severity_off_saving, misordered, saving_nothing)


@pytest.mark.parametrize("trace_id", trace_ids())
def test_advice_obeys_its_invariants(trace_id):
    recs = real_report(trace_id)["recommendations"]
    for check in CHECKS:
        assert check(recs) == [], (check.__name__, [
            (r["id"], r["severity"], r["estimated_saving_ms"], r.get("removable_ms"),
             r.get("estimated_range_pct")) for r in recs])


@pytest.mark.parametrize("trace_id", trace_ids())
def test_every_estimated_fix_states_its_bound(trace_id):
    for r in real_report(trace_id)["recommendations"]:
        if r["estimated_saving_ms"] is not None:
            assert r["removable_ms"] is not None and r["removable_ms"] > 0, r["id"]


def _rec(rid, severity, saving, pct, removable=None, rng=None, **evidence):
    return {"id": rid, "severity": severity, "estimated_saving_ms": saving,
            "estimated_saving_pct": pct, "removable_ms": removable,
            "estimated_range_pct": rng, "evidence": evidence,
            "predicted_iteration_ms": None if saving is None else 100.0 - saving}


def test_each_check_bites_on_a_violating_list():
    # "pinned memory saves 24.8 ms" on a run with 13.5 ms of copies
    assert over_bound([_rec("pinned_memory", "high", 24.8, 50.0, removable=13.5)]) == \
        ["pinned_memory"]
    assert fake_ranges([_rec("tf32", "high", 30.0, 75.0, rng=[75.0, 75.0])]) == ["tf32"]
    assert fake_ranges([_rec("tf32", "high", 30.0, 75.0, rng=[74.6, 75.4])]) == ["tf32"]
    assert severity_off_saving([_rec("amp", "medium", 30.0, 40.0)]) == ["amp"]
    assert misordered([_rec("compile", "medium", 4.0, 8.0), _rec("tf32", "high", 20.0, 40.0)]) \
        == ["compile>tf32"]
    assert misordered([_rec("a", "high", 10.0, 25.0), _rec("b", "high", 12.0, 30.0)]) == ["a>b"]
    assert saving_nothing([_rec("amp", "low", 0.0, 0.0)]) == ["amp"]
    # and a list that keeps them all passes every check
    good = [_rec("host_sync", "high", 1.0, 3.0, removable=1.5, prerequisite_of="compile"),
            _rec("compile", "high", 9.0, 30.0, removable=12.0, rng=[20.0, 44.0]),
            _rec("batch_size", "medium", None, None)]
    assert all(check(good) == [] for check in CHECKS)
