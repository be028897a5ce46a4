"""Physical invariants of the report's numbers, over every real trace in tests/data (issue 36).

No kernel computes faster than the pipe it runs on (its precision's Tensor Core rate, or the
FP32/FP64 CUDA-core rate, from NVIDIA's datasheets in analysis/peaks.py); FLOPs that are not a
kernel's work (an FFT or Winograd convolution's share of the direct convolution's count) are
labelled so and kept off the roofline; MFU is against one peak (dense BF16) whatever the
precision, so a faster run of the same work has the higher MFU. Each check is a function that
lists violations, and each is also fed one hand-made violation to show that it bites.
"""

from __future__ import annotations

import copy
import re
from itertools import combinations
from pathlib import PurePosixPath
from typing import Any

import pytest

from tb_gpuprof.analysis.peaks import gpu_peaks
from tb_gpuprof.compare import compare_reports
from tests.real_traces import real_report, trace_ids

TRACES = trace_ids()
# Kernel names of cuDNN's transform convolutions (FFT tiles, the FFT path's complex GEMM,
# Winograd engines): their op's FLOPs are the direct convolution's, not their work.
TRANSFORM_NAME = re.compile(r"fft|winograd|cf32cf32|cgemm", re.IGNORECASE)
# Compare's own threshold for "A and B do different work" (compare.WORK_CHANGE_WARN_PCT).
SAME_WORK_PCT = 5.0


def pipe_peak(kernel: dict[str, Any], report: dict[str, Any]) -> float | None:
    """The datasheet peak of the pipe a kernel row says it ran on: CUDA cores at FP32 (FP64)
    unless it used Tensor Cores, where FP32 data runs as TF32; a Tensor Core kernel of a
    precision the table lacks is bounded by the Tensor Cores' fastest rate."""
    row = gpu_peaks((report.get("system") or {}).get("gpu_name"))
    if row is None:
        return None
    p = kernel.get("precision")
    if not kernel.get("uses_tensor_cores"):
        return row.tflops.get("fp64" if p == "fp64" else "fp32")
    peak = row.tflops.get({"fp32": "tf32", "fp64": "fp64_tc"}.get(p, p))
    return peak or max(v for k, v in row.tflops.items() if k not in ("fp32", "fp64"))


def kernel_rate_violations(report: dict[str, Any]) -> list[str]:
    """Kernel rows whose TFLOP/s beat their pipe's peak, or whose FLOPs basis does not say
    what their FLOPs and rate are."""
    out = []
    for k in report["kernels"]:
        peak = pipe_peak(k, report)
        if k.get("tflops") is not None and peak is not None and k["tflops"] > peak:
            out.append(f"{k['name'][:60]}: {k['tflops']} TFLOP/s > {peak} pipe peak")
        if bool(k.get("flops")) != (k.get("flops_basis") is not None):
            out.append(f"{k['name'][:60]}: flops {k.get('flops')} with basis "
                       f"{k.get('flops_basis')}")
        if k.get("tflops") is not None and k.get("flops_basis") != "counted":
            out.append(f"{k['name'][:60]}: a rate of {k.get('flops_basis')} FLOPs")
    return out


def transform_conv_violations(report: dict[str, Any]) -> list[str]:
    """Transform convolutions whose FLOPs pass as their work, or that the roofline plots."""
    plotted = {p["name"] for p in report["roofline"]["points"]}
    out = []
    for k in report["kernels"]:
        transform = TRANSFORM_NAME.search(k["name"]) and k.get("flops") and (
            k["category"] == "conv" or any("conv" in op.lower() for op in k.get("ops") or ()))
        if transform and k.get("flops_basis") == "counted":
            out.append(f"{k['name'][:60]}: FFT/Winograd FLOPs counted as its work")
        if k.get("flops_basis") in ("direct_conv_equivalent", "over_pipe_peak"):
            if k.get("pct_of_sol") is not None or k["name"] in plotted:
                out.append(f"{k['name'][:60]}: {k['flops_basis']} FLOPs on the roofline")
    return out


def roofline_violations(report: dict[str, Any]) -> list[str]:
    """Roofline points faster than their compute ceiling."""
    rf = report["roofline"]
    ceilings = (rf.get("ceilings") or {}).get("tflops") or {}
    out = []
    for p in rf["points"]:
        peak = ceilings.get(p["ceiling"])
        if peak is not None and p["achieved_tflops"] > peak:
            out.append(f"{p['name'][:60]}: {p['achieved_tflops']} TFLOP/s > {peak} "
                       f"({p['ceiling']})")
        if p["pct_of_sol"] > 100.0 and p["bound"] == "compute":
            out.append(f"{p['name'][:60]}: {p['pct_of_sol']}% of a compute speed of light")
    return out


