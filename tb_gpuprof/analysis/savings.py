"""Each recommendation's estimated saving, from re-timing the window with its fix applied.

A rule says *what* to change; this module says *how much* it buys, by replaying the window
(:mod:`whatif`) with the fix's effect on the kernels and host segments it touches. The range
comes from the low and high ends of the speed-up table. Severity then follows the saving.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from .rules.build import SEVERITY_ORDER, by_saving
from .whatif import PINNED_H2D_BYTES_PER_US, SPEEDUPS, Fix, Replay, SimKernel, predicted_ms

MATH = ("gemm", "conv", "attention")
HALF = ("fp16", "bf16", "fp8")
MEMORY_BOUND = ("norm", "elementwise", "reduction")
SEVERITY_HIGH_PCT = 20.0
SEVERITY_MEDIUM_PCT = 5.0
# A fix predicted to save less than this share of the iteration is not advice: run-to-run
# spread of the un-profiled iteration on the H200 loops is larger (docs/recommendations.md).
MIN_SAVING_PCT = 0.5
RANGE_MIN_WIDTH_PCT = 1.0  # ranges are printed in whole percent
REMOVED = 1e9  # a kernel the fix removes runs this many times faster


def _f(name: str, variant: int) -> float:
    return SPEEDUPS[name][variant]


def _math_cat(k: SimKernel) -> str:
    return k.category if k.category in ("gemm", "conv") else "gemm"


def _fp32_simt(k: SimKernel) -> bool:
    return (not k.uses_tc and k.precision == "fp32" and k.eligible
            and k.category in (*MATH, "other"))


def fix_tf32(v: int) -> Fix:
    def factor(k: SimKernel) -> float:
        return _f(f"fp32_to_tf32_{_math_cat(k)}", v) if _fp32_simt(k) else 1.0
    return Fix(kernel_factor=factor, by_class=True)


def fix_amp(v: int, unknown_is_fp32: bool = False) -> Fix:
    """AMP on top of TF32: FP32 math is counted from TF32 speed (the ladder's order), so with
    TF32 off the estimate is what AMP adds after the ``tf32`` fix (see :func:`retime`).

    ``unknown_is_fp32``: no kernel of the window runs in half precision, so kernels whose
    names carry no dtype (XLA's fusions) run in FP32 like everything else."""
    def factor(k: SimKernel) -> float:
        half = "tf32_to_half_" + (k.category if k.category in MATH else "gemm")
        # FP32 math on Tensor Cores (e.g. memory-efficient attention's TF32 MMA) is TF32
        if (k.uses_tc and k.precision in ("tf32", "fp32") and k.category in MATH) or \
                _fp32_simt(k):
            return _f(half, v)
        fp32 = k.precision == "fp32" or (unknown_is_fp32 and k.precision == "unknown")
        if fp32 and k.category == "norm":
            return _f("memory_half_norm", v)
        if fp32 and k.category in ("elementwise", "reduction"):
            return _f("memory_half_elementwise", v)
        return 1.0
    return Fix(kernel_factor=factor, framework_rate=1.0 / _f("amp_dispatch", v),
               by_class=True)


def fix_channels_last(v: int) -> Fix:
    def factor(k: SimKernel) -> float:
        if k.category == "layout":
            return REMOVED
        half = k.precision in ("fp16", "bf16")  # where the factor was measured
        if half and (k.category == "norm" or "pool" in k.act.name.lower()):
            return _f("nchw_to_nhwc_norm", v)
        if k.category == "conv" and k.precision in ("fp16", "bf16"):
            return _f("nchw_to_nhwc_half_conv", v)
        return 1.0
    return Fix(kernel_factor=factor, by_class=True)


def fix_compile(v: int, compilable: float = 1.0) -> Fix:
    """``compilable``: the share of the work torch.compile can capture (graph breaks,
    analysis/rules/trace.py): fusion and cheaper dispatch apply to that share only."""
    fusion, rate = _f("fusion_small_kernels", v), 1.0 / _f("compile_dispatch", v)
    if compilable < 1.0:
        fusion = 1.0 + max(compilable, 0.0) * (fusion - 1.0)
        rate = 1.0 - max(compilable, 0.0) * (1.0 - rate)

    def factor(k: SimKernel) -> float:
        return fusion if k.category in MEMORY_BOUND else 1.0
    return Fix(kernel_factor=factor, framework_rate=rate, by_class=True)


def fix_input_pipeline(v: int) -> Fix:
    return Fix(outside_rate=0.0, data_rate=0.0)


def fix_pinned_memory(v: int) -> Fix:
    def factor(k: SimKernel) -> float:
        a = k.act
        if a.kind != "kernel" and "Pageable" in a.name and ("HtoD" in a.name or "H2D" in a.name):
            pinned_us = (a.bytes or 0) / PINNED_H2D_BYTES_PER_US
            return a.dur_us / pinned_us if pinned_us > 0 else 1.0
        return 1.0
    return Fix(kernel_factor=factor, copy_call_rate=0.0)


def fix_host_sync(v: int, branch_share: float = 0.0) -> Fix:
    """No host waits on the GPU. ``branch_share``: with syncs inside the forward (graph
    breaks), the share of the forward's dispatch where it branches on GPU values
    (bottleneck.branch_share): the fix vectorises those branches, so that dispatch falls by
    the ``vectorised_branch_dispatch`` factor, and the same share of the backward's (autograd
    replays the forward's per-branch ops)."""
    if branch_share <= 0.0:
        return Fix(syncs_wait=False)
    rate = 1.0 / _f("vectorised_branch_dispatch", v)
    share = min(branch_share, 1.0)
    return Fix(syncs_wait=False, branch_rate=rate, backward_rate=1.0 - share * (1.0 - rate))


def fix_dispatch_overhead(v: int) -> Fix:
    return Fix(framework_rate=1.0 / _f("compile_dispatch", v))


FIXES: dict[str, Callable[[int], Fix]] = {
    "tf32": fix_tf32, "amp": fix_amp, "channels_last": fix_channels_last,
    "compile": fix_compile, "input_pipeline": fix_input_pipeline,
    "pinned_memory": fix_pinned_memory, "host_sync": fix_host_sync,
    "dispatch_overhead": fix_dispatch_overhead,
}


def retime(recs: list[dict[str, Any]], replay: Replay | None, measured_ms: float,
           host_scale: float, basis: str) -> None:
    """Replace the rules' savings by re-timed ones (in place); :func:`finalize` then sets
    severity from them and drops what saves nothing."""
    ids = {r["id"] for r in recs}
    for rec in recs:
        build = FIXES.get(rec["id"])
        if build is None or replay is None or measured_ms <= 0:
            continue
        if rec["id"] == "amp":
            no_half = not any(k.precision in HALF for k in replay.kernels)
            build = partial(fix_amp, unknown_is_fp32=no_half)
        share = (rec.get("evidence") or {}).get("compilable_share")
        if rec["id"] == "compile" and share is not None:
            build = partial(fix_compile, compilable=float(share))
        branch = (rec.get("evidence") or {}).get("branch_share")
        if rec["id"] == "host_sync" and branch:
            build = partial(fix_host_sync, branch_share=float(branch))
        after = _counted_after(rec, ids)
        start = ([predicted_ms(replay, after(v), measured_ms, host_scale) for v in (0, 1, 2)]
                 if after else [measured_ms] * 3)
        typical, low, high = (predicted_ms(replay, build(v), measured_ms, host_scale,
                                           after(v) if after else None) for v in (0, 1, 2))
        bound = rec.get("removable_ms")
        cap = bound if bound is not None else float("inf")
        saving = min(max(start[0] - typical, 0.0), cap)
        pcts = sorted(100.0 * min(max(s0 - t, 0.0), cap) / measured_ms
                      for s0, t in ((start[1], low), (start[2], high)))
        rec["estimated_saving_ms"] = round(saving, 3)
        rec["estimated_saving_pct"] = round(100.0 * saving / measured_ms, 1)
        rec["estimated_range_pct"] = range_pct(pcts[0], pcts[1])
        rec["predicted_iteration_ms"] = round(start[0] - saving, 3)
        capped = bound is not None and max(start[0] - typical, 0.0) > bound
        rec["estimate_basis"] = (
            f"re-timed the window with the fix applied ({_what(rec['id'])}"
            + ("; the forward's per-branch dispatch and the backward's share vectorised"
               if rec["id"] == "host_sync" and branch else "") + "), on the "
            f"{basis} {measured_ms:.1f} ms iteration; the range uses the low and high "
            "speed-up factors"
            + (f"; capped at the {bound:.2f} ms of work the fix changes" if capped else "")
            + (f"; counted after `{_AFTER[rec['id']][0]}`" if after else ""))


# A fix whose estimate assumes another is applied first: its saving is what it adds after
# that one, and it is listed right after it. AMP is measured from TF32 speed (the ladder's
# order). torch.compile cannot capture a host sync inside the compiled forward (.item() ends
# its graph, CUDA graphs cannot hold one): with graph breaks, compile's gain comes after the
# syncs are gone. Syncs outside the model (loss.item(), gradient norms after the backward)
# break no graph: there compile is measured on its own (an H200 GPT-2 loop with ~77 such
# syncs a step: compile 1.33x, the syncs removed 0.94x, docs/recommendations.md).
_AFTER: dict[str, tuple[str, Callable[[int], Fix]]] = {
    "amp": ("tf32", fix_tf32), "compile": ("host_sync", fix_host_sync),
}


def _counted_after(rec: dict[str, Any], ids: set[str]) -> Callable[[int], Fix] | None:
    first = _AFTER.get(rec["id"])
    if first is None or first[0] not in ids:
        return None
    if rec["id"] == "compile" and not (rec.get("evidence") or {}).get("graph_breaks"):
        return None
    return first[1]


def range_pct(low: float, high: float) -> list[float] | None:
    """[low, high] when they differ at the precision a range is printed with (whole
    percent); a range narrower than one point prints as "75%–75%": one value, None."""
    return [round(low, 1), round(high, 1)] if high - low >= RANGE_MIN_WIDTH_PCT else None


def finalize(recs: list[dict[str, Any]], iteration_ms: float,
             syncs_bound: bool = False) -> list[dict[str, Any]]:
    """Severity from each re-timed saving (a rule's own severity stands where none could be
    re-timed: ``communication``); a fix predicted to save less than
    :data:`MIN_SAVING_PCT` of the iteration is left out; then the order: severity, saving,
    and a fix counted after another (:data:`_AFTER`) right after that one. ``syncs_bound``:
    host syncs are the largest share of the iteration, so ``host_sync`` comes before
    ``compile`` whatever their estimates (a compiled graph still waits at every sync)."""
    kept = []
    for rec in recs:
        pct = rec.get("estimated_saving_pct")
        if rec.get("estimated_saving_ms") is not None and pct is None and iteration_ms > 0:
            pct = rec["estimated_saving_pct"] = round(
                100.0 * rec["estimated_saving_ms"] / iteration_ms, 1)
        # a rule that fired on work the GPU may hide asks the re-timing to confirm it
        confirm = (rec.get("evidence") or {}).get("confirm_min_pct")
        if pct is None and confirm is not None:
            continue  # not re-timed: nothing confirms the work is on the critical path
        if pct is not None:
            if pct < max(MIN_SAVING_PCT, confirm or 0.0):
                continue
            if rec.get("predicted_iteration_ms") is not None:  # re-timed: severity follows
                rec["severity"] = severity_for(pct)
        kept.append(rec)
    ordered = by_saving(kept)
    ids = [r["id"] for r in ordered]
    for rid, (first, _) in _AFTER.items():
        if rid in ids and first in ids and ids.index(first) > ids.index(rid) and (
                _counted_after(ordered[ids.index(rid)], set(ids)) is not None
                or (rid == "compile" and syncs_bound)):
            # the prerequisite moves up to its dependent's place and takes its severity:
            # the dependent's saving needs it
            pre = ordered.pop(ids.index(first))
            at = ids.index(rid)
            pre["severity"] = min(pre["severity"], ordered[at]["severity"],
                                  key=lambda s: SEVERITY_ORDER.get(s, 3))
            pre.setdefault("evidence", {})["prerequisite_of"] = rid
            ordered.insert(at, pre)
            ids = [r["id"] for r in ordered]
    return ordered


def severity_for(saving_pct: float | None) -> str:
    if saving_pct is None:
        return "medium"
    if saving_pct >= SEVERITY_HIGH_PCT:
        return "high"
    return "medium" if saving_pct >= SEVERITY_MEDIUM_PCT else "low"


def _what(rid: str) -> str:
    return {
        "tf32": "FP32 GEMM/conv kernels at TF32 Tensor Core speed",
        "amp": "matrix kernels at half-precision Tensor Core speed, FP32 memory-bound kernels "
               "moving half the bytes, autocast's extra dispatch",
        "channels_last": "layout transforms removed, NHWC norm/pool and half-precision "
                         "convolutions faster",
        "compile": "small kernels fused, host dispatch cheaper",
        "input_pipeline": "host work outside ops and data-loader waits moved off the "
                          "critical path",
        "pinned_memory": "pageable copies at pinned speed, not blocking the host",
        "host_sync": "no host waits on the GPU",
        "dispatch_overhead": "host dispatch per iteration cheaper",
    }[rid]
