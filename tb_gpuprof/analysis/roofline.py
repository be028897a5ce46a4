"""The roofline: each kernel's arithmetic intensity against its achieved FLOP/s, under the GPU's
ceilings (peaks.py), and its "% of speed of light" (docs/roofline.md).

Bytes come from the shapes and dtypes of the op that launched the kernel, the same op records
the FLOPs come from (flops.py): a GEMM reads A and B and writes C, a convolution reads its
input and weight and writes its output, an elementwise op reads its inputs and writes one
output. That is the least DRAM traffic the kernel can have (caches can only cut re-reads of
what it must touch once), so intensity is an upper bound and % of speed of light a lower
bound. Kernels whose op has no recorded shapes (XLA, compiled graphs, ``record_shapes=False``)
or no byte model are left out and counted by reason.

The speed of light of a kernel is the time it would take at the GPU's ceilings,
``max(FLOPs / peak FLOP/s, bytes / bandwidth)``; % of speed of light is that over its measured
time. Pure functions of the report and the profile; imports no framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from ..model import KERNEL, CpuOp, GpuActivity, Profile
from .flops import op_flops
from .intervals import segment_sums
from .linking import LaunchContext
from .peaks import GpuPeaks, gpu_peaks

TOP_POINTS = 50  # kernels plotted, by total time
MAX_LEFT_OUT_REASONS = 8

# Bytes per element of the dtypes Kineto records in "Input type".
DTYPE_BYTES = {"double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
               "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
               "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
               "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16}
_DTYPE_PRECISION = {"double": "fp64", "float": "fp32", "c10::Half": "fp16",
                    "c10::BFloat16": "bf16", "c10::Float8_e4m3fn": "fp8",
                    "c10::Float8_e5m2": "fp8", "signed char": "int8"}

_GEMM = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1),
         "aten::baddbmm": (1, 2), "aten::_scaled_mm": (0, 1)}
# Elementwise ops: one output element per broadcast input element, at least one FLOP each.
_POINTWISE = frozenset((
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "reciprocal", "pow", "sqrt", "rsqrt",
    "exp", "log", "log1p", "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "silu", "mish",
    "hardtanh", "leaky_relu", "elu", "softplus", "clamp", "clamp_min", "clamp_max",
    "threshold", "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward",
    "tanh_backward", "hardtanh_backward", "leaky_relu_backward", "where", "masked_fill",
    "addcmul", "addcdiv", "lerp", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_not", "sign", "square", "erf", "floor", "ceil", "round", "trunc", "fmod"))
# Normalisations: read their inputs, write an output the size of the first, >= 1 FLOP/element.
_NORMALIZE = frozenset((
    "native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "native_layer_norm",
    "native_group_norm", "_softmax", "_log_softmax", "native_batch_norm_backward",
    "cudnn_batch_norm_backward", "native_layer_norm_backward", "native_group_norm_backward",
    "_softmax_backward_data", "_log_softmax_backward_data", "_fused_rms_norm"))
# Reductions: read the input (the small output is not counted), >= 1 FLOP per input element.
_REDUCE = frozenset(("sum", "mean", "amax", "amin", "norm", "linalg_vector_norm", "prod"))
# Pure data movement: no FLOPs, so never plotted; their bytes still give a % of speed of light.
_MOVE = {"copy_": "src_to_self", "fill_": "self", "zero_": "self"}


def _tensors(op: CpuOp) -> list[tuple[list[int], int]] | None:
    """(shape, bytes per element) of each tensor input; None when a dtype is unknown."""
    shapes, types = op.input_shapes or [], op.input_types or []
    out = []
    for i, shape in enumerate(shapes):
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            continue  # scalars, lists, 0-d tensors (their few bytes do not matter)
        size = DTYPE_BYTES.get(types[i]) if i < len(types) else None
        if size is None:
            return None
        out.append((shape, size))
    return out


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(1, rank + 1):
        dims = {s[-i] for s in shapes if len(s) >= i} - {1}
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return out[::-1]


def _math_bytes(op: CpuOp, flops: float, ts: list[tuple[list[int], int]]) -> float | None:
    """Least traffic of a GEMM, convolution or attention op: operands read, result written."""
    name, shapes = op.name, op.input_shapes or []
    read = sum(prod(s) * b for s, b in ts)
    if name in _GEMM or name == "aten::linear":
        a_i, b_i = _GEMM.get(name, (0, 1))
        a, b = shapes[a_i], shapes[b_i]
        n = b[0] if name == "aten::linear" else b[-1]  # linear's weight is [out, in]
        return read + prod(a[:-1]) * n * ts[0][1]
    if name == "aten::convolution_backward":
        # (grad_output, input, weight, ...): reads all three, writes the input and weight
        # gradients its output mask asks for.
        conc = op.concrete_inputs or []
        mask = str(conc[10] if len(conc) > 10 else "[True, True, False]").strip("[]").split(",")
        x, w = ts[1], ts[2]
        writes = (prod(x[0]) * x[1] if "True" in mask[0] else 0) + \
                 (prod(w[0]) * w[1] if len(mask) > 1 and "True" in mask[1] else 0)
        return read + writes
    if "conv" in name:
        # FLOPs = 2 * output elements * (C/groups * kernel volume) = 2 * out * prod(w[1:])
        w = shapes[1]
        return read + flops / (2 * prod(w[1:])) * ts[0][1]
    if "attention" in name:
        if "backward" in name:  # (grad_out, Q, K, V, ...): writes dQ, dK, dV
            return read + sum(prod(s) * b for s, b in ts[1:4])
        return read + prod(ts[0][0]) * ts[0][1]  # writes O, the shape of Q
    return None


def op_traffic(op: CpuOp) -> tuple[float, float] | str:
    """(least bytes moved, FLOPs) of one op, or why there are none.

    FLOPs are flops.py's count for math ops; elementwise, normalisation and reduction ops
    count one FLOP per element (a lower bound), copies and fills none.
    """
    ts = _tensors(op)
    if ts is None:
        return f"{op.name}: an input dtype of unknown size"
    if not ts:
        return "op recorded without tensor shapes"
    flops = op_flops(op)
    if flops:
        try:
            b = _math_bytes(op, flops, ts)
        except (IndexError, TypeError, ZeroDivisionError):  # shapes not as the op's signature
            b = None
        return (b, flops) if b else f"no byte model for {op.name}"
    base = op.name.removeprefix("aten::")
    stem = base.rstrip("_")
    read = sum(prod(s) * b for s, b in ts)
    if stem in _POINTWISE:
        out = ts[0][0] if base.endswith("_") else _broadcast([s for s, _ in ts])
        if out is None:
            return f"{op.name}: shapes do not broadcast"
        elems = prod(out)
        return read + elems * ts[0][1], float(elems)
    if stem in _NORMALIZE:
        return read + prod(ts[0][0]) * ts[0][1], float(prod(ts[0][0]))
    if stem in _REDUCE:
        return read, float(prod(ts[0][0]))
    move = _MOVE.get(base)
    if move == "self":
        return prod(ts[0][0]) * ts[0][1], 0.0
    if move == "src_to_self" and len(ts) >= 2:
        return prod(ts[0][0]) * ts[0][1] + prod(ts[1][0]) * ts[1][1], 0.0
    if not op.name.startswith("aten::"):
        return "no byte model for fused or custom ops (Inductor/Triton, extensions)"
    return f"no byte model for {op.name}"


def _op_precision(op: CpuOp) -> str | None:
    for t in op.input_types or ():
        p = _DTYPE_PRECISION.get(t)
        if p:
            return p
    return None


class _Tally:
    """One kernel's bytes and FLOPs as the activities of the window add them up."""

    __slots__ = ("bytes", "covered_us", "flops", "precision", "reasons")

    def __init__(self) -> None:
        self.bytes = 0.0
        self.flops = 0.0  # only for kernels whose op FLOPs the report does not carry
        self.covered_us = 0.0
        self.precision: str | None = None
        self.reasons: dict[str, float] = {}  # why some of its time has no bytes -> that time

    def miss(self, reason: str, dur: float) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0.0) + dur


