"""Link GPU activity to what launched it on the host: the op stack, the phase, the FLOPs.

One sweep per host thread over ops, annotations and runtime calls sorted by start time keeps
a stack of open ranges; each launch (runtime call with a correlation id) records the stack's
state. Kernels then find their launch through the correlation id. O(n log n), no quadratic
containment search, so million-event traces stay fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from ..model import OPTIMIZER, Annotation, CpuOp, Profile, RuntimeCall
from . import columns
from .flops import SHAPE_COUNTED_OPS, op_flops

FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER_PHASE = "optimizer"

_WRAPPER_PREFIXES = ("autograd::", "Optimizer.", "ProfilerStep", "enumerate(DataLoader)",
                     "cudaLaunch", "cuLaunch")


def is_backward_op(name: str) -> bool:
    """An autograd node's op (``autograd::engine::evaluate_function: MmBackward0`` and the
    node itself): work under one is the backward pass's."""
    return name.startswith("autograd::engine::evaluate_function") or "Backward" in name


class LaunchContext(msgspec.Struct, gc=False):
    """What launched one kernel. A msgspec Struct outside the cycle collector (one per launch,
    no reference cycles): tens of thousands of tracked objects made every full collection
    during the report walk them all."""

    launch_us: float
    op: str | None  # the op shown to users: outermost framework op (aten::linear, not aten::mm)
    eligible: bool  # some enclosing op is Tensor-Core eligible
    phase: str | None
    flop_op: int | None  # index into profile.cpu_ops of the enclosing op that carries FLOPs
    input_types: list[str] | None
    source: str | None  # deepest user frame, when stacks were recorded
    launch_op: int | None = None  # index into profile.cpu_ops of the op that launched it (aten::mm)


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
    out: dict[int, LaunchContext] = {}
    in_optimizer: dict[int, int] = {}  # correlation -> the optimizer-step range around it
    fold = _StackFold(profile, is_eligible)
    correlation = columns.values(profile.runtime, "correlation")
    opens_optimizer = [fold.opens_optimizer(a) for a in fold.host_ann]
    for swept in _sweeps(profile, fold.host_ann):
        # Each entry carries the fold of the stack up to it, made when it is pushed, so a
        # launch reads its context off the top. The bottom entry never pops (NaN <= x is
        # false); an op's FLOPs count once some launch ran under it (``recorded``: the
        # entries below that depth did).
        stack: list[list] = [[_NAN, _EMPTY, None, 0]]  # [end, fold, FLOPs, op index]
        top_end, acc, recorded = _NAN, _EMPTY, 1
        for start, kind, idx, end in _as_python(swept):
            if top_end <= start:
                stack.pop()
                while stack[-1][0] <= start:
                    stack.pop()
                top_end, acc = stack[-1][0], stack[-1][1]
                if recorded > len(stack):
                    recorded = len(stack)
            if kind == _OP:
                acc, flops = fold.push_op(acc, idx)
                stack.append([end, acc, flops, idx])
                top_end = end
                continue
            if kind == _ANNOTATION:  # an optimizer step opens its range (XPlane: ~100k)
                if acc[7] is None and opens_optimizer[idx]:
                    acc = (*acc[:7], idx, *acc[8:])
                stack.append([end, acc, None, idx])
                top_end = end
                continue
            if recorded < len(stack):
                fold.record(stack, recorded)
                recorded = len(stack)
            corr = correlation[idx]  # not None: only correlated calls were queued
            (outer, _inner, is_elig, flop_op, types, source, launch_op, opt_range, backward,
             saw_op) = acc
            # Backward wins over an enclosing optimizer step: closure optimizers (Lightning's
            # automatic optimisation, LBFGS) run forward and backward inside step(closure).
            if backward:
                phase: str | None = BACKWARD
            elif opt_range is not None:
                phase = OPTIMIZER_PHASE
            else:  # no framework op around the launch (XLA, raw CUDA): unknown
                phase = FORWARD if saw_op else None
            # the launch's start is the call's start_us (the same float, from its column)
            out[corr] = LaunchContext(start, outer, is_elig, phase, flop_op, types, source,
                                      launch_op)
            if opt_range is not None:
                in_optimizer[corr] = opt_range
    _split_closures(out, in_optimizer)
    return out, fold.flops