def mfu_violations(report: dict[str, Any]) -> list[str]:
    """MFU not against the GPU's dense BF16 peak, the precision's utilisation not against its
    own, or a throughput above the fastest the GPU can do."""
    tp = report["throughput"]
    row = gpu_peaks((report.get("system") or {}).get("gpu_name"))
    achieved = tp["achieved_tflops"]
    if row is None or achieved is None:
        return []
    out = []
    bf16 = row.tflops["bf16"]
    if tp["mfu_pct"] != _pct_of(achieved, bf16):
        out.append(f"MFU {tp['mfu_pct']}% is not {achieved} TFLOP/s of the {bf16} BF16 peak")
    own = row.tflops.get(tp["precision"])
    if own and tp["precision_utilization_pct"] != _pct_of(achieved, own):
        out.append(f"{tp['precision']} utilisation {tp['precision_utilization_pct']}% is not "
                   f"{achieved} TFLOP/s of its {own} peak")
    if achieved > max(row.tflops.values()):
        out.append(f"{achieved} TFLOP/s beats every peak of {row.label}")
    return out


def _pct_of(tflops: float, peak: float) -> Any:
    """100 * tflops / peak, within the report's rounding (TFLOP/s and % to 3 decimals)."""
    return pytest.approx(100 * tflops / peak, rel=1e-3, abs=100 * 5e-4 / peak + 5e-4)


@pytest.mark.parametrize("trace", TRACES)
def test_no_kernel_computes_faster_than_its_pipe(trace):
    assert kernel_rate_violations(real_report(trace)) == []


@pytest.mark.parametrize("trace", TRACES)
def test_transform_convolutions_are_direct_equivalents_off_the_roofline(trace):
    assert transform_conv_violations(real_report(trace)) == []


@pytest.mark.parametrize("trace", TRACES)
def test_no_roofline_point_beats_its_compute_ceiling(trace):
    assert roofline_violations(real_report(trace)) == []


@pytest.mark.parametrize("trace", TRACES)
def test_mfu_is_against_the_bf16_peak_and_utilisation_against_its_own(trace):
    assert mfu_violations(real_report(trace)) == []


def test_the_fp32_resnet_runs_cudnn_fft_and_winograd_as_direct_equivalents():
    # the case issue 36 reported: without the basis these kernels read 70-110 TFLOP/s on an
    # FP32 pipe of 67; the checks above must have something to check
    rep = real_report("h200/resnet50_fp32.json.gz")
    equivalent = [k for k in rep["kernels"] if k["flops_basis"] == "direct_conv_equivalent"]
    names = " ".join(k["name"] for k in equivalent)
    assert "fft2d_r2c" in names and "cf32cf32" in names and "winograd" in names
    assert all(k["tflops"] is None and k["pct_of_sol"] is None for k in equivalent)
    # their FLOPs still count as model FLOPs: the FP32 and TF32 runs count the same work
    tf32 = real_report("h200/resnet50_tf32.json.gz")["throughput"]["flops_per_iteration"]
    assert rep["throughput"]["flops_per_iteration"] == pytest.approx(tf32, rel=1e-6)
    reasons = {e["reason"]: e["kernels"] for e in rep["roofline"]["left_out"]}
    assert sum(n for r, n in reasons.items() if "FFT/Winograd" in r) == len(equivalent)


def _with_kernel(report: dict[str, Any], **fields: Any) -> dict[str, Any]:
    bad = copy.deepcopy(report)
    row = copy.deepcopy(next(k for k in bad["kernels"] if k["flops_basis"] == "counted"))
    row.update(fields)
    bad["kernels"].append(row)
    return bad


def test_the_checks_bite_on_a_hand_made_violation():
    rep = real_report("h200/resnet50_fp32.json.gz")
    # an FP32 CUDA-core kernel at 135 TFLOP/s, as the Kernels view showed it
    fast = _with_kernel(rep, name="void fft2d_c2r_32x32<float>", category="conv",
                        uses_tensor_cores=False, precision="fp32", tflops=135.0)
    assert any("> 67.0 pipe peak" in v for v in kernel_rate_violations(fast))
    assert any("FFT/Winograd FLOPs counted" in v for v in transform_conv_violations(fast))
    plotted = _with_kernel(rep, flops_basis="direct_conv_equivalent", tflops=None,
                           pct_of_sol=50.0)
    assert any("on the roofline" in v for v in transform_conv_violations(plotted))
    assert any("a rate of" in v for v in kernel_rate_violations(
        _with_kernel(rep, flops_basis="direct_conv_equivalent")))
    over = copy.deepcopy(rep)
    point = over["roofline"]["points"][0]
    point.update(achieved_tflops=1e4, bound="compute", pct_of_sol=150.0)
    assert len(roofline_violations(over)) == 2
    # MFU against the FP32 peak, as it was: 38.6% for the FP32 run
    old = copy.deepcopy(rep)
    old["throughput"]["mfu_pct"] = old["throughput"]["precision_utilization_pct"]
    assert any("BF16 peak" in v for v in mfu_violations(old))


