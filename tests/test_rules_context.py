"""Advice that knows its context: no compile advice to compiled code (seen in the trace, not
only in the hook's flags), no GPU verdict or GPU fix for a run without GPU activity, graph
breaks named and discounted in compile advice, host syncs before compile, Python input
preparation on the critical path flagged even when the GPU leads, no input-pipeline advice to a
saturated GPU."""

from __future__ import annotations

import copy

import pytest

from tb_gpuprof.analysis.classify import is_tc_eligible_op
from tb_gpuprof.analysis.format import render
from tb_gpuprof.analysis.linking import FORWARD, link_launches
from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.analysis.savings import finalize
from tb_gpuprof.analysis.stages import syncs_bound
from tb_gpuprof.model import (
    DATALOADER,
    KERNEL,
    STEP,
    Annotation,
    CpuOp,
    GpuActivity,
    Profile,
    RuntimeCall,
)
from tb_gpuprof.readers import load_profile
from tests.real_traces import DATA, context, real_report

GPU_FIXES = {"tf32", "amp", "channels_last", "input_pipeline", "pinned_memory", "host_sync",
             "batch_size", "compile", "dispatch_overhead", "nvml_batch_size", "throttling",
             "gpu_placement"}


def _ids(rep):
    return [r["id"] for r in rep["recommendations"]]


def _without_compiled_flag(trace_id):
    env = copy.deepcopy(context(DATA / trace_id)) or {}
    env.get("flags", {}).pop("compiled", None)
    return build_report(load_profile(str(DATA / trace_id), python_calls=False), env=env)


@pytest.mark.parametrize("trace_id", ["h200_ladders/gpt2_bf16_compile.json.gz",
                                      "h200/mlp_compiled_small.json.gz"])
def test_compiled_code_is_seen_in_the_trace_without_the_flag(trace_id):
    rep = _without_compiled_flag(trace_id)
    assert "compiled" not in rep["system"]["flags"]
    assert rep["bottleneck"]["bound"] == "dispatch"  # the case compile advice would answer
    assert any(n.startswith("triton_") for n in rep["bottleneck"]["compiled_code"])
    assert "compile" not in _ids(rep)
    assert "dispatch_overhead" in _ids(rep)  # the advice for compiled, launch-bound code
    assert "compile" not in _ids(real_report(trace_id))


def test_eager_runs_still_get_compile_advice():
    rep = real_report("h200_ladders/gpt2_bf16.json.gz")
    assert rep["bottleneck"]["compiled_code"] == []
    assert _ids(rep)[0] == "compile"


