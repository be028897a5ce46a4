"""Link GPU activity to what launched it on the host: the op stack, the phase, the FLOPs.

One sweep per host thread over ops, annotations and runtime calls sorted by start time keeps
a stack of open ranges; each launch (runtime call with a correlation id) records the stack's
state. Kernels then find their launch through the correlation id. O(n log n), no quadratic
containment search, so million-event traces stay fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any, NamedTuple

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
    for sweep in _sweeps(profile, fold.host_ann):
        tops = _stack_tops(sweep[0], sweep[1], sweep[3])
        if tops is None:
            launches = _swept_launches(fold, sweep)
        else:
            launches = _nested_launches(fold, sweep, tops)
        corrs = list(map(correlation.__getitem__, launches.call))  # not None: correlated
        # the launch's start is the call's start_us (the same float, from its column)
        out.update(zip(corrs, map(LaunchContext, launches.start, launches.outer,
                                  launches.eligible, launches.phase, launches.flop_op,
                                  launches.types, launches.source, launches.launch_op),
                       strict=True))
        in_optimizer.update((corr, rng) for corr, rng in zip(corrs, launches.opt_range,
                                                              strict=True) if rng is not None)
    _split_closures(out, in_optimizer)
    return out, {i: f for i, f in fold.flops.items() if f}


class _Launches(NamedTuple):
    """A sweep's launches in its order, as lists: what each LaunchContext is made of."""

    start: list[float]
    call: list[int]  # index into profile.runtime
    outer: list[str | None]
    eligible: list[bool]
    phase: list[str | None]
    flop_op: list[int | None]
    types: list[list[str] | None]
    source: list[str | None]
    launch_op: list[int | None]
    opt_range: list[int | None]


def _phase(backward: bool, opt_range: int | None, saw_op: bool) -> str | None:
    # Backward wins over an enclosing optimizer step: closure optimizers (Lightning's
    # automatic optimisation, LBFGS) run forward and backward inside step(closure).
    if backward:
        return BACKWARD
    if opt_range is not None:
        return OPTIMIZER_PHASE
    return FORWARD if saw_op else None  # no framework op around the launch (XLA, raw CUDA)


_Sweep = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # start, kind, index, end


def _swept_launches(fold: _StackFold, sweep: _Sweep) -> _Launches:
    """Each launch with the summary of the ranges open around it: the stack sweep itself
    (for ranges that do not nest, which only the sweep can judge; see _stack_tops)."""
    launches = _Launches([], [], [], [], [], [], [], [], [], [])
    appends: tuple[list[Any], ...] = tuple(launches)
    # stack entries: [end, kind, index, the summary of the stack up to it or None]
    stack: list[list] = []
    for start, kind, idx, end in zip(*(c.tolist() for c in sweep), strict=True):
        while stack and stack[-1][0] <= start:
            stack.pop()
        if kind != _LAUNCH:
            stack.append([end, kind, idx, None])
            continue
        (outer, _inner, is_elig, flop_op, types, source, launch_op, opt_range, backward,
         saw_op) = fold.summary(stack) if stack else _EMPTY
        for column, value in zip(appends, (start, idx, outer, is_elig,
                                            _phase(backward, opt_range, saw_op), flop_op,
                                            types, source, launch_op, opt_range), strict=True):
            column.append(value)
    return launches


_OP, _ANNOTATION, _LAUNCH = 0, 1, 2
# (outer, inner, eligible, flop_op, input_types, source, launch_op, optimizer range, backward,
#  saw an op)
_EMPTY: tuple = (None, None, False, None, None, None, None, None, False, False)
_START, _DUR, _TID = attrgetter("start_us"), attrgetter("dur_us"), attrgetter("tid")
_NAME, _FLOPS, _TYPES, _STACK = (attrgetter("name"), attrgetter("flops"),
                                 attrgetter("input_types"), attrgetter("stack"))


def _sweeps(profile: Profile, host_ann: list[Annotation]) -> Iterator[_Sweep]:
    """Per launching thread: its ops, the host annotations and its correlated launches as
    (start, kind, index, end) columns, ordered by (start, -duration, kind, index). Threads
    that launch nothing are skipped: no launch of theirs needs a context."""
    ops = profile.cpu_ops
    tids = columns.values(ops, "tid")
    distinct = set(tids)
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