def _signature(op: CpuOp) -> tuple:
    """What op_traffic, op_flops and _op_precision read of an op. The Kineto reader shares one
    list between ops with the same shapes (types, arguments), so ops of one layer in every
    iteration share a signature; the lists live as long as the ops, so their ids stay theirs."""
    return (op.name, id(op.input_shapes), id(op.input_types), id(op.concrete_inputs), op.flops)


def _no_op_reason(profile: Profile) -> str:
    if profile.format == "xplane":
        return "no op shapes in the trace (XLA names the HLO op, not its shapes)"
    return "launched outside any recorded op (compiled graph, CUDA graph, raw CUDA)"


class Activities(NamedTuple):
    """The window's activities as the tally made them (stages.Tally.activities), in its
    order: per activity its row in ``rows`` (the kernel table's rows), its duration, and the
    op whose FLOPs it shares and the op that launched it (-1: none, or no launch)."""

    rows: list[dict[str, Any]]
    row: np.ndarray
    dur: np.ndarray
    flop_op: np.ndarray
    launch_op: np.ndarray


def kernel_traffic(report: dict[str, Any], profile: Profile,
                   per_window: list[list[tuple[GpuActivity, LaunchContext | None]]],
                   flops_of_ops: Mapping[int, float],
                   activities: Activities | None = None) -> dict[str, _Tally]:
    """Bytes (and elementwise FLOPs) per kernel name, from the ops that launched its runs.

    An op's traffic is split over the kernels it launched by their time, as its FLOPs are
    (report.py): a GEMM op over its math kernels, an elementwise op over what it launched.
    ``flops_of_ops``: linking's FLOPs of the ops launches ran under (``Linked.op_flops``:
    every op that launched a kernel is there when it has FLOPs).

    In columns, with the order of additions of a loop over the activities (the reference in
    tests/test_analysis_fastpaths.py): first each activity
    in turn (collectives, launches outside ops, setup kernels of GEMM/conv ops), then each
    op in order of its first activity, its activities in turn.
    """
    kernels = [k for k in report["kernels"] if k["kind"] == KERNEL]
    tallies = {k["name"]: _Tally() for k in kernels}
    t_list = list(tallies.values())
    code_of = {k["name"]: i for i, k in enumerate(kernels)}
    is_comm = np.array([k["category"] == "communication" for k in kernels] + [False])
    has_flops = np.array([bool(k["flops"]) for k in kernels] + [False])
    code, dur, flop_op, launch_op = (_columns(per_window, code_of) if activities is None
                                     else _tally_columns(activities, code_of))
    n = len(code)
    math = has_flops[code] & (flop_op >= 0)  # code -1: the False appended
    op_idx = np.where(math, flop_op, launch_op)
    reasons = [_COMM, _no_op_reason(profile), _SETUP]
    miss = np.full(n, -1, np.int64)  # the reason each activity misses for, in this first pass
    miss[(op_idx < 0)] = 1
    setup = (~math & (op_idx >= 0))
    setup[setup] = np.fromiter(map(flops_of_ops.__contains__, op_idx[setup].tolist()), bool,
                               int(setup.sum()))
    miss[setup] = 2
    miss[is_comm[code]] = 0
    miss[code < 0] = -1
    grouped = (code >= 0) & (miss < 0)
    misses = [(code[miss >= 0], miss[miss >= 0], dur[miss >= 0])]
    _add_ops(profile, op_idx[grouped], code[grouped], dur[grouped], t_list, reasons, misses)
    _add_misses(misses, t_list, reasons)
    return tallies