def _ladder_pairs() -> list[tuple[str, str]]:
    """Pairs of real traces of one model in one folder (a ladder's rungs: precision, layout,
    compile) whose counted FLOPs per iteration agree: the same work, done at different speeds."""
    by_model: dict[tuple[str, str], list[str]] = {}
    for t in TRACES:
        path = PurePosixPath(t)
        by_model.setdefault((str(path.parent), path.name.split("_")[0]), []).append(t)
    pairs = []
    for group in by_model.values():
        for a, b in combinations(group, 2):
            fa = real_report(a)["throughput"]["flops_per_iteration"]
            fb = real_report(b)["throughput"]["flops_per_iteration"]
            if fa and fb and abs(fa - fb) / fa * 100 <= SAME_WORK_PCT:
                pairs.append((a, b))
    return pairs


def test_mfu_rises_when_the_same_work_runs_faster():
    pairs = _ladder_pairs()
    # the FP32/TF32/AMP ResNet-50 and FP32/TF32/BF16 ViT ladders at least
    assert len(pairs) >= 6
    for a, b in pairs:
        ta, tb = real_report(a)["throughput"], real_report(b)["throughput"]
        if ta["iteration_ms"] == tb["iteration_ms"]:
            continue
        faster, slower = (ta, tb) if ta["iteration_ms"] < tb["iteration_ms"] else (tb, ta)
        assert faster["mfu_pct"] > slower["mfu_pct"], (a, b)


def test_compare_reads_a_higher_mfu_for_the_faster_bf16_run():
    # the issue: FP32 -> BF16 read "MFU 56.43% -> 4.22%" although B was 6x faster
    a = real_report("h200_ladders/vit_fp32.json.gz")
    b = real_report("h200_ladders/vit_bf16.json.gz")
    cmp = compare_reports(a, b)
    assert cmp["speedup"] > 1
    assert cmp["b"]["mfu_pct"] > cmp["a"]["mfu_pct"]
    # the utilisation of each run's own precision is kept, and says which precision
    assert (cmp["a"]["precision"], cmp["b"]["precision"]) == ("fp32", "bf16")
    assert cmp["a"]["precision_utilization_pct"] > cmp["b"]["precision_utilization_pct"]


def window_violations(report: dict[str, Any]) -> list[str]:
    """What the iteration chart needs to mark the profiled window with the report's own
    figures (frontend DashboardView: a band over ``iterations.range`` labelled with the
    report's median, and the report's per-step times drawn beside the hook's): a range that
    holds every analysed step, and a positive time for each."""
    it = report["iterations"]
    out = []
    items = it["items"]
    if len(items) != it["count"]:
        out.append(f"{len(items)} per-step items for {it['count']} iterations")
    out += [f"step {x.get('step')}: no positive wall time" for x in items
            if not (x.get("wall_ms") or 0) > 0]
    if it.get("range_kind") == "step" and it.get("range"):
        lo, hi = it["range"]
        out += [f"step {x['step']} outside the window {lo}-{hi}" for x in items
                if x.get("step") is not None and not lo <= x["step"] <= hi]
        steps = [x["step"] for x in items if x.get("step") is not None]
        if steps and (steps[0], steps[-1]) != (lo, hi):
            out.append(f"the window {lo}-{hi} is not its first and last step")
    walls = sorted(x["wall_ms"] for x in items if x.get("wall_ms"))
    if walls and not walls[0] <= it["median_ms"] <= walls[-1]:
        out.append(f"median {it['median_ms']} outside the steps' {walls[0]}-{walls[-1]} ms")
    return out


@pytest.mark.parametrize("trace", TRACES)
def test_the_window_the_chart_marks_is_the_reports(trace):
    assert window_violations(real_report(trace)) == []


def test_the_window_check_bites():
    rep = copy.deepcopy(real_report("h200/resnet50_fp32.json.gz"))
    assert rep["iterations"]["range_kind"] == "step"
    rep["iterations"]["range"][1] -= 1  # a band one step short of the window
    rep["iterations"]["items"][0]["wall_ms"] = 0.0
    assert len(window_violations(rep)) == 3
