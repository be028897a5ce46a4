"""Model FLOPs throughput and MFU from a report: the ``throughput`` section (docs/metrics.md).

FLOPs are what the report's kernels carry (counted from op shapes in flops.py: matmul, conv,
attention), per iteration of the window. Achieved TFLOP/s divide them by the iteration time
measured outside the profiler when the report knows it (``iterations.unprofiled_median_ms``),
else by the window's median. MFU is that over the GPU's dense BF16 Tensor Core peak whatever
the run's precision (peaks.mfu_reference_peak: PaLM's, Megatron's and torchtitan's convention,
so MFU rises when a run gets faster), unless the caller passes its own peak; the utilisation
of the precision the run computes in (over that precision's peak) is a second figure. Peaks
come from the table in peaks.py (NVIDIA datasheets, cited in docs/roofline.md). Pure functions
of the report; imports no framework.
"""

from __future__ import annotations

from typing import Any

from .classify import is_math_helper
from .live_throughput import section_scalars  # the per-iteration scalars, a leaf module
from .peaks import GPU_PEAKS, mfu_reference_peak, peak_for

# (label, name pattern, {precision: dense TFLOP/s}) per GPU: a view of the one table in
# peaks.py (MFU and the roofline read the same numbers).
PEAK_TFLOPS: tuple[tuple[str, str, dict[str, float]], ...] = tuple(
    (row.label, row.pattern, row.tflops) for row in GPU_PEAKS)

# Kernel precisions as the peak table names them; TF32 kernels are reported as "fp32" by
# some classifiers when the name does not say, and run at the TF32 rate on Tensor Cores.
_PRECISIONS = ("fp8", "bf16", "fp16", "tf32", "fp32")
_AUTOCAST = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "mixed_bfloat16": "bf16",
             "mixed_float16": "fp16"}


def _kernel_precision(k: dict[str, Any]) -> str | None:
    p = k.get("precision")
    if p == "fp32" and k.get("uses_tensor_cores"):
        return "tf32"
    return p if p in _PRECISIONS else None


def compute_precision(report: dict[str, Any]) -> tuple[str | None, str]:
    """The precision most of the counted FLOPs ran in, and how that was decided.

    By FLOPs of the kernels that carry them; else by math GPU time (``precision_us``); else
    from the recorded flags (autocast dtype, TF32 switches).
    """
    by_flops: dict[str, float] = {}
    for k in report.get("kernels") or ():
        p = _kernel_precision(k)
        if p and k.get("flops"):
            by_flops[p] = by_flops.get(p, 0.0) + k["flops"]
    if by_flops:
        return max(by_flops, key=lambda p: by_flops[p]), "kernel_flops"
    by_time = {p: us for p, us in (report.get("precision_us") or {}).items() if p in _PRECISIONS}
    if by_time:
        return max(by_time, key=lambda p: by_time[p]), "precision_us"
    flags = (report.get("system") or {}).get("flags") or {}
    policy = flags.get("autocast") or flags.get("mixed_precision_policy")
    if policy in _AUTOCAST:
        return _AUTOCAST[policy], "flags"
    if flags.get("allow_tf32_matmul") or flags.get("tf32_enabled"):
        return "tf32", "flags"
    if flags:
        return "fp32", "flags"
    return None, "unknown"


def _flops_per_iteration(report: dict[str, Any]) -> tuple[float | None, dict[str, float],
                                                            float | None]:
    """(FLOPs per iteration, per kernel category, % of math-kernel time whose FLOPs counted)."""
    n = max(int((report.get("iterations") or {}).get("count") or 0), 1)
    total = 0.0
    by_cat: dict[str, float] = {}
    math_us = counted_us = 0.0
    for k in report.get("kernels") or ():
        f = k.get("flops") or 0.0
        # setup/epilogue kernels of GEMM and attention libraries do none of the math
        if k.get("category") in ("gemm", "conv", "attention") and not is_math_helper(k["name"]):
            math_us += k.get("total_us") or 0.0
            if f:
                counted_us += k.get("total_us") or 0.0
        if f:
            total += f
            cat = k.get("category") or "other"
            by_cat[cat] = by_cat.get(cat, 0.0) + f / n
    coverage = round(100.0 * counted_us / math_us, 1) if math_us > 0 else None
    return (total / n if total > 0 else None), by_cat, coverage


def throughput_section(report: dict[str, Any], *,
                       peak_tflops: float | None = None) -> dict[str, Any]:
    """The report's ``throughput`` section (docs/report-schema.md)."""
    flops, by_cat, coverage = _flops_per_iteration(report)
    it = report.get("iterations") or {}
    unprofiled = it.get("unprofiled_median_ms")
    if unprofiled:
        iter_ms, time_source = float(unprofiled), "unprofiled_median_ms"
    else:
        iter_ms, time_source = float(it.get("median_ms") or 0.0), "window_median_ms"
    precision, precision_source = compute_precision(report)
    gpu_name = (report.get("system") or {}).get("gpu_name")
    peak: float | None
    peak_precision: str | None
    if peak_tflops is not None:
        peak, peak_precision, peak_source = float(peak_tflops), None, "peak_tflops argument"
    else:
        peak, peak_precision, peak_source = mfu_reference_peak(gpu_name)
    precision_peak, precision_peak_source = peak_for(gpu_name, precision)
    achieved = flops / (iter_ms * 1e-3) / 1e12 if flops and iter_ms > 0 else None
    return {
        "flops_per_iteration": round(flops, 1) if flops else None,
        "flops_by_category": {c: round(v, 1) for c, v in sorted(by_cat.items())},
        "math_time_counted_pct": coverage,
        "iteration_ms": round(iter_ms, 4) if iter_ms else None,
        "time_source": time_source,
        "achieved_tflops": round(achieved, 3) if achieved is not None else None,
        "precision": precision,
        "precision_source": precision_source,
        "peak_tflops": peak,
        "peak_precision": peak_precision,
        "peak_source": peak_source,
        "mfu_pct": _pct(achieved, peak),
        "precision_peak_tflops": precision_peak,
        "precision_peak_source": precision_peak_source,
        "precision_utilization_pct": _pct(achieved, precision_peak),
    }


def _pct(achieved: float | None, peak: float | None) -> float | None:
    return round(100.0 * achieved / peak, 3) if achieved is not None and peak else None


def throughput_scalars(report: dict[str, Any], iteration_ms: float) -> dict[str, float]:
    """``gpuprof/model_tflops`` and ``gpuprof/mfu_pct`` for one iteration after a window
    (live_throughput.section_scalars), computing the section when the report has none."""
    section = report.get("throughput")
    return section_scalars(section if section is not None else throughput_section(report),
                           iteration_ms)


__all__ = ["PEAK_TFLOPS", "compute_precision", "peak_for", "throughput_scalars",
           "throughput_section"]
