"""FLOPs of framework ops from their recorded input shapes (PyProf-style formulas).

torch.profiler's ``with_flops`` output is not present in every trace (torch 2.11 Kineto traces
carry none), so the math ops that dominate training are counted from ``Input Dims`` and
``Concrete Inputs`` (stride, padding, dilation, groups, output mask). A multiply-add counts as
2 FLOPs. Anything not derivable returns None: never a guess.
"""

from __future__ import annotations

import ast
import functools
from math import prod
from typing import Any

from ..model import CpuOp

# Where stride/padding/dilation/groups sit in each conv op's argument list.
_CONV_ARGS = {
    "aten::conv1d": (3, 4, 5, 6), "aten::conv2d": (3, 4, 5, 6), "aten::conv3d": (3, 4, 5, 6),
    "aten::convolution": (3, 4, 5, 8), "aten::_convolution": (3, 4, 5, 8),
    "aten::cudnn_convolution": (3, 2, 4, 5),  # (input, weight, padding, stride, dilation, groups)
}


@functools.lru_cache(maxsize=4096)
def _literal(text: str) -> Any:
    """``text`` parsed as a Python literal, lists as tuples (the result is shared), or None.
    Cached: a trace repeats the same few argument strings in every iteration, and parsing
    each anew cost a third of the report's time on a 130 MB trace."""
    try:
        vals = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return tuple(vals) if isinstance(vals, list) else vals


def _ints(text: Any, n: int) -> list[int] | None:
    if isinstance(text, list):
        vals = text
    else:
        if not isinstance(text, str) or not text:
            return None
        vals = _literal(text)
    if isinstance(vals, int):
        return [vals] * n
    if isinstance(vals, (list, tuple)) and all(isinstance(v, int) for v in vals):
        vals = list(vals)
        return vals * n if len(vals) == 1 else vals
    return None