def _cpu_only_trace(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    path = tmp_path / "cpu_only.json"
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=1, active=4, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(6):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            prof.step()
    return path


def test_a_run_without_gpu_activity_says_so_first_and_gets_no_gpu_advice(tmp_path):
    p = load_profile(str(_cpu_only_trace(tmp_path)), python_calls=False)
    assert not p.gpu and p.cpu_ops
    rep = build_report(p)
    bn = rep["bottleneck"]
    assert bn["bound"] == "no_gpu"
    assert bn["verdict"].startswith("no GPU activity")
    assert "dispatch-bound" not in bn["verdict"] and "GPU waits" not in bn["verdict"]
    assert not GPU_FIXES & set(_ids(rep))
    text = render(rep)
    first = next(line for line in text.splitlines() if line.startswith("  "))
    assert "verdict:" in first and "no GPU activity" in first
    assert "bound by:" not in text


def _with_forward_syncs(trace_id, per_iteration):
    """The real trace with ``per_iteration`` host syncs put between forward kernel launches
    of each iteration (what ``.item()`` / ``nonzero`` routing inside the forward leaves)."""
    p = load_profile(str(DATA / trace_id), python_calls=False)
    launches, _ = link_launches(p, is_tc_eligible_op)
    kernels = {g.correlation for g in p.gpu if g.kind == KERNEL}
    fwd = sorted(c.launch_us for corr, c in launches.items()
                 if c.phase == FORWARD and corr in kernels)
    steps = sorted((a.start_us, a.start_us + a.dur_us) for a in p.annotations
                   if a.name.startswith("ProfilerStep") and not a.on_gpu)
    tid = next(r.tid for r in p.runtime if r.correlation in launches)
    for lo, hi in steps:
        inside = [t for t in fwd if lo <= t < hi]
        picks = inside[len(inside) // 4: 3 * len(inside) // 4: max(
            len(inside) // (2 * per_iteration), 1)][:per_iteration]
        for t in picks:
            p.runtime.append(RuntimeCall("cudaStreamSynchronize", t + 0.5, 2.0, tid=tid))
    p.runtime.sort(key=lambda r: r.start_us)
    return build_report(p, env=context(DATA / trace_id))


def test_compile_names_the_graph_breaks_and_discounts_its_saving():
    trace_id = "h200_loops/gpt2_eager.json.gz"
    plain = next(r for r in real_report(trace_id)["recommendations"] if r["id"] == "compile")
    rep = _with_forward_syncs(trace_id, 3)
    breaks = rep["bottleneck"]["graph_breaks"]
    assert breaks and breaks[0]["op"] == "cudaStreamSynchronize"
    assert breaks[0]["count_per_iteration"] == pytest.approx(3, abs=0.5)
    rec = next(r for r in rep["recommendations"] if r["id"] == "compile")
    assert "cudaStreamSynchronize" in rec["problem"] and "graph break" in rec["problem"]
    assert rec["evidence"]["compilable_share"] == pytest.approx(0.25, abs=0.05)
    assert rec["estimated_saving_ms"] < 0.6 * plain["estimated_saving_ms"]


def test_host_sync_counts_the_dispatch_of_branches_on_gpu_values_in_the_forward():
    # syncs in the middle half of the forward (an MoE's nonzero + `if` per expert): the host
    # branches on GPU values there, and host_sync's fix (vectorised branches) takes that
    # dispatch, and the backward's share of it, with the waits
    rep = _with_forward_syncs("h200_loops/gpt2_eager.json.gz", 8)
    bn = rep["bottleneck"]
    assert 0.3 < bn["branch_share"] < 0.8  # the middle half of the forward's launches
    rec = next(r for r in rep["recommendations"] if r["id"] == "host_sync")
    ev = rec["evidence"]
    waits_only = ev["refill_ms"] + ev["blocked_ms"]  # all the sync-wait-only fix can remove
    assert rec["estimated_saving_ms"] > waits_only
    assert rec["estimated_saving_ms"] <= rec["removable_ms"] + 1e-6
    assert rec["removable_ms"] == pytest.approx(waits_only + ev["branch_dispatch_ms"],
                                                abs=2e-3)
    assert "cudaStreamSynchronize" in rec["problem"]
    assert "grouped_mm" in rec["fix"]["pytorch"]


def test_syncs_after_the_backward_are_no_graph_breaks():
    # loss.item() and eight float(grad.norm()) after backward: compile's graph is whole, and
    # host_sync counts the waits only
    rep = real_report("h200_loops/host_sync.json.gz")
    assert rep["bottleneck"]["graph_breaks"] == []
    assert rep["bottleneck"]["branch_dispatch_ms"] is None
    rec = next(r for r in rep["recommendations"] if r["id"] == "host_sync")
    assert "branch_dispatch_ms" not in rec["evidence"]


def test_syncs_outside_the_model_leave_compile_measured_on_its_own():
    # the syncs are 8% of the un-profiled iteration and break no graph: compile's estimate is
    # its own, and the order is the savings' (on the H200, a GPT-2 loop with per-step
    # .item() syncs measured compile 1.33x and the syncs removed 0.94x)
    recs = real_report("h200_loops/host_sync.json.gz")["recommendations"]
    ids = [r["id"] for r in recs]
    compile_rec = recs[ids.index("compile")]
    assert "counted after" not in compile_rec["estimate_basis"]
    assert "prerequisite_of" not in recs[ids.index("host_sync")]["evidence"]
    savings = [r["estimated_saving_ms"] for r in recs if r["estimated_saving_ms"] is not None]
    assert savings == sorted(savings, reverse=True)


def test_host_sync_comes_before_compile_when_the_syncs_bound_the_iteration():
    rep = copy.deepcopy(real_report("h200_loops/host_sync.json.gz"))
    recs = rep["recommendations"]
    assert [r["id"] for r in recs][:2] == ["compile", "host_sync"]
    assert not syncs_bound(rep)
    shares = rep["bottleneck"]["corrected_pct"]
    shares["sync"] = max(shares.values()) + 1.0  # the syncs now the largest share
    assert syncs_bound(rep)
    reordered = finalize(copy.deepcopy(recs), rep["iterations"]["unprofiled_median_ms"],
                         syncs_bound(rep))
    assert [r["id"] for r in reordered][:2] == ["host_sync", "compile"]
    assert reordered[0]["evidence"]["prerequisite_of"] == "compile"


@pytest.mark.parametrize("trace_id", ["h200/resnet50_amp_cl.json.gz",
                                      "h200_ladders/resnet50_amp_cl.json.gz",
                                      "h200_loops/resnet50_amp_cl.json.gz"])
def test_a_saturated_gpu_gets_no_input_pipeline_advice(trace_id):
    rep = real_report(trace_id)
    assert rep["bottleneck"]["bound"] == "gpu"
    assert "input_pipeline" not in _ids(rep)


ITER_US, COLLATE_US, OPS, OP_US, KERNEL_US = 48_000.0, 12_000.0, 360, 100.0, 80.0


def _collate_then_forward(loader: bool) -> Profile:
    """Six iterations of a loop whose host first collates the batch in Python for 12 ms
    (op-less stretches of 280 us between small ``aten::tensor`` ops, each short enough to
    pass for glue between ops), then dispatches 360 ops of 100 us, each launching an 80 us
    kernel: the GPU is busy 60% of the 48 ms iteration, the host all of it. ``loader``: the
    collate runs inside a single-process DataLoader's fetch."""
    p = Profile(source="synthetic", format="kineto")
    corr, gpu_free = 0, 0.0
    for i in range(6):
        t0 = i * ITER_US
        p.annotations.append(Annotation(f"ProfilerStep#{i}", t0, ITER_US, kind=STEP, step=i))
        if loader:
            p.annotations.append(Annotation(
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, COLLATE_US,
                kind=DATALOADER))
        for j in range(int(COLLATE_US // 300)):
            p.cpu_ops.append(CpuOp("aten::tensor", t0 + 300.0 * j, 20.0, tid=1))
        for k in range(OPS):
            at = t0 + COLLATE_US + OP_US * k
            corr += 1
            p.cpu_ops.append(CpuOp("aten::linear", at, OP_US - 5.0, tid=1))
            p.runtime.append(RuntimeCall("cudaLaunchKernel", at + 50.0, 5.0, tid=1,
                                         correlation=corr))
            start = max(at + 60.0, gpu_free + 1.0)
            gpu_free = start + KERNEL_US
            p.gpu.append(GpuActivity(KERNEL, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
                                     start, KERNEL_US, correlation=corr))
    return p


@pytest.mark.parametrize("loader", [False, True])
def test_python_collate_on_the_critical_path_is_input_pipeline_even_when_gpu_leads(loader):
    rep = build_report(_collate_then_forward(loader),
                       env={"unprofiled": {"median_ms": ITER_US / 1e3, "count": 12,
                                           "source": "wall_time"}})
    bn = rep["bottleneck"]
    assert bn["bound"] == "gpu"  # the report's old "GPU-bound 60%"
    assert bn["input_prep_ms"] == pytest.approx(COLLATE_US / 1e3, rel=0.1)
    rec = next(r for r in rep["recommendations"] if r["id"] == "input_pipeline")
    # a DataLoader's workers take the collate off the host: 48 -> about 36 ms
    assert rec["estimated_saving_ms"] == pytest.approx(COLLATE_US / 1e3, rel=0.3)
    assert rec["estimated_saving_ms"] <= rec["removable_ms"]
    assert "before each forward" in rec["problem"]


def test_host_work_hidden_under_a_saturated_gpu_is_not_advice():
    # the same loop with 130 us kernels: during the forward the GPU falls 30 us behind per
    # op, so 10.8 ms of queued work runs through the 12 ms collate: moving the collate saves
    # about 1 ms (2%), not 12
    p = _collate_then_forward(False)
    for g in p.gpu:
        g.dur_us = 130.0
    rep = build_report(p, env={"unprofiled": {"median_ms": ITER_US / 1e3, "count": 12,
                                              "source": "wall_time"}})
    assert rep["bottleneck"]["bound"] == "gpu"
    assert rep["bottleneck"]["input_prep_ms"] > 10.0
    assert "input_pipeline" not in _ids(rep)