_OP, _ANNOTATION, _LAUNCH = 0, 1, 2
# (outer, inner, eligible, flop_op, input_types, source, launch_op, optimizer range, backward,
#  saw an op)
_EMPTY: tuple = (None, None, False, None, None, None, None, None, False, False)
_NAN = float("nan")
_START, _DUR, _TID = attrgetter("start_us"), attrgetter("dur_us"), attrgetter("tid")


def _sweeps(profile: Profile, host_ann: list[Annotation]
            ) -> Iterator[tuple[np.ndarray, ...]]:
    """Per launching thread: its ops, the host annotations and its correlated launches as
    (start, kind, index, end) columns, ordered by (start, -duration, kind, index). Threads
    that launch nothing are skipped: no launch of theirs needs a context."""
    ops = profile.cpu_ops
    tids = columns.values(ops, "tid")
    distinct = set(columns.distinct(ops, "tid"))
    # each thread as an int, so threads are told apart in numpy: int ids are their own code
    codes: dict[Any, int] = {t: t for t in distinct}
    if all(type(t) is int and abs(t) < 2**62 for t in distinct):
        op_tid = np.array(tids, np.int64)
    else:
        codes = {t: i for i, t in enumerate(distinct)}
        op_tid = np.fromiter(map(codes.__getitem__, tids), np.int64, len(ops))
    op_start = columns.floats(ops, "start_us")
    op_dur = columns.floats(ops, "dur_us")
    ann_start = np.array([a.start_us for a in host_ann], np.float64)
    ann_dur = np.array([a.dur_us for a in host_ann], np.float64)
    rt = profile.runtime
    rt_start = columns.floats(rt, "start_us")
    # Annotations carry no tid in the model: put them on every thread that launches work.
    for tid, calls in _launches_by_thread(rt).items():
        op_idx = (np.flatnonzero(op_tid == codes[tid]) if tid in codes
                  else np.empty(0, np.int64))
        call_start = rt_start[calls]
        starts = np.concatenate([op_start[op_idx], ann_start, call_start])
        durs = np.concatenate([op_dur[op_idx], ann_dur, np.zeros(len(calls))])
        kinds = np.concatenate([np.full(len(op_idx), _OP), np.full(len(host_ann), _ANNOTATION),
                                np.full(len(calls), _LAUNCH)])
        index = np.concatenate([op_idx, np.arange(len(host_ann)), calls])
        order = _sweep_order(starts, durs, kinds, index)
        swept = _drop_closed(starts[order], kinds[order], index[order],
                               (starts + durs)[order])
        yield swept


SWEEP_CHUNK = 1 << 18  # events turned into Python objects at a time (a 2 GB trace: 3.4 M)


def _as_python(columns_: tuple[np.ndarray, ...]) -> Iterator[tuple[Any, ...]]:
    """The rows of the sweep's columns as Python values, converted a chunk at a time: the
    whole sweep as lists held ~370 MB at once on a 2 GB trace, the report's peak."""
    n = len(columns_[0])
    for at in range(0, n, SWEEP_CHUNK):
        yield from zip(*(c[at:at + SWEEP_CHUNK].tolist() for c in columns_), strict=True)


def _launches_by_thread(rt: list[RuntimeCall]) -> dict[Any, np.ndarray]:
    """The correlated runtime calls (their indices, ascending) of each thread, threads in
    the order of their first such call."""
    correlated = np.flatnonzero(columns.present(rt, "correlation"))
    tids = columns.values(rt, "tid")
    if not all(type(t) is int and abs(t) < 2**62 for t in set(tids)):  # any hashable: a dict
        launches: dict[Any, list[int]] = {}
        for i in correlated.tolist():
            launches.setdefault(tids[i], []).append(i)
        return {t: np.array(calls, np.int64) for t, calls in launches.items()}
    tid = np.array(tids, np.int64)[correlated]
    distinct, first = np.unique(tid, return_index=True)
    return {int(t): correlated[tid == t] for t in distinct[np.argsort(first)].tolist()}


def _sweep_order(starts: np.ndarray, durs: np.ndarray, kinds: np.ndarray, index: np.ndarray
                 ) -> np.ndarray:
    """``np.lexsort((index, kinds, -durs, starts))``: by start (a stable sort of a few sorted
    runs, fast), then the events that share a start re-ordered by the other keys (few: a
    full lexsort of 100k events costs ~30x more)."""
    if np.isnan(starts).any():  # NaN starts: lexsort's order among them is the other keys'
        return np.lexsort((index, kinds, -durs, starts))
    order = np.argsort(starts, kind="stable")
    ordered = starts[order]
    tie = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(tie):
        shared = np.zeros(len(order), dtype=bool)
        shared[tie] = shared[tie + 1] = True  # blocks of equal starts, in start order
        at = np.flatnonzero(shared)
        sub = order[at]
        order[at] = sub[np.lexsort((index[sub], kinds[sub], -durs[sub], starts[sub]))]
    return order


