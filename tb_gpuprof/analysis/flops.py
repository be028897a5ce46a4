"""FLOPs of framework ops from their recorded input shapes (PyProf-style formulas).

torch.profiler's ``with_flops`` output is not present in every trace (torch 2.11 Kineto traces
carry none), so the math ops that dominate training are counted from ``Input Dims`` and
``Concrete Inputs`` (stride, padding, dilation, groups, output mask). A multiply-add counts as
2 FLOPs. Anything not derivable returns None: never a guess.
"""

from __future__ import annotations

import ast
from math import prod
from typing import Any

from ..model import CpuOp

# Where stride/padding/dilation/groups sit in each conv op's argument list.
_CONV_ARGS = {
    "aten::conv1d": (3, 4, 5, 6), "aten::conv2d": (3, 4, 5, 6), "aten::conv3d": (3, 4, 5, 6),
    "aten::convolution": (3, 4, 5, 8), "aten::_convolution": (3, 4, 5, 8),
    "aten::cudnn_convolution": (3, 2, 4, 5),  # (input, weight, padding, stride, dilation, groups)
}


def _ints(text: Any, n: int) -> list[int] | None:
    if isinstance(text, list):
        vals = text
    else:
        if not isinstance(text, str) or not text:
            return None
        try:
            vals = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
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
        elif name.startswith("aten::_scaled_dot_product") or \
                name == "aten::scaled_dot_product_attention":
            q, k = shapes[0], shapes[1]
            if len(q) == 4 and len(k) == 4:
                fwd = 4.0 * q[0] * q[1] * q[2] * k[2] * q[3]  # QK^T and PV
                return fwd * 2 if "backward" in name else fwd
    except (TypeError, IndexError):
        return None
    return None
