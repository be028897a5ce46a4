"""Link GPU activity to what launched it on the host: the op stack, the phase, the FLOPs.

One sweep per host thread over ops, annotations and runtime calls sorted by start time keeps
a stack of open ranges; each launch (runtime call with a correlation id) records the stack's
state. Kernels then find their launch through the correlation id. O(n log n), no quadratic
containment search, so million-event traces stay fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
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
                  ) -> tuple[Launches, dict[int, float]]:
    """Map correlation id -> LaunchContext for every host launch that has one (as columns:
    :class:`Launches`).

    Also returns the FLOPs of each op (index into profile.cpu_ops) some launch ran under.
    """
    calls: list[np.ndarray] = []  # per sweep its launches' runtime calls, in sweep order
    folds: list[tuple] = []  # and per launch the fold of the stack it ran under (shared)
    fold = _StackFold(profile, is_eligible)
    host = _host_annotations(profile)
    opens_optimizer = host[2]
    add_fold, push_op, op_kind, launch_kind = folds.append, fold.push_op, _OP, _LAUNCH
    for swept in _sweeps(profile, None, host[:2], inert_annotations=not any(opens_optimizer)):
        calls.append(swept[2][swept[1] == _LAUNCH])  # every launch is met once, in this order
        # Each entry carries the fold of the stack up to it, made when it is pushed, so a
        # launch reads its context off the top. The bottom entry never pops (NaN <= x is
        # false); an op's FLOPs count once some launch ran under it (``recorded``: the
        # entries below that depth did).
        stack: list[list] = [[_NAN, _EMPTY, None, 0]]  # [end, fold, FLOPs, op index]
        top_end, acc, recorded = _NAN, _EMPTY, 1
        for rows in _python_chunks(swept):
            for start, kind, idx, end in rows:
                if top_end <= start:
                    stack.pop()
                    while stack[-1][0] <= start:
                        stack.pop()
                    top_end, acc = stack[-1][0], stack[-1][1]
                    if recorded > len(stack):
                        recorded = len(stack)
                if kind == launch_kind:  # the most common event: tested first
                    if recorded < len(stack):
                        fold.record(stack, recorded)
                        recorded = len(stack)
                    add_fold(acc)
                    continue
                if kind == op_kind:
                    acc, flops = push_op(acc, idx)
                    stack.append([end, acc, flops, idx])
                    top_end = end
                    continue
                # an annotation: an optimizer step opens its range (XPlane: ~100k)
                if acc[7] is None and opens_optimizer[idx]:
                    acc = (*acc[:7], idx, *acc[8:])
                stack.append([end, acc, None, idx])
                top_end = end
    call = np.concatenate(calls) if calls else np.empty(0, np.int64)
    return _launch_columns(profile, call.astype(np.int64, copy=False), folds), fold.flops


# the phases as Launches.phase codes
_PHASE_NAMES: tuple[str | None, ...] = (None, FORWARD, BACKWARD, OPTIMIZER_PHASE)
_NO_PHASE, _FORWARD, _BACKWARD, _OPTIMIZER = 0, 1, 2, 3
PHASE_CODES = {FORWARD: _FORWARD, BACKWARD: _BACKWARD, OPTIMIZER_PHASE: _OPTIMIZER}


class Launches:
    """Correlation id -> :class:`LaunchContext` of every linked launch, as columns (a 2 GB
    trace has 1.3 M launches: one Struct each in a dict held 464 MB; these columns ~60 MB).

    A mapping in the order the sweep met the launches (a correlation met twice: where it
    was first met, with what it was met with last, as a dict's assignment gives). Reading an
    entry makes its LaunchContext afresh; :meth:`contexts` makes those of many rows at once.
    Columns per row: ``corr``, ``launch_us`` (the call's start), ``phase`` (a code of
    ``_PHASE_NAMES``), ``flop_op`` and ``launch_op`` (-1: None) and ``kind``, an index into
    ``kinds``: (op shown, Tensor-Core eligible, input types, source), the objects themselves.
    """

    __slots__ = (
        "_dict",
        "_rows",
        "_sorted",
        "corr",
        "flop_op",
        "kind",
        "kinds",
        "launch_op",
        "launch_us",
        "phase",
    )

    def __init__(self, corr: Any, launch_us: np.ndarray, phase: np.ndarray,
                 flop_op: np.ndarray, launch_op: np.ndarray, kind: np.ndarray,
                 kinds: list[tuple[str | None, bool, list[str] | None, str | None]]) -> None:
        self.corr = corr  # int64 column, or a list where some id is no int64
        self.launch_us, self.phase, self.flop_op = launch_us, phase, flop_op
        self.launch_op, self.kind, self.kinds = launch_op, kind, kinds
        self._sorted: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._dict: dict[Any, int] | None = None

    def __len__(self) -> int:
        return len(self.launch_us)

    def __bool__(self) -> bool:
        return len(self.launch_us) > 0

    def keys(self) -> list[Any]:
        return self.corr.tolist() if isinstance(self.corr, np.ndarray) else list(self.corr)

    def ids(self, rows: np.ndarray) -> list[Any]:
        """The correlation ids of ``rows``."""
        if isinstance(self.corr, np.ndarray):
            return self.corr[rows].tolist()
        return [self.corr[i] for i in rows.tolist()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def row(self, corr: Any) -> int:
        """The row of correlation ``corr``, -1 for none."""
        if not isinstance(self.corr, np.ndarray):
            return self._lookup().get(corr, -1)
        if type(corr) is not int:  # an id of another type finds the int it equals
            try:
                if corr != int(corr):
                    return -1
                corr = int(corr)
            except (TypeError, ValueError, OverflowError):
                return -1
        if not -2**63 <= corr < 2**63:
            return -1
        srt, rows = self._index()
        at = int(np.searchsorted(srt, corr))
        return int(rows[at]) if at < len(srt) and srt[at] == corr else -1

    def rows(self, correlations: Sequence[Any]) -> np.ndarray:
        """:meth:`row` of each of ``correlations`` (None: -1), as an int64 column."""
        n = len(correlations)
        types = set(map(type, correlations))
        wanted = None
        if isinstance(self.corr, np.ndarray) and not types - {int, type(None)}:
            wanted = _int64(correlations if type(None) not in types else
                            [0 if c is None else c for c in correlations])
        if wanted is None:
            return np.fromiter(map(self.row, correlations), np.int64, n)
        srt, rows = self._index()
        if not len(srt):
            return np.full(n, -1, np.int64)
        at = np.minimum(np.searchsorted(srt, wanted), len(srt) - 1)
        found = srt[at] == wanted
        if type(None) in types:
            found &= np.fromiter([c is not None for c in correlations], bool, n)
        return np.where(found, rows[at], -1).astype(np.int64)

    def forget_index(self) -> None:
        """Drop the sorted copy of the ids that lookups use (made again when one comes):
        after the bulk lookup of the GPU activities only a few lookups are left."""
        self._sorted = self._rows = None

    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        if self._sorted is None or self._rows is None:
            self._rows = np.argsort(self.corr, kind="stable")
            self._sorted = self.corr[self._rows]
        return self._sorted, self._rows

    def _lookup(self) -> dict[Any, int]:
        if self._dict is None:  # ids that are not all int64: a dict (rare)
            self._dict = {c: i for i, c in enumerate(self.corr)}
        return self._dict

    def __contains__(self, corr: object) -> bool:
        try:
            return self.row(corr) >= 0
        except TypeError:  # unhashable
            return False

    def context(self, i: int) -> LaunchContext:
        """The LaunchContext of row ``i``."""
        op, eligible, types, source = self.kinds[int(self.kind[i])]
        f, lo = int(self.flop_op[i]), int(self.launch_op[i])
        return LaunchContext(float(self.launch_us[i]), op, eligible,
                             _PHASE_NAMES[int(self.phase[i])], None if f < 0 else f, types,
                             source, None if lo < 0 else lo)

    def contexts(self, rows: np.ndarray) -> list[LaunchContext | None]:
        """The LaunchContext of each row (-1: None); rows met twice share one."""
        if not len(rows):
            return []
        distinct, inverse = np.unique(rows, return_inverse=True)
        made: list[LaunchContext | None] = []
        real = distinct[distinct >= 0]
        if len(real) < len(distinct):
            made.append(None)  # -1 sorts first
        kinds, phases = self.kinds, _PHASE_NAMES
        for t, k, p, f, lo in zip(self.launch_us[real].tolist(), self.kind[real].tolist(),
                                  self.phase[real].tolist(), self.flop_op[real].tolist(),
                                  self.launch_op[real].tolist(), strict=True):
            op, eligible, types, source = kinds[k]
            made.append(LaunchContext(t, op, eligible, phases[p], None if f < 0 else f, types,
                                      source, None if lo < 0 else lo))
        return list(map(made.__getitem__, inverse.reshape(-1).tolist()))

    def __getitem__(self, corr: Any) -> LaunchContext:
        i = self.row(corr)
        if i < 0:
            raise KeyError(corr)
        return self.context(i)

    def get(self, corr: Any, default: Any = None) -> Any:
        i = self.row(corr)
        return self.context(i) if i >= 0 else default

    def values(self) -> list[LaunchContext]:
        return [c for c in self.contexts(np.arange(len(self))) if c is not None]

    def items(self) -> list[tuple[Any, LaunchContext]]:
        return list(zip(self.keys(), self.values(), strict=True))


def _launch_columns(profile: Profile, call: np.ndarray, folds: list[tuple]) -> Launches:
    """The sweep's launches (their runtime calls and folds, in sweep order) as columns: one
    row per correlation, closures split (:func:`_split_closures`)."""
    rt = profile.runtime
    correlation = columns.values(rt, "correlation")
    wide = np.int32 if len(profile.cpu_ops) < 2**31 else np.int64
    # each distinct fold once (told apart by identity: the folds are alive in ``folds``): its
    # kind, phase, FLOPs op, launching op and optimizer range
    ids = np.fromiter(map(id, folds), np.int64, len(folds))
    _, first, of = np.unique(ids, return_index=True, return_inverse=True)
    del ids
    of = of.reshape(-1)
    kind_of: dict[tuple[int, bool, int, int], int] = {}
    kinds: list[tuple[str | None, bool, list[str] | None, str | None]] = []
    per_fold: list[tuple[int, int, int, int, int]] = []
    for acc in map(folds.__getitem__, first.tolist()):
        (outer, _inner, is_elig, flop_op, types, source, launch_op, opt_range, backward,
         saw_op) = acc
        key = (id(outer), is_elig, id(types), id(source))
        k = kind_of.get(key)
        if k is None:
            k = kind_of[key] = len(kinds)
            kinds.append((outer, is_elig, types, source))
        # Backward wins over an enclosing optimizer step: closure optimizers (Lightning's
        # automatic optimisation, LBFGS) run forward and backward inside step(closure).
        if backward:
            phase = _BACKWARD
        elif opt_range is not None:
            phase = _OPTIMIZER
        else:  # no framework op around the launch (XLA, raw CUDA): unknown
            phase = _FORWARD if saw_op else _NO_PHASE
        per_fold.append((k, phase, -1 if flop_op is None else flop_op,
                         -1 if launch_op is None else launch_op,
                         -1 if opt_range is None else opt_range))
    table = np.array(per_fold or [(0, 0, -1, -1, -1)], np.int64).reshape(-1, 5)
    # the launch's start is the call's start_us (the same float, from its column)
    launch_us = columns.floats(rt, "start_us")[call]
    kind, phase = table[of, 0].astype(np.int32), table[of, 1].astype(np.int8)
    flop_op, launch_op, opt_range = (table[of, 2].astype(wide), table[of, 3].astype(wide),
                                     table[of, 4])
    # not None: only correlated calls were queued
    corr_values = list(map(correlation.__getitem__, call.tolist()))
    corr: Any = _int64(corr_values)
    if corr is not None:
        keep, in_opt = _last_of_each(corr, opt_range)
        corr = corr[keep]
    else:
        keep_list, in_opt_list = _last_of_each_py(corr_values, opt_range.tolist())
        keep, in_opt = np.array(keep_list, np.int64), np.array(in_opt_list, np.int64)
        corr = [corr_values[i] for i in keep_list]
    del corr_values
    launch_us, kind, phase = launch_us[keep], kind[keep], phase[keep]
    flop_op, launch_op = flop_op[keep], launch_op[keep]
    _split_closures(launch_us, phase, in_opt)
    return Launches(corr, launch_us, phase, flop_op, launch_op, kind, kinds)


def _int64(values: Sequence[Any]) -> np.ndarray | None:
    """``values`` as an int64 column when every one is an int (not a bool) that fits, else
    None."""
    if set(map(type, values)) - {int}:
        return None
    try:
        return np.array(values, np.int64) if len(values) else np.empty(0, np.int64)
    except OverflowError:
        return None


def _last_of_each(corr: np.ndarray, opt_range: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct correlation, in order of its first launch: the row of its last launch,
    and the optimizer range of its last launch inside one (-1: none), as assigning each
    launch to a dict in turn (``out[corr] = ...``, ``in_optimizer[corr] = ...``) leaves them."""
    n = len(corr)
    order = np.argsort(corr, kind="stable")
    ordered = corr[order]
    if n == 0 or (ordered[1:] != ordered[:-1]).all():  # each correlation launched once
        return np.arange(n), opt_range
    first = np.r_[True, ordered[1:] != ordered[:-1]]
    last = np.r_[ordered[1:] != ordered[:-1], True]
    group = np.cumsum(first) - 1  # per sorted position its correlation's group
    first_row, last_row = order[first], order[last]
    in_opt = np.full(len(first_row), -1, np.int64)
    # the last launch inside a range of each group: sorted positions ascend within a group
    at = np.flatnonzero(opt_range[order] >= 0)
    if len(at):
        at = at[np.r_[group[at][1:] != group[at][:-1], True]]
        in_opt[group[at]] = opt_range[order[at]]
    by_first = np.argsort(first_row, kind="stable")
    return last_row[by_first], in_opt[by_first]


def _last_of_each_py(corr: list[Any], opt_range: list[int]) -> tuple[list[int], list[int]]:
    """:func:`_last_of_each` for correlation ids that are not all int64."""
    last: dict[Any, int] = {}
    in_opt: dict[Any, int] = {}
    for i, (c, r) in enumerate(zip(corr, opt_range, strict=True)):
        last[c] = i
        if r >= 0:
            in_opt[c] = r
    return list(last.values()), [in_opt.get(c, -1) for c in last]


_OP, _ANNOTATION, _LAUNCH = 0, 1, 2
# (outer, inner, eligible, flop_op, input_types, source, launch_op, optimizer range, backward,
#  saw an op)
_EMPTY: tuple = (None, None, False, None, None, None, None, None, False, False)
_NAN = float("nan")
_START, _DUR, _TID = attrgetter("start_us"), attrgetter("dur_us"), attrgetter("tid")


def _host_annotations(profile: Profile) -> tuple[np.ndarray, np.ndarray, list[bool]]:
    """The host annotations' (``not on_gpu``, in the order of :attr:`_StackFold.host_ann`)
    start and duration columns, and whether each opens an optimizer step
    (:meth:`_StackFold.opens_optimizer`), from the report's shared columns of
    ``profile.annotations``: the bottleneck reads the same ones, so an XPlane's ~300k
    annotations are read once, not again here. Each distinct (name, kind) is judged once."""
    anns = profile.annotations
    n = len(anns)
    host = ~np.fromiter(columns.values(anns, "on_gpu"), bool, n)
    names, kinds = columns.values(anns, "name"), columns.values(anns, "kind")
    judged = {key: key[1] == OPTIMIZER or key[0].startswith("Optimizer.")
              for key in set(zip(names, kinds, strict=True))}
    opens = np.fromiter(map(judged.__getitem__, zip(names, kinds, strict=True)), bool, n)
    return (columns.floats(anns, "start_us")[host], columns.floats(anns, "dur_us")[host],
            opens[host].tolist())


def _sweeps(profile: Profile, host_ann: list[Annotation] | None,
            ann_columns: tuple[np.ndarray, np.ndarray] | None = None,
            inert_annotations: bool = False) -> Iterator[tuple[np.ndarray, ...]]:
    """Per launching thread: its ops, the host annotations and its correlated launches as
    (start, kind, index, end) columns, ordered by (start, -duration, kind, index). Threads
    that launch nothing are skipped: no launch of theirs needs a context. The annotations'
    (start, duration) columns are ``ann_columns`` where given (:func:`_host_annotations`),
    else read from ``host_ann``; ``inert_annotations`` (none opens an optimizer step): they
    are left out of the threads without ops."""
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
    if ann_columns is None:
        assert host_ann is not None
        ann_start = np.array([a.start_us for a in host_ann], np.float64)
        ann_dur = np.array([a.dur_us for a in host_ann], np.float64)
    else:
        ann_start, ann_dur = ann_columns
    n_ann = len(ann_start)
    no_ann = np.empty(0, np.float64)
    rt = profile.runtime
    rt_start = columns.floats(rt, "start_us")
    # Annotations carry no tid in the model: put them on every thread that launches work.
    for tid, calls in _launches_by_thread(rt).items():
        op_idx = (np.flatnonzero(op_tid == codes[tid]) if tid in codes
                  else np.empty(0, np.int64))
        call_start = rt_start[calls]
        # A thread without ops whose annotations open no optimizer step (``inert``): every
        # launch's context is the empty fold with or without them (an XPlane's ~300k
        # TraceMe ranges), and the launches keep their order, so they are left out.
        ann = (no_ann, no_ann, 0) if inert_annotations and not len(op_idx) else (
            ann_start, ann_dur, n_ann)
        starts = np.concatenate([op_start[op_idx], ann[0], call_start])
        durs = np.concatenate([op_dur[op_idx], ann[1], np.zeros(len(calls))])
        kinds = np.concatenate([np.full(len(op_idx), _OP), np.full(ann[2], _ANNOTATION),
                                np.full(len(calls), _LAUNCH)])
        index = np.concatenate([op_idx, np.arange(ann[2]), calls])
        order = _sweep_order(starts, durs, kinds, index)
        swept = _drop_closed(starts[order], kinds[order], index[order],
                               (starts + durs)[order])
        yield swept


SWEEP_CHUNK = 1 << 18  # events turned into Python objects at a time (a 2 GB trace: 3.4 M)


def _python_chunks(columns_: tuple[np.ndarray, ...]) -> Iterator[Iterator[tuple[Any, ...]]]:
    """The rows of the sweep's columns as Python values, converted a chunk at a time: the
    whole sweep as lists held ~370 MB at once on a 2 GB trace, the report's peak."""
    n = len(columns_[0])
    for at in range(0, n, SWEEP_CHUNK):
        yield zip(*(c[at:at + SWEEP_CHUNK].tolist() for c in columns_), strict=True)


def _as_python(columns_: tuple[np.ndarray, ...]) -> Iterator[tuple[Any, ...]]:
    """:func:`_python_chunks`' rows one after the other."""
    for rows in _python_chunks(columns_):
        yield from rows


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
        self._annotations = profile.annotations
        self._host_ann: list[Annotation] | None = None
        self.is_eligible = is_eligible
        self.names: dict[str, tuple[bool, bool, bool]] = {}  # backward, eligible, shown
        self.flops: dict[int, float] = {}  # op index -> its FLOPs, for ops a launch ran under
        self._flops_memo: dict[tuple[str, int, int], tuple[Any, Any, float | None]] = {}

    @property
    def host_ann(self) -> list[Annotation]:
        """The annotations of the host (not ``on_gpu``), made at first use (the sweep reads
        their columns instead: :func:`_host_annotations`)."""
        if self._host_ann is None:
            self._host_ann = [a for a in self._annotations if not a.on_gpu]
        return self._host_ann

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


def _split_closures(launch_us: np.ndarray, phase: np.ndarray, in_optimizer: np.ndarray
                    ) -> None:
    """Inside an optimizer step that ran backward (a closure), work launched before the last
    backward launch is the closure's forward pass, not the optimizer's update (``phase`` in
    place; ``in_optimizer``: per launch its optimizer range, -1 for none)."""
    inside = in_optimizer >= 0
    if not inside.any():
        return
    rng = in_optimizer[inside]
    times, phases = launch_us[inside], phase[inside]
    last_backward = np.full(int(rng.max()) + 1, -np.inf)
    backward = phases == _BACKWARD
    # the latest backward launch of each range (a NaN time never is: fmax skips it)
    np.fmax.at(last_backward, rng[backward], times[backward])
    split = (phases == _OPTIMIZER) & (times < last_backward[rng])
    at = np.flatnonzero(inside)[split]
    phase[at] = _FORWARD