_DUR_US = attrgetter("dur_us")
_Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _columns(per_window: list[list[tuple[GpuActivity, LaunchContext | None]]],
             code_of: dict[str, int]) -> _Columns:
    """Per activity its kernel's code in ``code_of`` (-1: not a kernel of the table), its
    duration, and the op whose FLOPs it shares and the op that launched it (-1: none)."""
    acts = [a for w in per_window for a, _ in w]
    ctxs = [c for w in per_window for _, c in w]
    n = len(acts)
    code = np.fromiter((code_of.get(a.name, -1) if a.kind == KERNEL else -1 for a in acts),
                       np.int64, n)
    dur = np.fromiter(map(_DUR_US, acts), np.float64, n)
    flop_op = np.fromiter((-1 if c is None or c.flop_op is None else c.flop_op
                           for c in ctxs), np.int64, n)
    launch_op = np.fromiter((-1 if c is None or c.launch_op is None else c.launch_op
                             for c in ctxs), np.int64, n)
    return code, dur, flop_op, launch_op


def _tally_columns(activities: Activities, code_of: dict[str, int]) -> _Columns:
    """:func:`_columns` from the tally's: a row is made per (kind, name)."""
    row_code = np.array([code_of.get(r["name"], -1) if r["kind"] == KERNEL else -1
                         for r in activities.rows] + [-1], np.int64)
    return (row_code[activities.row], activities.dur, activities.flop_op,
            activities.launch_op)