def _launches_by_thread(rt: list[RuntimeCall]) -> dict[Any, np.ndarray]:
    """The correlated runtime calls (their indices, ascending) of each thread, threads in
    the order of their first such call."""
    correlated = np.flatnonzero(np.fromiter(
        map(is_not, columns.values(rt, "correlation"), repeat(None)), bool, len(rt)))
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
                 passes: int = 8) -> _Sweep:
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


def _stack_tops(starts: np.ndarray, kinds: np.ndarray, ends: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """Without the sweep, what its stack holds: per event, the sweep position of the stack's
    top once the sweep has popped at it (-1: empty), and the stack's size then (its depth).

    While every range pushed ends no later than the one below it, the stack holds exactly
    the ranges pushed before the event that end after its start (a pop takes the top ranges
    that end by then, and the ends grow downwards), so its size is a count, and its top is
    the last range pushed at one depth less. The counts are right as long as every push so
    far kept that order, so checking every push's end against the top found for it proves
    the whole answer. None when a push does not (partly overlapping ranges: the sweep then
    keeps ranges that ended) or a value is not finite: the sweep itself decides."""
    n = len(starts)
    pushed = kinds != _LAUNCH
    pos = np.flatnonzero(pushed)
    if not (np.isfinite(starts).all() and np.isfinite(ends).all()) or (
            ends[pos] <= starts[pos]).any():  # a range ending at its start: counted as popped
        return None
    if not len(pos):
        return np.full(n, -1, np.int64), np.zeros(n, np.int64)
    depth = np.cumsum(pushed) - pushed - np.searchsorted(np.sort(ends[pos]), starts, "right")
    # pushed ranges by (depth, position); each event's top: the last key below its own
    keys = np.sort(depth[pos] * (n + 1) + pos)
    at = np.searchsorted(keys, (depth - 1) * (n + 1) + np.arange(n)) - 1
    top = np.where(depth > 0, keys[at] % (n + 1), -1)
    found = top >= 0
    if (depth < 0).any() or (depth[top[found]] != depth[found] - 1).any():
        return None
    below = top[pos]
    inside = below >= 0
    if (ends[pos[inside]] > ends[below[inside]]).any():  # does not nest: the sweep decides
        return None
    return top, depth


class _Folded(NamedTuple):
    """The summary (_StackFold's tuple) of every needed range of a nested sweep, as columns
    over the sweep's positions; -1 for none."""

    outer: np.ndarray  # sweep position of the outermost shown op
    eligible: np.ndarray
    flop_op: np.ndarray  # op index of the innermost op with FLOPs
    types_op: np.ndarray  # sweep position of the innermost shown op with input types
    source_op: np.ndarray  # sweep position of the outermost op with a user frame
    launch_op: np.ndarray  # op index of the innermost shown op
    opt_range: np.ndarray  # annotation index of the outermost optimizer range
    backward: np.ndarray
    saw_op: np.ndarray
    stacked: np.ndarray  # an op with a recorded stack (it may have a user frame)
    # per sweep position and one more (None, where -1 points): the op's name, input types
    # and user frame, as objects
    name: np.ndarray
    types: np.ndarray
    frame: np.ndarray


_PHASES = (BACKWARD, OPTIMIZER_PHASE, FORWARD, None)


def _nested_launches(fold: _StackFold, sweep: _Sweep, tops: tuple[np.ndarray, np.ndarray]
                     ) -> _Launches:
    """:func:`_swept_launches` for ranges that nest (_stack_tops found every stack): each
    needed range folded once onto the fold of the range below it, depth by depth in numpy.
    Only the ranges on some launch's stack are folded (op_flops recorded), as the sweep does."""
    starts, kinds, index, _ = sweep
    top, depth = tops
    at_launch = np.flatnonzero(kinds == _LAUNCH)
    levels = _needed_levels(top, depth, kinds, top[at_launch])
    f = fold.columns(kinds, index, np.concatenate(levels) if levels else at_launch[:0])
    for d, level in enumerate(levels):  # each range on the fold of the range below it
        below = top[level]
        # the user frame of the outermost op that has one: looked for only where no op
        # below has one, as _push does (finding it walks the op's stack)
        fold.find_frames(level[f.stacked[level] & (f.source_op[below] < 0 if d else True)],
                         index, f)
        if not d:
            continue
        for outermost in (f.outer, f.source_op, f.opt_range):
            outermost[level] = np.where(outermost[below] >= 0, outermost[below],
                                        outermost[level])
        for innermost in (f.flop_op, f.types_op, f.launch_op):
            innermost[level] = np.where(innermost[level] >= 0, innermost[level],
                                        innermost[below])
        for anywhere in (f.eligible, f.backward, f.saw_op):
            anywhere[level] |= anywhere[below]
    lt = top[at_launch]
    has = lt >= 0
    at = np.where(has, lt, 0)

    def col(c: np.ndarray) -> np.ndarray:  # the launch's stack's value (-1/False: empty)
        return np.where(has, c[at], False if c.dtype == bool else -1)

    backward, opt_range, saw_op = col(f.backward), col(f.opt_range), col(f.saw_op)
    phase = np.select([backward, opt_range >= 0, saw_op], [0, 1, 2], 3)
    return _Launches(
        starts[at_launch].tolist(), index[at_launch].tolist(), f.name[col(f.outer)].tolist(),
        col(f.eligible).tolist(), _PHASE_OBJECTS[phase].tolist(), _ints(col(f.flop_op)),
        f.types[col(f.types_op)].tolist(), f.frame[col(f.source_op)].tolist(),
        _ints(col(f.launch_op)), _ints(opt_range))


_PHASE_OBJECTS = np.array(_PHASES, dtype=object)


def _ints(codes: np.ndarray) -> list[int | None]:
    """Python ints, None for -1."""
    out = codes.astype(object)
    out[codes < 0] = None
    return out.tolist()


def _needed_levels(top: np.ndarray, depth: np.ndarray, kinds: np.ndarray,
                   launch_tops: np.ndarray) -> list[np.ndarray]:
    """The sweep positions of the ranges on some launch's stack, by depth (0 first)."""
    needed = np.zeros(len(top), dtype=bool)
    needed[launch_tops[launch_tops >= 0]] = True
    if not needed.any():
        return []
    pushed = np.flatnonzero(kinds != _LAUNCH)
    pushed = pushed[np.argsort(depth[pushed], kind="stable")]
    bounds = np.searchsorted(depth[pushed], np.arange(int(depth[pushed[-1]]) + 2))
    levels: list[np.ndarray] = []
    for d in range(len(bounds) - 2, -1, -1):  # deepest first: what is below is needed too
        level = pushed[bounds[d]:bounds[d + 1]]
        level = level[needed[level]]
        below = top[level]
        needed[below[below >= 0]] = True
        levels.append(level)
    return levels[::-1]


class _StackFold:
    """The launch context of a stack of open ranges, folded bottom to top. Each entry keeps
    the fold up to itself, so a launch costs the entries pushed since the last one."""

    def __init__(self, profile: Profile, is_eligible: Callable[[str], Any]) -> None:
        self.ops = profile.cpu_ops
        self.host_ann = [a for a in profile.annotations if not a.on_gpu]
        self.is_eligible = is_eligible
        self.names: dict[str, tuple[bool, bool, bool]] = {}  # backward, eligible, shown
        self.flops: dict[int, float | None] = {}
        self._optimizer: np.ndarray | None = None

    def columns(self, kinds: np.ndarray, index: np.ndarray, at: np.ndarray) -> _Folded:
        """The summary of each range at sweep positions ``at`` on an empty stack (what it
        adds of its own, as _push has it; the user frame is found later), -1 / False
        elsewhere. Records op_flops."""
        n = len(kinds)

        def none() -> np.ndarray:
            return np.full(n, -1, np.int64)

        def false() -> np.ndarray:
            return np.zeros(n, dtype=bool)

        def objects() -> np.ndarray:
            return np.full(n + 1, None, dtype=object)

        f = _Folded(none(), false(), none(), none(), none(), none(), none(), false(), false(),
                    false(), objects(), objects(), objects())
        ann_at = at[kinds[at] == _ANNOTATION]
        ann = index[ann_at]
        f.opt_range[ann_at] = np.where(self.optimizer_ranges()[ann], ann, -1)
        op_at = at[kinds[at] == _OP]
        js = index[op_at]
        ops = list(map(self.ops.__getitem__, js.tolist()))
        m = len(ops)
        # one attribute at a time: a tuple per op would be tens of thousands of tracked
        # objects, and the collections they set off walk the whole profile
        names, types = list(map(_NAME, ops)), list(map(_TYPES, ops))
        distinct = {name: i for i, name in enumerate(dict.fromkeys(names))}
        code = np.fromiter(map(distinct.__getitem__, names), np.int64, m)
        # per distinct name: backward, eligible, shown, op_flops may count it from shapes
        props = np.array([(*(self.names.get(name) or self._name(name)),
                           name in SHAPE_COUNTED_OPS) for name in distinct],
                         dtype=bool).reshape(len(distinct), 4)[code]
        has_flops = np.zeros(m, dtype=bool)
        maybe = props[:, 3] | np.fromiter(map(bool, map(_FLOPS, ops)), bool, m)
        for i in np.flatnonzero(maybe).tolist():  # the rest have none: skip the call
            flops = self.flops[int(js[i])] = op_flops(ops[i])
            has_flops[i] = bool(flops)
        has_types = np.fromiter(map(bool, types), bool, m)
        backward, eligible, shown = props[:, 0], props[:, 1], props[:, 2]
        f.outer[op_at] = np.where(shown, op_at, -1)
        f.launch_op[op_at] = np.where(shown, js, -1)
        f.types_op[op_at] = np.where(shown & has_types, op_at, -1)
        f.flop_op[op_at] = np.where(has_flops, js, -1)
        f.eligible[op_at], f.backward[op_at], f.saw_op[op_at] = eligible, backward, True
        f.stacked[op_at] = np.fromiter(map(bool, map(_STACK, ops)), bool, m)
        f.name[op_at] = np.fromiter(names, object, m)
        f.types[op_at] = np.fromiter(types, object, m)
        return f

    def find_frames(self, at: np.ndarray, index: np.ndarray, f: _Folded) -> None:
        """The user frame of the ops at sweep positions ``at``: where there is one, it is
        ``f.frame`` there and ``f.source_op`` points to the op itself."""
        for pos, j in zip(at.tolist(), index[at].tolist(), strict=True):
            frame = _user_frame(self.ops[j])
            if frame is not None:
                f.frame[pos] = frame
                f.source_op[pos] = pos

    def optimizer_ranges(self) -> np.ndarray:
        """Per host annotation, whether it is an optimizer step (as _push judges it)."""
        if self._optimizer is None:
            self._optimizer = np.array([a.kind == OPTIMIZER or a.name.startswith("Optimizer.")
                                        for a in self.host_ann], dtype=bool)
        return self._optimizer

    def summary(self, stack: list[list]) -> tuple:
        low = len(stack) - 1
        while low >= 0 and stack[low][3] is None:
            low -= 1
        acc = stack[low][3] if low >= 0 else _EMPTY
        for entry in stack[low + 1:]:
            acc = entry[3] = self._push(acc, entry[1], entry[2])
        return acc

    def _name(self, name: str) -> tuple[bool, bool, bool]:
        props = self.names[name] = (
            name.startswith("autograd::engine::evaluate_function") or "Backward" in name,
            bool(self.is_eligible(name)), not name.startswith(_WRAPPER_PREFIXES))
        return props

    def _push(self, acc: tuple, kind: int, j: int) -> tuple:
        if kind == _ANNOTATION:
            a = self.host_ann[j]
            if acc[7] is None and (a.kind == OPTIMIZER or a.name.startswith("Optimizer.")):
                return (*acc[:7], j, *acc[8:])
            return acc
        outer, inner, elig, flop_op, types, source, launch_op, opt_range, backward, _saw = acc
        op = self.ops[j]
        name = op.name
        is_backward, is_elig, shown = self.names.get(name) or self._name(name)
        flops = self.flops[j] = op_flops(op)
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
                backward or is_backward, True)


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