def _conv_core(x: list[int], w: list[int], stride: list[int], pad: list[int],
               dil: list[int]) -> int | None:
    """2 * N * K * (C/groups) * prod(kernel) * prod(output spatial)."""
    spatial = len(x) - 2
    if spatial < 1 or len(w) != len(x) or min(len(stride), len(pad), len(dil)) < spatial:
        return None
    out = 1
    for i in range(spatial):
        o = (x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
        if o <= 0:
            return None
        out *= o
    return 2 * x[0] * w[0] * w[1] * prod(w[2:]) * out


# Attention ops: (argument index of query, of key, whether the layout is [batch, seq, heads,
# dim] (the flash/efficient kernels' own ops) rather than SDPA's [batch, heads, seq, dim], index
# of the causal argument, whether that argument is a mask type (0 none, 1 causal from the top
# left, 2 from the bottom right) rather than a bool, backward). Signatures from PyTorch's
# native_functions.yaml; the math fallback (_scaled_dot_product_attention_math) runs bmm ops
# that are counted themselves (the innermost op with FLOPs wins), so it is not listed.
_ATTENTION: dict[str, tuple[int, int, bool, int, bool, bool]] = {
    "aten::scaled_dot_product_attention": (0, 1, False, 5, False, False),
    "aten::_scaled_dot_product_flash_attention": (0, 1, False, 4, False, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, 1, False, 4, False, False),
    "aten::_scaled_dot_product_efficient_attention": (0, 1, False, 6, False, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, 1, False, 6, False, False),
    "aten::_scaled_dot_product_fused_attention_overrideable": (0, 1, False, 5, False, False),
    "aten::_flash_attention_forward": (0, 1, True, 8, False, False),
    "aten::_efficient_attention_forward": (0, 1, True, 9, True, False),
    "aten::_cudnn_attention_forward": (0, 1, False, 10, False, False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 2, False, 11, False, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, 2, False, 7, False, True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 2, False, 11, False, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 2, False, 14, False, True),
    "aten::_flash_attention_backward": (1, 2, True, 11, False, True),
    "aten::_efficient_attention_backward": (1, 2, True, 14, True, True),
    "aten::_cudnn_attention_backward": (1, 2, False, 14, False, True),
}


def _causal(value: Any, mask_type: bool) -> str | None:
    """"top_left", "bottom_right" or None (no causal mask) from a recorded argument."""
    text = str(value).strip() if value is not None else ""
    if mask_type:
        return {"1": "top_left", "2": "bottom_right"}.get(text)
    return "top_left" if text == "True" else None


def causal_pairs(sq: int, sk: int, align: str | None) -> int:
    """Query-key pairs a causal mask keeps (all ``sq * sk`` without one).

    PyTorch's ``is_causal`` aligns the mask to the top left (query i sees keys 0..i); xformers'
    bottom-right type aligns the last query with the last key (query i sees 0..i + sk - sq).
    """
    if align is None:
        return sq * sk
    offset = 0 if align == "top_left" else sk - sq
    # query i keeps clamp(i + offset + 1, 0, sk) keys
    total = 0
    lo = max(0, -offset)  # first query that sees any key
    full = max(lo, min(sq, sk - offset))  # queries before this one see a partial row
    n = full - lo
    if n > 0:
        first = lo + offset + 1
        total += n * (2 * first + n - 1) // 2
    total += max(sq - full, 0) * sk
    return total


def _attention_flops(name: str, shapes: list[Any], concrete: list[Any] | None) -> float | None:
    """4 * batch * heads * kept (query, key) pairs * head dim for QK^T and PV; backward 2x.

    These are model FLOPs: FlashAttention's backward recomputes QK^T (5 matmuls, not 4), which
    is hardware work the model does not need, so it is not counted. A causal mask counts only
    the pairs it keeps, as the fused kernels skip the masked blocks.
    """
    qi, ki, bshd, ci, mask_type, backward = _ATTENTION[name]
    q, k = shapes[qi], shapes[ki]
    if len(q) != 4 or len(k) != 4:
        return None
    if bshd:
        batch, sq, heads, dim = q
        sk = k[1]
    else:
        batch, heads, sq, dim = q
        sk = k[2]
    align = _causal(concrete[ci], mask_type) if concrete and len(concrete) > ci else None
    fwd = 4.0 * batch * heads * dim * causal_pairs(sq, sk, align)
    return fwd * 2 if backward else fwd


def op_flops(op: CpuOp) -> float | None:
    if op.flops:
        return op.flops
    shapes = op.input_shapes
    name = op.name
    if not shapes:
        return None
    try:
        if name in ("aten::mm", "aten::addmm"):
            a, b = (shapes[0], shapes[1]) if name == "aten::mm" else (shapes[1], shapes[2])
            if len(a) == 2 and len(b) == 2:
                return 2.0 * a[0] * a[1] * b[1]
        elif name in ("aten::bmm", "aten::baddbmm"):
            a, b = (shapes[0], shapes[1]) if name == "aten::bmm" else (shapes[1], shapes[2])
            if len(a) == 3 and len(b) == 3:
                return 2.0 * a[0] * a[1] * a[2] * b[2]
        elif name == "aten::linear":
            x, w = shapes[0], shapes[1]
            if x and len(w) == 2:
                return 2.0 * prod(x[:-1]) * x[-1] * w[0]
        elif name in _CONV_ARGS:
            conc = op.concrete_inputs or []
            si, pi, di, _gi = _CONV_ARGS[name]
            x, w = shapes[0], shapes[1]
            n = len(x) - 2
            if len(conc) > max(si, pi, di):
                stride, pad, dil = _ints(conc[si], n), _ints(conc[pi], n), _ints(conc[di], n)
                if stride and pad and dil:
                    f = _conv_core(x, w, stride, pad, dil)
                    return float(f) if f else None
        elif name == "aten::convolution_backward":
            # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
            #  output_padding, groups, output_mask): dgrad and wgrad each cost one forward.
            gy, x, w = shapes[0], shapes[1], shapes[2]
            conc = op.concrete_inputs or []
            mask = conc[10] if len(conc) > 10 else "[True, True, False]"
            passes = sum(1 for v in str(mask).strip("[]").split(",")[:2] if "True" in v)
            if len(gy) >= 3 and len(w) == len(gy):
                fwd = 2 * gy[0] * w[0] * w[1] * prod(w[2:]) * prod(gy[2:])
                return float(fwd * passes) if passes else None
        elif name in _ATTENTION:
            return _attention_flops(name, shapes, op.concrete_inputs)
        elif name == "aten::_scaled_mm":  # FP8 GEMM: (mat_a [M, K], mat_b [K, N], ...)
            a, b = shapes[0], shapes[1]
            if len(a) == 2 and len(b) == 2:
                return 2.0 * a[0] * a[1] * b[1]
    except (TypeError, IndexError):
        return None
    return None


# The op names op_flops counts from shapes (keep in step with its branches): an op of any
# other name has FLOPs only when the trace recorded them (``op.flops``). Linking uses this to
# skip the call for the many ops that can have none.
SHAPE_COUNTED_OPS: frozenset[str] = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear",
     "aten::convolution_backward", "aten::_scaled_mm", *_CONV_ARGS, *_ATTENTION})
