"""Link GPU activity to what launched it on the host: the op stack, the phase, the FLOPs.

One sweep per host thread over ops, annotations and runtime calls sorted by start time keeps
a stack of open ranges; each launch (runtime call with a correlation id) records the stack's
state. Kernels then find their launch through the correlation id. O(n log n), no quadratic
containment search, so million-event traces stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import OPTIMIZER, CpuOp, Profile
from .flops import op_flops

FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER_PHASE = "optimizer"

_WRAPPER_PREFIXES = ("autograd::", "Optimizer.", "ProfilerStep", "enumerate(DataLoader)",
                     "cudaLaunch", "cuLaunch")


@dataclass(slots=True)
class LaunchContext:
    launch_us: float
    op: str | None  # the op shown to users: outermost framework op (aten::linear, not aten::mm)
    inner_op: str | None  # the op that launched it (aten::mm)
    eligible: bool  # some enclosing op is Tensor-Core eligible
    phase: str | None
    flop_op: int | None  # index into profile.cpu_ops of the enclosing op that carries FLOPs
    input_types: list[str] | None
    source: str | None  # deepest user frame, when stacks were recorded


def _user_frame(op: CpuOp) -> str | None:
    if not op.stack:
        return None
    for frame in op.stack:  # innermost first, as Kineto lists them
        if "site-packages" in frame or "/torch/" in frame or frame.startswith("<built-in"):
            continue
        return frame
    return None


def link_launches(profile: Profile, is_eligible
                  ) -> tuple[dict[int, LaunchContext], dict[int, float]]:
    """Map correlation id -> LaunchContext for every host launch that has one.

    Also returns the FLOPs of each op (index into profile.cpu_ops) some launch ran under.
    """
    by_tid: dict[int, list[tuple[float, float, int, int]]] = {}
    # entries: (start, -end-order, kind, index); kind 0 = op, 1 = annotation, 2 = runtime call
    for i, op in enumerate(profile.cpu_ops):
        by_tid.setdefault(op.tid, []).append((op.start_us, -op.dur_us, 0, i))
    host_ann = [a for a in profile.annotations if not a.on_gpu]
    # Annotations carry no tid in the model: put them on every thread that launches work.
    launch_tids = {r.tid for r in profile.runtime} or {0}
    for i, a in enumerate(host_ann):
        for tid in launch_tids:
            by_tid.setdefault(tid, []).append((a.start_us, -a.dur_us, 1, i))
    for i, r in enumerate(profile.runtime):
        if r.correlation is not None:
            by_tid.setdefault(r.tid, []).append((r.start_us, 0.0, 2, i))

    eligible_cache: dict[str, bool] = {}
    flops_cache: dict[int, float | None] = {}

    def flops_of(i: int) -> float | None:
        if i not in flops_cache:
            flops_cache[i] = op_flops(profile.cpu_ops[i])
        return flops_cache[i]

    def eligible(name: str) -> bool:
        v = eligible_cache.get(name)
        if v is None:
            v = eligible_cache[name] = bool(is_eligible(name))
        return v

    out: dict[int, LaunchContext] = {}
    in_optimizer: dict[int, int] = {}  # correlation -> the optimizer-step range around it
    for events in by_tid.values():
        events.sort()
        stack: list[tuple[float, int, int]] = []  # (end, kind, index)
        cached: tuple | None = None  # the stack's summary, valid until the stack changes
        for start, _neg, kind, idx in events:
            while stack and stack[-1][0] <= start:
                stack.pop()
                cached = None
            if kind == 0:
                op = profile.cpu_ops[idx]
                stack.append((op.start_us + op.dur_us, 0, idx))
                cached = None
                continue
            if kind == 1:
                a = host_ann[idx]
                stack.append((a.start_us + a.dur_us, 1, idx))
                cached = None
                continue
            call = profile.runtime[idx]
            assert call.correlation is not None  # only correlated calls were queued
            if cached is not None:
                out[call.correlation] = LaunchContext(call.start_us, *cached[:-1])
                if cached[-1] is not None:
                    in_optimizer[call.correlation] = cached[-1]
                continue
            outer = inner = None
            saw_op = False
            flop_op = None
            is_elig = False
            phase: str | None = FORWARD
            types = None
            source = None
            opt_range = None
            backward = False
            for _end, k, j in stack:
                if k == 1:
                    a = host_ann[j]
                    if a.kind == OPTIMIZER or a.name.startswith("Optimizer."):
                        if opt_range is None:
                            opt_range = j
                    continue
                op = profile.cpu_ops[j]
                saw_op = True
                name = op.name
                if name.startswith("autograd::engine::evaluate_function") or "Backward" in name:
                    backward = True
                if eligible(name):
                    is_elig = True
                if flops_of(j):
                    flop_op = j  # the innermost op with FLOPs wins
                if not name.startswith(_WRAPPER_PREFIXES):
                    if outer is None:
                        outer = name
                    inner = name
                    if op.input_types:
                        types = op.input_types
                if op.stack and source is None:
                    source = _user_frame(op)
            # Backward wins over an enclosing optimizer step: closure optimizers (Lightning's
            # automatic optimisation, LBFGS) run forward and backward inside step(closure).
            if backward:
                phase = BACKWARD
            elif opt_range is not None:
                phase = OPTIMIZER_PHASE
            if not saw_op and phase == FORWARD:
                phase = None  # no framework op around the launch (XLA, raw CUDA): unknown
            cached = (outer, inner, is_elig, phase, flop_op, types, source, opt_range)
            out[call.correlation] = LaunchContext(call.start_us, *cached[:-1])
            if opt_range is not None:
                in_optimizer[call.correlation] = opt_range
    _split_closures(out, in_optimizer)
    return out, {i: f for i, f in flops_cache.items() if f}


def _split_closures(out: dict[int, LaunchContext], in_optimizer: dict[int, int]) -> None:
    """Inside an optimizer step that ran backward (a closure), work launched before the last
    backward launch is the closure's forward pass, not the optimizer's update."""
    last_backward: dict[int, float] = {}
    for corr, rng in in_optimizer.items():
        ctx = out[corr]
        if ctx.phase == BACKWARD and ctx.launch_us > last_backward.get(rng, float("-inf")):
            last_backward[rng] = ctx.launch_us
    for corr, rng in in_optimizer.items():
        ctx = out[corr]
        if ctx.phase == OPTIMIZER_PHASE and ctx.launch_us < last_backward.get(rng, float("-inf")):
            ctx.phase = FORWARD