_COMM = "communication (NCCL) kernel"
_SETUP = "layout or setup kernel inside a GEMM/conv op (not modelled)"


def _add_ops(profile: Profile, op_idx: np.ndarray, code: np.ndarray, dur: np.ndarray,
             t_list: list[_Tally], reasons: list[str],
             misses: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """Each op's traffic split over its activities by their time (ops in order of their
    first activity); an op without a byte model adds its reason to ``misses``."""
    if not len(op_idx):
        return
    ops, first, group = np.unique(op_idx, return_index=True, return_inverse=True)
    rank = np.empty(len(ops), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(ops))
    by_signature: dict[tuple, tuple[tuple[float, float] | str, str | None]] = {}
    nbytes = np.zeros(len(ops))
    flops = np.zeros(len(ops))
    reason = np.full(len(ops), -1, np.int64)
    precision: list[str | None] = []
    reason_code = {r: i for i, r in enumerate(reasons)}
    cpu_ops = profile.cpu_ops
    for g, i in enumerate(ops.tolist()):
        op = cpu_ops[i]
        key = _signature(op)
        known = by_signature.get(key)
        if known is None:
            known = by_signature[key] = (op_traffic(op), _op_precision(op))
        traffic, p = known
        precision.append(p)
        if isinstance(traffic, str):
            if traffic not in reason_code:
                reason_code[traffic] = len(reasons)
                reasons.append(traffic)
            reason[g] = reason_code[traffic]
        else:
            nbytes[g], flops[g] = traffic
    order = np.argsort(rank[group], kind="stable")  # op by op, each op's activities in turn
    group, code, dur = group[order], code[order], dur[order]
    failed = reason[group] >= 0
    misses.append((code[failed], reason[group][failed], dur[failed]))
    group, code, dur = group[~failed], code[~failed], dur[~failed]
    total = segment_sums(dur, group, len(ops))
    total = np.where(total == 0.0, 1.0, total)[group]  # sum(...) or 1.0
    share_bytes = segment_sums(nbytes[group] * dur / total, code, len(t_list)).tolist()
    share_flops = segment_sums(flops[group] * dur / total, code, len(t_list)).tolist()
    covered = segment_sums(dur, code, len(t_list)).tolist()
    firsts: dict[int, str] = {}  # per kernel the first precision its ops tell
    for c, g in zip(code.tolist(), group.tolist(), strict=True):
        if c not in firsts and precision[g]:
            firsts[c] = precision[g]
    # the kernels it touched, ascending (np.unique without indices imports numpy.ma: 20 ms)
    for c in np.flatnonzero(np.bincount(code, minlength=len(t_list))).tolist():
        t = t_list[c]
        t.bytes += share_bytes[c]
        t.flops += share_flops[c]
        t.covered_us += covered[c]
        t.precision = t.precision or firsts.get(c)


def _add_misses(misses: list[tuple[np.ndarray, np.ndarray, np.ndarray]], t_list: list[_Tally],
                reasons: list[str]) -> None:
    """The time each kernel misses, per reason, added in the order of ``misses``; a kernel's
    reasons in order of their first miss."""
    code = np.concatenate([m[0] for m in misses])
    if not len(code):
        return
    pair = code * len(reasons) + np.concatenate([m[1] for m in misses])
    dur = np.concatenate([m[2] for m in misses])
    pairs, first, at = np.unique(pair, return_index=True, return_inverse=True)
    sums = segment_sums(dur, at, len(pairs)).tolist()
    for i in np.argsort(first, kind="stable").tolist():
        c, r = divmod(int(pairs[i]), len(reasons))
        t_list[c].reasons[reasons[r]] = sums[i]


def ceiling_precision(kernel: dict[str, Any], data_precision: str | None) -> str | None:
    """The peak-table row a kernel's compute is bounded by: Tensor Core rates for kernels on
    Tensor Cores (FP32 data there runs as TF32), else the CUDA-core FP32 (or FP64) rate."""
    p = kernel.get("precision")
    if p not in ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"):
        p = data_precision
    if kernel.get("uses_tensor_cores"):
        return {"fp32": "tf32", "fp64": "fp64_tc"}.get(p or "", p)
    return "fp64" if p == "fp64" else "fp32"


def pipe_peak_tflops(kernel: dict[str, Any], row: GpuPeaks | None,
                     data_precision: str | None = None) -> float | None:
    """The most FLOP/s the pipe a kernel runs on can do: its ceiling_precision's peak, or for
    a Tensor Core kernel of a precision the table lacks, the Tensor Cores' fastest rate (no
    precision runs faster). None for a GPU not in the table."""
    if row is None:
        return None
    peak = row.peak(ceiling_precision(kernel, data_precision))
    if peak is None and kernel.get("uses_tensor_cores"):
        peak = max((v for p, v in row.tflops.items() if p not in ("fp32", "fp64")), default=None)
    return peak


def over_pipe_peak(kernel: dict[str, Any], row: GpuPeaks | None,
                   data_precision: str | None = None) -> bool:
    """Whether a kernel's counted FLOPs over its time beat the peak of the pipe it runs on:
    then they are not the work it did (a transform convolution, or FLOPs of its op that
    another kernel did)."""
    peak = pipe_peak_tflops(kernel, row, data_precision)
    flops, us = kernel.get("flops"), kernel.get("total_us")
    return bool(peak and flops and us and flops / (us * 1e6) > peak)


def speed_of_light(flops: float, nbytes: float, time_us: float, peak_tflops: float | None,
                   hbm_gbps: float | None) -> dict[str, Any] | None:
    """Intensity, achieved and attainable TFLOP/s, % of speed of light and the bound."""
    t_compute = flops / (peak_tflops * 1e12) if flops and peak_tflops else 0.0
    t_memory = nbytes / (hbm_gbps * 1e9) if nbytes and hbm_gbps else 0.0
    if time_us <= 0 or (t_compute == 0.0 and t_memory == 0.0):
        return None
    intensity = flops / nbytes if nbytes else None
    roofs = [r for r in (peak_tflops, intensity * hbm_gbps / 1e3 if intensity is not None
                         and hbm_gbps else None) if r]
    return {
        "intensity": intensity,
        "achieved_tflops": flops / (time_us * 1e6),
        "ceiling_tflops": min(roofs) if roofs and flops else None,
        "pct_of_sol": 100.0 * max(t_compute, t_memory) / (time_us * 1e-6),
        "bound": "compute" if t_compute >= t_memory else "memory",
    }


def _point(k: dict[str, Any], t: _Tally, flops: float, ceiling: str | None,
           sol: dict[str, Any]) -> dict[str, Any]:
    return {"name": k["name"], "demangled": k["demangled"], "time_us": k["total_us"],
            "count": k["count"], "precision": t.precision if k["precision"] == "unknown"
            else k["precision"], "ceiling": ceiling, "category": k["category"],
            "flops": round(flops, 1), "bytes": round(t.bytes, 1),
            "intensity": _sig(sol["intensity"]), "achieved_tflops": _sig(sol["achieved_tflops"]),
            "ceiling_tflops": _sig(sol["ceiling_tflops"]) if sol["ceiling_tflops"] else None,
            "pct_of_sol": _sig(sol["pct_of_sol"]), "bound": sol["bound"]}


def _sig(v: float, digits: int = 5) -> float:
    """Rounded to significant digits: a tiny kernel's TFLOP/s must not round to 0 (log axes)."""
    return float(f"{v:.{digits}g}")


def _over_ceiling_why(point: dict[str, Any]) -> str:
    """Why a kernel beat the speed of light: said, never clipped. (Kernels whose FLOPs beat
    their pipe's peak are not plotted: _uncounted_reason.)"""
    if point["bound"] == "memory":
        return ("faster than DRAM allows for the bytes counted: the data was in L2 (written "
                "just before or re-read), or the byte model over-counts")
    return "faster than the compute peak: the FLOP count or the peak table is wrong for it"


_TRANSFORM_CONV_REASON = ("FFT/Winograd convolution: its FLOPs are the direct convolution's "
                          "equivalent, not the work it does")
_OVER_PEAK_REASON = ("FLOPs of its op above the peak of the pipe it runs on: not the work it "
                     "did (the split of the op's FLOPs over its kernels, or the pipe, is wrong)")


def _uncounted_reason(k: dict[str, Any], row: GpuPeaks | None,
                      data_precision: str | None) -> str | None:
    """Why a kernel's FLOPs are not its work (then its row loses ``tflops``), or None.

    A convolution's kernel that computes faster than its pipe's peak can only have done fewer
    multiply-adds than the direct convolution counted: a transform algorithm whose name does
    not say so. Any other kernel over the peak has FLOPs of its op it did not do.
    """
    if k.get("flops_basis") == "counted" and over_pipe_peak(k, row, data_precision):
        conv = k["category"] == "conv" or any("conv" in op.lower() for op in k.get("ops") or ())
        k["flops_basis"] = "direct_conv_equivalent" if conv else "over_pipe_peak"
        k["tflops"] = None
    basis = k.get("flops_basis")
    if basis == "direct_conv_equivalent":
        return _TRANSFORM_CONV_REASON
    return _OVER_PEAK_REASON if basis == "over_pipe_peak" else None


def _ceilings(row: GpuPeaks | None, gpu_name: str | None) -> tuple[dict[str, Any] | None, str]:
    if row is None:
        why = f"{gpu_name!r} is not in the peak table" if gpu_name else "the GPU is unknown"
        return None, f"{why}: no ceilings, no % of speed of light"
    return ({"gpu": row.label, "hbm_gbps": row.hbm_gbps, "memory": row.memory,
             "tflops": dict(row.tflops)}, f"{row.label} datasheet (dense peaks)")


def _leave_out(left_out: dict[str, list[float]], reason: str, k: dict[str, Any]) -> None:
    entry = left_out.setdefault(reason, [0, 0.0])  # [kernels, time]
    entry[0] += 1
    entry[1] += k["total_us"]


def roofline_section(report: dict[str, Any], profile: Profile,
                     per_window: list[list[tuple[GpuActivity, LaunchContext | None]]],
                     flops_of_ops: Mapping[int, float],
                     activities: Activities | None = None) -> dict[str, Any]:
    """The report's ``roofline`` section; sets ``pct_of_sol`` on every kernel of the report
    (``flops_of_ops``: ``Linked.op_flops``; ``activities``: the tally's columns of
    ``per_window``, not read again)."""
    gpu_name = (report.get("system") or {}).get("gpu_name")
    row = gpu_peaks(gpu_name)
    ceilings, source = _ceilings(row, gpu_name)
    tallies = kernel_traffic(report, profile, per_window, flops_of_ops, activities)
    plotted: list[dict[str, Any]] = []
    left_out: dict[str, list[float]] = {}  # reason -> [kernels, time]
    kernels_total = 0
    for k in report["kernels"]:
        k["pct_of_sol"] = None
        if k["kind"] != KERNEL:
            continue
        kernels_total += 1
        t = tallies[k["name"]]
        uncounted = _uncounted_reason(k, row, t.precision)
        if uncounted:  # FLOPs that are not the kernel's work: no speed of light from them
            _leave_out(left_out, uncounted, k)
            continue
        flops = float(k["flops"] or t.flops)
        ceiling = ceiling_precision(k, t.precision)
        sol = speed_of_light(flops, t.bytes, k["total_us"], row.peak(ceiling) if row else None,
                             row.hbm_gbps if row else None)
        if sol is not None:
            k["pct_of_sol"] = _sig(sol["pct_of_sol"])
        if flops > 0 and t.bytes > 0 and sol is not None:
            plotted.append(_point(k, t, flops, ceiling, sol))
        elif t.reasons:
            _leave_out(left_out, max(t.reasons, key=lambda r: t.reasons[r]), k)
        else:
            _leave_out(left_out, "data movement only (no FLOPs to plot)" if t.bytes > 0
                       else source, k)
    over = [{"name": p["name"], "pct_of_sol": p["pct_of_sol"], "why": _over_ceiling_why(p)}
            for p in plotted if p["pct_of_sol"] > 100.0]
    return {
        "gpu_name": gpu_name, "ceilings": ceilings, "ceilings_source": source,
        "kernels_total": kernels_total, "kernels_plotted": len(plotted),
        "points": plotted[:TOP_POINTS],
        "left_out": [{"reason": r, "kernels": int(n), "time_us": round(us, 3)}
                     for r, (n, us) in sorted(left_out.items(), key=lambda kv: -kv[1][1])
                     ][:MAX_LEFT_OUT_REASONS],
        "over_ceiling": over,
    }