def _drop_closed(starts: np.ndarray, kinds: np.ndarray, index: np.ndarray, ends: np.ndarray,
                 passes: int = 8) -> tuple[np.ndarray, ...]:
    """Leave out the ranges that end before the next event starts (leaf ops, then ops whose
    children were all left out): the sweep would push one and pop it at the next event, and
    popping at that event pops everything popping at the range's own start did, so the
    stacks every launch sees are the same without them."""
    for _ in range(passes):
        following = np.append(starts[1:], np.inf)
        keep = (kinds == _LAUNCH) | ~(following >= ends)
        if keep.all():
            break
        starts, kinds, index, ends = starts[keep], kinds[keep], index[keep], ends[keep]
    return starts, kinds, index, ends


class _StackFold:
    """The launch context of a stack of open ranges, folded bottom to top: each push folds
    its range onto the fold below it (so a launch costs one read of the top; folding only
    when a launch came walked the entries pushed since the last one, ~20 % slower)."""

    def __init__(self, profile: Profile, is_eligible: Callable[[str], Any]) -> None:
        self.ops = profile.cpu_ops
        self.host_ann = [a for a in profile.annotations if not a.on_gpu]
        self.is_eligible = is_eligible
        self.names: dict[str, tuple[bool, bool, bool]] = {}  # backward, eligible, shown
        self.flops: dict[int, float] = {}  # op index -> its FLOPs, for ops a launch ran under
        self._flops_memo: dict[tuple[str, int, int], tuple[Any, Any, float | None]] = {}

    def _shape_flops(self, op: CpuOp) -> float | None:
        """op_flops of an op without recorded FLOPs, once per (name, shapes, concrete inputs)
        objects: the readers share equal argument lists, so a 2 GB trace's 219k math ops are
        a few hundred distinct ones. The memo holds the objects, so their ids stay theirs."""
        key = (op.name, id(op.input_shapes), id(op.concrete_inputs))
        hit = self._flops_memo.get(key)
        if hit is None:
            hit = self._flops_memo[key] = (op.input_shapes, op.concrete_inputs, op_flops(op))
        return hit[2]

    def record(self, stack: list[list], start: int) -> None:
        """The FLOPs of the ops in ``stack[start:]``, now that a launch ran under them."""
        for entry in stack[start:]:
            if entry[2]:
                self.flops[entry[3]] = entry[2]

    def _name(self, name: str) -> tuple[bool, bool, bool]:
        props = self.names[name] = (
            is_backward_op(name), bool(self.is_eligible(name)),
            not name.startswith(_WRAPPER_PREFIXES))
        return props

    @staticmethod
    def opens_optimizer(a: Annotation) -> bool:
        """Whether annotation ``a`` is an optimizer step: pushed on a stack outside any other,
        the fold's optimizer range becomes its index."""
        return a.kind == OPTIMIZER or a.name.startswith("Optimizer.")

    def push_op(self, acc: tuple, j: int) -> tuple[tuple, float | None]:
        """The fold with op ``j`` on top, and the op's FLOPs."""
        outer, inner, elig, flop_op, types, source, launch_op, opt_range, backward, _saw = acc
        op = self.ops[j]
        name = op.name
        is_backward, is_elig, shown = self.names.get(name) or self._name(name)
        # op_flops counts FLOPs from shapes only for a few op names: skip the call for the rest
        flops: float | None
        if op.flops:
            flops = op.flops
        elif name in SHAPE_COUNTED_OPS:
            flops = self._shape_flops(op)
        else:
            flops = None
        if flops:
            flop_op = j  # the innermost op with FLOPs wins
        if shown:
            if outer is None:
                outer = name
            inner = name
            launch_op = j
            if op.input_types:
                types = op.input_types
        if source is None and op.stack:
            source = _user_frame(op)
        return (outer, inner, elig or is_elig, flop_op, types, source, launch_op, opt_range,
                backward or is_backward, True), flops


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
