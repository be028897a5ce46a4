"""Each stage of build_report (analysis/stages.py) on its own, on real H200 profiles.

The assertions are conservation laws between a stage's input and output (every activity lands
in one iteration, every microsecond in one bucket, idle attribution sums to idle), so they hold
for any trace and fail when a stage drops, double-counts or misplaces work.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tb_gpuprof.analysis import stages
from tb_gpuprof.analysis.bottleneck import host_timeline, is_sync_call
from tb_gpuprof.analysis.iterations import IterationWindow
from tb_gpuprof.errors import EmptyProfileError
from tb_gpuprof.model import DATALOADER, KERNEL, Profile
from tb_gpuprof.readers import load_profile

from . import h200

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
# Real traces of different shapes: GPU-bound ResNet (ProfilerStep), a bf16 transformer without
# step markers (optimizer steps, autograd phases), JAX XPlane, a loop that syncs on the host.
CASES = {
    "resnet50_tf32": h200.DATA / "resnet50_tf32.json.gz",
    "resnet18_slow_input": h200.DATA / "resnet18_slow_input.json.gz",
    "transformer": h200.TRANSFORMER,
    "jax_conv": h200.JAX_CONV,
    "host_sync": h200.LOOPS / "host_sync.json.gz",
}
if (SHARED / "kineto_transformer_bf16_h200.json.gz").exists():
    CASES["shared_transformer"] = SHARED / "kineto_transformer_bf16_h200.json.gz"


def _load(case: str) -> Profile:
    return load_profile(CASES[case])


def _run_to_tally(prof: Profile):
    sel = stages.select_iterations(prof, None, None, None)
    host_bounds = [(w.start_us, w.end_us) for w in sel.windows]
    linked = stages.assign_to_iterations(prof, sel.windows)
    return sel, host_bounds, linked, stages.tally_activities(linked.per_window)


# --- stage 1 ----------------------------------------------------------------------------------

def test_select_iterations_finds_every_profiler_step_and_honours_the_range():
    path = CASES["resnet50_tf32"]
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = sorted({int(e["name"].split("#")[1]) for e in events
                    if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")})
    prof = load_profile(path)
    sel = stages.select_iterations(prof, None, None, None)
    assert sel.plan.method == "profiler_step" and not sel.warnings
    assert [w.step for w in sel.windows] == steps
    part = stages.select_iterations(prof, None, steps[1], steps[-1])
    assert [w.step for w in part.windows] == steps[1:-1]
    with pytest.raises(EmptyProfileError, match="no iterations"):
        stages.select_iterations(prof, None, steps[-1] + 10, steps[-1] + 20)


def test_select_iterations_warns_for_a_missing_key_and_rejects_an_empty_profile():
    prof = _load("transformer")
    sel = stages.select_iterations(prof, "no_such_range", None, None)
    assert sel.plan.method == "optimizer_step"
    assert any("no_such_range" in w for w in sel.warnings)
    with pytest.raises(EmptyProfileError):
        stages.select_iterations(Profile("empty", "kineto"), None, None, None)


# --- stage 2 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_assign_gives_each_activity_to_the_iteration_that_launched_it(case):
    prof = _load(case)
    sel = stages.select_iterations(prof, None, None, None)
    host_bounds = [(w.start_us, w.end_us) for w in sel.windows]
    linked = stages.assign_to_iterations(prof, sel.windows)
    seen: set[int] = set()
    for (hs, he), acts in zip(host_bounds, linked.per_window, strict=True):
        for a, ctx in acts:
            assert id(a) not in seen  # no activity in two iterations
            seen.add(id(a))
            launched = ctx.launch_us if ctx is not None else a.start_us
            assert hs <= launched < he or hs <= a.start_us < he
    assert seen and len(seen) <= len(prof.gpu)
    # aligned bounds: in order, never overlapping, each covering its own GPU work
    prev_end = None
    for w, acts in zip(sel.windows, linked.per_window, strict=True):
        assert w.end_us >= w.start_us
        if prev_end is not None:
            assert w.start_us >= prev_end
        if acts:
            assert w.end_us >= max(a.start_us + a.dur_us for a, _ in acts)
        prev_end = w.end_us


def test_align_to_gpu_extends_a_host_window_to_its_gpu_work():
    prof = _load("resnet50_tf32")
    _, host_bounds, linked, _ = _run_to_tally(prof)
    # GPU-bound: the host runs ahead, so some iteration's GPU work ends after its host marker.
    ends = [max(a.start_us + a.dur_us for a, _ in acts) for acts in linked.per_window]
    assert any(e > he for e, (_, he) in zip(ends, host_bounds, strict=True))
    w = IterationWindow(0, 1, host_bounds[0][0], host_bounds[0][0] + 1.0)
    stages.align_to_gpu([w], [linked.per_window[0]], [])
    assert w.end_us == pytest.approx(ends[0])


# --- stage 3 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_tally_puts_every_microsecond_in_exactly_one_bucket(case):
    _, _, linked, tally = _run_to_tally(_load(case))
    acts = [a for w in linked.per_window for a, _ in w]
    total = sum(a.dur_us for a in acts)
    assert sum(k["total_us"] for k in tally.kernels.values()) == pytest.approx(total)
    assert sum(k["count"] for k in tally.kernels.values()) == len(acts)
    assert sum(tally.category_us.values()) == pytest.approx(total)
    t = tally.totals
    assert t["tc"] + t["elig"] + t["other"] + t["memory"] == pytest.approx(total)
    for wt, w_acts in zip(tally.windows, linked.per_window, strict=True):
        assert sum(wt.breakdown_us.values()) == pytest.approx(sum(a.dur_us for a, _ in w_acts))
        # the union is never longer than the sum (up to float error on absolute timestamps)
        assert sum(e - s for s, e in wt.busy.iv) <= sum(a.dur_us for a, _ in w_acts) + 1e-2
    assert tally.sim_counts[-1] == len(tally.sim_kernels) == len(acts)
    assert tally.sim_counts == sorted(tally.sim_counts)


def test_tally_phases_cover_at_most_the_gpu_time():
    _, _, linked, tally = _run_to_tally(_load("transformer"))
    assert tally.phase_known  # autograd marks the transformer's backward launches
    total = sum(k["total_us"] for k in tally.kernels.values())
    assert 0 < sum(tally.phase_us.values()) <= total + 1e-6
    sec = stages.phases_section(tally, total, len(linked.per_window))
    assert sec is not None
    per_iter = (sec["forward_ms"] + sec["backward_ms"] + sec["optimizer_ms"]
                + sec["unattributed_ms"])
    assert per_iter == pytest.approx(total / len(linked.per_window) / 1e3, abs=1e-3)


def test_kernel_class_reads_precision_from_op_input_types():
    _, _, linked, _ = _run_to_tally(_load("transformer"))
    typed = [(a, c) for w in linked.per_window for a, c in w
             if c is not None and c.input_types and a.kind == KERNEL]
    assert typed
    precisions = {stages.kernel_class(a, c)[1] for a, c in typed}
    assert "bf16" in precisions  # autocast(bfloat16): the math ran on bf16 inputs


# --- stage 4 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_idle_attribution_sums_to_the_idle_time(case):
    prof = _load(case)
    sel, _, _, tally = _run_to_tally(prof)
    idle = stages.attribute_idle(prof, sel.windows, tally.windows,
                                 host_timeline(prof).blocking)
    assert len(idle.items) == len(sel.windows)
    for it, w in zip(idle.items, sel.windows, strict=True):
        assert it["gpu_busy_ms"] + it["breakdown_ms"]["idle"] == pytest.approx(
            w.wall_us / 1e3, abs=2e-4)
    total_idle = sum(it["breakdown_ms"]["idle"] for it in idle.items) * 1e3
    assert sum(idle.idle_attribution_us.values()) == pytest.approx(total_idle, rel=1e-3, abs=1)
    assert set(idle.idle_attribution_us) == set(stages.IDLE_CAUSES)


def test_idle_while_the_dataloader_ran_is_charged_to_data_loading():
    prof = _load("resnet18_slow_input")
    sel, _, _, tally = _run_to_tally(prof)
    loader = [x for x in prof.annotations if x.kind == DATALOADER and not x.on_gpu]
    assert loader
    idle = stages.attribute_idle(prof, sel.windows, tally.windows,
                                 host_timeline(prof).blocking)
    loading = idle.idle_attribution_us["data_loading"]
    assert loading > 0
    # never more than the loader's own time inside the analysed iterations
    lo, hi = sel.windows[0].start_us, sel.windows[-1].end_us
    inside = sum(max(0.0, min(x.start_us + x.dur_us, hi) - max(x.start_us, lo)) for x in loader)
    assert loading <= inside + 1e-6


# --- stage 5 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_table_is_sorted_complete_and_gives_flops_only_to_math(case):
    _, _, linked, tally = _run_to_tally(_load(case))
    e = tally.flop_entries  # the columns tally_activities fills (tally_loop: flop_groups)
    math_ops = ({op for op, g in tally.flop_groups.items() if any(m for _, _, m in g)}
                if e is None else set(e.op[(e.op >= 0) & e.is_math].tolist()))
    table = stages.kernel_table(tally, linked.op_flops)
    rows = table.rows
    assert [r["total_us"] for r in rows] == sorted((r["total_us"] for r in rows), reverse=True)
    assert sum(r["pct"] for r in rows) == pytest.approx(100.0, abs=0.05 * len(rows) + 0.01)
    assert all("_ops" not in r and len(r["ops"]) <= 5 for r in rows)
    expected = sum(linked.op_flops.get(op, 0.0) for op in math_ops)
    assert sum(r["flops"] or 0.0 for r in rows) == pytest.approx(expected, rel=1e-9)
    for r in rows:
        if r["flops"]:
            assert r["category"] in ("gemm", "conv", "attention") or r["uses_tensor_cores"] \
                or r["tc_eligible"]


def test_tensor_core_and_breakdown_sections_add_up():
    prof = _load("resnet50_tf32")
    sel, _, linked, tally = _run_to_tally(prof)
    table = stages.kernel_table(tally, linked.op_flops)
    tc = stages.tensor_core_section(tally.totals, table.gpu_time_us)
    assert tc["tc_pct"] + tc["eligible_not_tc_pct"] + tc["other_pct"] + tc["memory_pct"] \
        == pytest.approx(100.0, abs=0.01)
    idle = stages.attribute_idle(prof, sel.windows, tally.windows,
                                 host_timeline(prof).blocking)
    bd = stages.breakdown_section(sel.windows, idle, tally.totals)
    assert bd["gpu_busy_us"] + bd["idle_us"] == pytest.approx(bd["wall_us"], abs=1.0)
    it = stages.iterations_section(sel, idle.items, None)
    assert it["count"] == len(sel.windows) and it["items"] is idle.items
    assert it["min_ms"] <= it["median_ms"] <= it["p95_ms"] <= it["max_ms"]


def test_iterations_section_warns_when_the_profiler_slowed_the_window():
    prof = _load("resnet50_tf32")
    sel, _, _, tally = _run_to_tally(prof)
    idle = stages.attribute_idle(prof, sel.windows, tally.windows,
                                 host_timeline(prof).blocking)
    median = stages.iterations_section(sel, idle.items, None)["median_ms"]
    assert not sel.warnings
    sec = stages.iterations_section(sel, idle.items, {"median_ms": median / 2, "source": "hook"})
    assert sec["profiler_overhead_ratio"] == pytest.approx(2.0, rel=1e-3)
    assert sec["unprofiled_source"] == "hook"
    assert any("profiler slowed" in w for w in sel.warnings)


def test_bottleneck_stage_ranks_the_host_sync_sites():
    prof = _load("host_sync")
    sel, _, linked, _ = _run_to_tally(prof)
    host = host_timeline(prof)
    sec = stages.bottleneck_stage(prof, linked, sel.windows, host, None, "pytorch")
    sites = sec["sync_sites"]
    assert sites and len(sites) <= 5
    blocked = [s["blocked_ms_per_iteration"] for s in sites]
    assert blocked == sorted(blocked, reverse=True)
    wall_ms = sum(w.wall_us for w in sel.windows) / len(sel.windows) / 1e3
    assert sum(blocked) <= wall_ms
    assert host.blocking is not None


# --- stage 6 ----------------------------------------------------------------------------------

def test_savings_stage_orders_by_estimated_saving():
    rep = dict(h200.report("resnet50_fp32"))  # a full report: recommendations already re-timed
    recs = [dict(r) for r in rep["recommendations"]]
    assert recs
    prof = h200.profile("resnet50_fp32")
    sel, _, _, tally = _run_to_tally(prof)
    host = host_timeline(prof)
    shuffled = {**rep, "recommendations": list(reversed(recs))}
    unprofiled = stages.unprofiled_median(h200.env("resnet50_fp32").get("unprofiled"))
    stages.savings_stage(shuffled, prof, tally, host, sel.windows, unprofiled)
    savings = [r["estimated_saving_ms"] or 0.0 for r in shuffled["recommendations"]]
    assert savings == sorted(savings, reverse=True)
    assert stages.window_replay(prof, [], host, sel.windows) is None


def test_async_copies_and_stream_waits_are_not_host_syncs():
    prof = load_profile(h200.LOOPS / "pinned.json.gz")  # non_blocking copies from pinned memory
    blocking = host_timeline(prof).blocking
    causes = dict(stages._idle_coverages(prof, blocking))
    sync, launch = causes["synchronization"], causes["launch_overhead"]
    real_syncs = [(r.start_us, r.start_us + r.dur_us) for r in prof.runtime
                  if is_sync_call(r.name, r.correlation, blocking)]
    asyncs = [r for r in prof.runtime
              if r.name.startswith(("cudaMemcpyAsync", "cudaStreamWaitEvent"))
              and not is_sync_call(r.name, r.correlation, blocking)]
    assert asyncs  # the loop's input copies
    for r in asyncs:
        s, e = r.start_us, r.start_us + r.dur_us
        if not any(a < e and s < b for a, b in real_syncs):
            assert sync.overlap(s, e) == 0.0, r.name
        assert launch.overlap(s, e) == pytest.approx(r.dur_us, abs=1e-2)  # float timestamps
