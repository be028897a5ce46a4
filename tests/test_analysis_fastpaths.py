"""The report's columnar fast paths (issue 15, branch perf8) against the loops they replace,
on every real trace in tests/data and ../shared/fixtures: the same floats, the same orders.

- ``stages.tally_activities`` (class codes, sums by ``np.add.at``) vs ``stages.tally_loop``;
- ``roofline.kernel_traffic`` (columns, read or the tally's) vs the loop it replaced
  (``_kernel_traffic_loop``, here);
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
from tb_gpuprof.analysis.rules import RULES
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
    tally = stages.tally_activities(linked.per_window, linked.times)
    report = {"kernels": stages.kernel_table(tally, linked.op_flops).rows}
    args = (report, prof, linked.per_window, linked.op_flops)
    loop = _kernel_traffic_loop(*args)
    # read from the activities, and from the tally's columns of them (build_report's way)
    assert tally.activities() is not None or not any(linked.per_window)
    for fast in (roofline.kernel_traffic(*args),
                 roofline.kernel_traffic(*args, tally.activities())):
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
    fixes = {r.id: r.retiming.fix(None, plain) for r in RULES if r.retiming}
    for name, build in fixes.items():
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


def _kernel_traffic_loop(report, profile, per_window, flops_of_ops):
    """``roofline.kernel_traffic`` one activity at a time (the reference its columns are tested
    against).

    An op's traffic is split over the kernels it launched by their time, as its FLOPs are
    (report.py): a GEMM op over its math kernels, an elementwise op over what it launched.
    ``flops_of_ops``: linking's FLOPs of the ops launches ran under (``Linked.op_flops``:
    every op that launched a kernel is there when it has FLOPs).
    """
    kernels = {k["name"]: k for k in report["kernels"] if k["kind"] == roofline.KERNEL}
    tallies = {name: roofline._Tally() for name in kernels}
    groups: dict = {}
    no_op = roofline._no_op_reason(profile)
    # per kernel name: its tally, whether it is a collective, whether its row has FLOPs
    rows = {
        name: (tallies[name], k["category"] == "communication", bool(k["flops"]))
        for name, k in kernels.items()}
    for acts in per_window:
        for a, ctx in acts:
            row = rows.get(a.name) if a.kind == roofline.KERNEL else None
            if row is None:
                continue
            t, is_comm, has_flops = row
            if is_comm:
                t.miss("communication (NCCL) kernel", a.dur_us)
                continue
            math = has_flops and ctx is not None and ctx.flop_op is not None
            op_idx = (ctx.flop_op if math else ctx.launch_op) if ctx is not None else None
            if op_idx is None:
                t.miss(no_op, a.dur_us)
                continue
            if not math:
                if op_idx in flops_of_ops:
                    # a cast or layout kernel of a GEMM/conv op: the op's traffic is its math
                    # kernels' (as its FLOPs are)
                    t.miss("layout or setup kernel inside a GEMM/conv op (not modelled)",
                           a.dur_us)
                    continue
            groups.setdefault(op_idx, []).append((t, a.dur_us))
    by_signature: dict = {}
    for op_idx, group in groups.items():
        op = profile.cpu_ops[op_idx]
        key = roofline._signature(op)
        known = by_signature.get(key)
        if known is None:
            known = by_signature[key] = (roofline.op_traffic(op), roofline._op_precision(op))
        traffic, precision = known
        if isinstance(traffic, str):
            for t, dur in group:
                t.miss(traffic, dur)
            continue
        nbytes, flops = traffic
        total = sum(d for _, d in group) or 1.0
        for t, dur in group:
            t.bytes += nbytes * dur / total
            t.flops += flops * dur / total
            t.covered_us += dur
            t.precision = t.precision or precision
    return tallies


def test_host_annotations_in_columns_are_the_loop(traced):
    """The bottleneck's data/sync/framework spans, split in columns, are the per-annotation
    loop's (each (name, kind) judged by _annotation_class), in order, on every trace."""
    from tb_gpuprof.analysis.bottleneck import _annotation_class, _annotation_spans

    prof = traced[0]
    want: list[list[tuple[float, float]]] = [[], [], []]
    for a in prof.annotations:
        c = _annotation_class(a.name, a.kind)
        if not a.on_gpu and c < 3:
            want[c].append((a.start_us, a.start_us + a.dur_us))
    got = [list(zip(s.tolist(), e.tolist(), strict=True))
           for s, e in _annotation_spans(prof.annotations)]
    assert got == want
