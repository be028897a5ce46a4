"""The report's columnar fast paths (issue 15, branch perf8) against the loops they replace,
on every real trace in tests/data and ../shared/fixtures: the same floats, the same orders.

- ``stages.tally_activities`` (class codes, sums by ``np.add.at``) vs ``stages.tally_loop``;
- ``roofline.kernel_traffic`` (columns) vs ``roofline.kernel_traffic_loop``;
- the what-if replay with the tally's class codes vs the replay grouping kernels itself, and
  a remembered run vs the same run on a fresh replay.
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from tb_gpuprof.analysis import roofline, stages
from tb_gpuprof.analysis.bottleneck import host_timeline
from tb_gpuprof.analysis.columns import column_scope
from tb_gpuprof.analysis.savings import FIXES
from tb_gpuprof.model import Profile
from tb_gpuprof.readers import load_profile

ROOT = Path(__file__).resolve().parent
TRACES = sorted([*ROOT.glob("data/**/*.json.gz"), *ROOT.glob("data/**/*.pb"),
                 *(ROOT.parents[1] / "shared" / "fixtures").glob("*.[gb]z"),
                 *(ROOT.parents[1] / "shared" / "fixtures").glob("*.pb")])


def _linked(prof: Profile):
    sel = stages.select_iterations(prof, None, None, None)
    return sel, stages.assign_to_iterations(prof, sel.windows)


def _tally_view(t: stages.Tally, op_flops: dict[int, float]) -> dict:
    sims = [msgspec.structs.astuple(k) for k in t.sim_kernels]
    view = {"totals": list(t.totals.items()), "precision": list(t.precision_us.items()),
            "category": list(t.category_us.items()), "phase": list(t.phase_us.items()),
            "phase_known": t.phase_known, "sim_counts": t.sim_counts, "sims": sims,
            "windows": [(list(w.breakdown_us.items()), w.busy.iv) for w in t.windows]}
    view["rows"] = stages.kernel_table(t, op_flops).rows  # after the windows: it finishes rows
    return view


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name)
def traced(request):
    prof = load_profile(request.param)
    with column_scope():
        sel, linked = _linked(prof)
        yield prof, sel, linked


def test_the_tally_in_columns_is_the_loop(traced):
    _, _, linked = traced
    fast = stages.tally_activities(linked.per_window)
    assert fast.flop_entries is not None or not any(linked.per_window)
    loop = stages.tally_loop(linked.per_window)
    assert _tally_view(fast, linked.op_flops) == _tally_view(loop, linked.op_flops)


def test_kernel_traffic_in_columns_is_the_loop(traced):
    prof, _, linked = traced
    report = {"kernels": stages.kernel_table(stages.tally_activities(linked.per_window),
                                             linked.op_flops).rows}
    args = (report, prof, linked.per_window, linked.op_flops)
    fast, loop = roofline.kernel_traffic(*args), roofline.kernel_traffic_loop(*args)
    assert list(fast) == list(loop)
    for a, b in zip(fast.values(), loop.values(), strict=True):
        assert (a.bytes, a.flops, a.covered_us, a.precision, list(a.reasons.items())) == (
            b.bytes, b.flops, b.covered_us, b.precision, list(b.reasons.items()))


def test_the_replay_with_the_tallys_classes_and_remembered_runs_is_the_plain_one(traced):
    prof, sel, linked = traced
    tally = stages.tally_activities(linked.per_window)
    if not tally.sim_kernels:
        pytest.skip("no GPU work in the window")
    host = host_timeline(prof)
    n = len(tally.sim_kernels)
    given = stages.window_replay(prof, tally.sim_kernels, host, sel.windows,
                                 tally.sim_classes[:n] if tally.sim_classes is not None
                                 else None)
    plain = stages.window_replay(prof, tally.sim_kernels, host, sel.windows)
    assert given is not None and plain is not None
    for name, build in FIXES.items():
        for v in (0, 1, 2, 0):  # the last run is remembered: it must equal a fresh replay's
            fresh = stages.window_replay(prof, tally.sim_kernels, host, sel.windows)
            assert fresh is not None
            got, want, again = given.run(build(v), 0.45), plain.run(build(v), 0.45), \
                fresh.run(build(v), 0.45)
            assert got == want == again or all(map(math.isnan, (got, want, again))), name


def test_durations_numpy_orders_otherwise_take_the_loop():
    prof = load_profile(TRACES[0])
    with column_scope():
        _, linked = _linked(prof)
        acts = next(w for w in linked.per_window if w)
        for bad in (float("nan"), -0.0):
            a, ctx = acts[0]
            per_window = [[(msgspec.structs.replace(a, dur_us=bad), ctx), *acts[1:]]]
            t = stages.tally_activities(per_window)
            assert t.flop_entries is None and t.sim_classes is None  # tally_loop's
