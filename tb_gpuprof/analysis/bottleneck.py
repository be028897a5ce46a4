"""What bounds each iteration: a critical-path account of every microsecond of it.

An iteration's time is either covered by GPU work or it is a gap in which the GPU waits for the
host. GPU-covered time is ``gpu`` (kernels), ``copy`` (only copies/memsets run) or
``communication`` (only collectives run). A gap is charged to what the host was doing while the
GPU waited, in this order of precedence:

``data_wait``  the host is inside a data-loader fetch (``enumerate(DataLoader)``, tf.data);
``sync``       the host is blocked in a synchronization (``cudaStreamSynchronize`` under
               ``.item()``, ``torch.cuda.synchronize``, XLA ``BlockHostUntilReady``), or it is
               re-filling the GPU's queue after one: a gap that opens while the host is blocked
               is the sync's cost, because without it the host would have run ahead;
``dispatch``   the host is inside framework ops or CUDA launch calls (eager overhead), or in
               short op-less glue between them (Python between two ops, < ``GLUE_MAX_US``);
``host``       the host runs no framework op for longer than that: Python, numpy, PIL,
               tokenisation, anything outside the framework.

The shares sum to the iteration time by construction. Framework-free: it reads the normalized
``Profile`` only (all three readers feed it). Host activity is taken from the threads that
launch GPU work (the main thread and PyTorch's autograd device thread), so a DataLoader's
pin-memory thread does not count as dispatch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import compress
from operator import attrgetter
from typing import Any

import numpy as np

from ..model import DATALOADER, KERNEL, OPTIMIZER, STEP, Profile
from . import columns
from .intervals import (
    Coverage,
    Intervals,
    length,
    merge,
    segment_sums,
    subtract,
    subtract_columns,
)

CLASSES = ("gpu", "copy", "communication", "dispatch", "host", "data_wait", "sync")
GLUE_MAX_US = 500.0  # op-less host stretches shorter than this are glue between ops (Python
# between two ops, inflated by the profiler's per-op bookkeeping: 200-300 us seen with stacks)
SYNC_EDGE_US = 2.0  # a sync that ends this close after the GPU idles still blocked it
VERDICT_MIN_PCT = 50.0  # below this no class alone bounds the iteration: "mixed"

HOST_SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                   "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize")
HOST_SYNC_EXACT = ("cudaMemcpy", "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cudaMemcpy2D")
XLA_SYNC_MARKERS = ("BlockHostUntilReady", "BlockUntilReady", "AwaitReady", "ToLiteral",
                    "CopyRawToHost")
LOADER_MARKERS = ("enumerate(DataLoader)", "IteratorGetNext", "Iterator::", "DataLoader")
_START, _DUR, _NAME = attrgetter("start_us"), attrgetter("dur_us"), attrgetter("name")
_TID, _CORRELATION = attrgetter("tid"), attrgetter("correlation")


# Names that show compiled code runs (torch.compile's regions and graphs as host ops and
# ranges, Inductor's Triton kernels, CUDA graph replays): eager advice does not apply.
COMPILED_OP_MARKERS = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph",
                       "torch_compile", "TorchDynamo", "CompiledFxGraph")
COMPILED_KERNEL_PREFIXES = ("triton_",)
GRAPH_LAUNCH_CALLS = ("cudaGraphLaunch", "cuGraphLaunch")
NO_GPU_VERDICT = ("no GPU activity: the trace holds no GPU kernels, copies or collectives (a "
                  "CPU-only run, or CUDA activity was not recorded), so nothing here waits "
                  "for a GPU and there is no GPU fix to make")


def compiled_code(profile: Profile, limit: int = 5) -> list[str]:
    """Up to ``limit`` distinct names in the trace that show compiled code runs."""
    found: list[str] = []
    for names, hit in (
            (columns.distinct(profile.gpu, "name"),
             lambda n: n.startswith(COMPILED_KERNEL_PREFIXES)),
            (columns.distinct(profile.runtime, "name"),
             lambda n: n.startswith(GRAPH_LAUNCH_CALLS)),
            (columns.distinct(profile.cpu_ops, "name"),
             lambda n: n.startswith(COMPILED_OP_MARKERS)),
            ([a.name for a in profile.annotations], lambda n: n.startswith(COMPILED_OP_MARKERS))):
        for name in sorted(set(names)):
            if len(found) >= limit:
                return found
            if hit(name):
                found.append(name)
    return found


@lru_cache(maxsize=1 << 16)  # asked for every runtime call: a trace has few distinct names
def is_host_sync(name: str) -> bool:
    """A host call that blocks until the device has finished (not a GPU-side stream wait)."""
    return (name.startswith(HOST_SYNC_CALLS) or name in HOST_SYNC_EXACT
            or any(m in name for m in XLA_SYNC_MARKERS))


@dataclass(slots=True)
class HostTimeline:
    """When the launching host threads were in a data fetch, a sync, or framework code."""

    data: Coverage
    sync: Coverage
    framework: Coverage
    blocking: set[int]  # correlations of the launches that block (pageable device-to-host)
    # op-less host time before each iteration's forward (input_prep): the input's own Python
    # work, short stretches included; the savings' replay moves it to workers
    prep: Coverage = field(default_factory=lambda: Coverage([]))
    # each iteration's forward and backward on the host (first forward kernel launch to last
    # backward launch): what torch.compile(model) compiles; empty when phases are unknown
    model: Coverage = field(default_factory=lambda: Coverage([]))
    # where the forward branches on GPU values (graph breaks): per iteration its first to last
    # forward sync, and the backward's span (first to last backward launch) that replays the
    # same per-branch structure; both empty without graph breaks (host_sync's replay fix)
    branches: Coverage = field(default_factory=lambda: Coverage([]))
    backward: Coverage = field(default_factory=lambda: Coverage([]))


def input_prep(host: HostTimeline, windows: Sequence[tuple[float, float]],
               forward_starts: Sequence[float | None]) -> tuple[float | None, Intervals]:
    """Host time per iteration spent preparing its input: from the iteration's start to its
    first forward kernel launch, the data-loader fetches and the op-less host work (Python,
    tokenisation, collate, numpy), short stretches included: before the forward no glue
    between two ops of the model runs. None when no iteration has a known forward. Also the
    op-less pieces, for the replay."""
    total, counted = 0.0, 0
    pieces: Intervals = []
    for (ws, _), fwd in zip(windows, forward_starts, strict=True):
        if fwd is None or fwd <= ws:
            continue
        counted += 1
        data = host.data.clip(ws, fwd)
        busy = merge(data + host.sync.clip(ws, fwd) + host.framework.clip(ws, fwd))
        opless = subtract([(ws, fwd)], busy)
        pieces += opless
        total += length(data) + length(opless)
    return (total / counted / 1e3 if counted else None), pieces


def _launch_tids(profile: Profile) -> set[int]:
    """Threads that launch GPU work (at least 1% of the launches)."""
    rt = profile.runtime
    tids = columns.values(rt, "tid")
    correlated = columns.present(rt, "correlation")
    if all(type(t) is int and abs(t) < 2**62 for t in set(tids)):  # counted in numpy
        distinct, _, n = np.unique(np.array(tids, np.int64)[correlated], return_index=True,
                                   return_counts=True)  # (return_index: no numpy.ma import)
        counts = dict(zip(distinct.tolist(), n.tolist(), strict=True))
    else:
        counts = Counter(compress(tids, correlated.tolist()))
    total = sum(counts.values())
    return {t for t, n in counts.items() if n >= 0.01 * total}


def pageable_copy_correlations(profile: Profile, *directions: str) -> set[int]:
    """Correlations of the copies (not kernels) to or from pageable memory whose name holds
    one of ``directions`` ("DtoH", "HtoD", ...), read off the GPU list's columns (the report
    reads them anyway), not its objects."""
    gpu = profile.gpu
    # each distinct name judged once: most traces hold no such copy, and then no pass
    names = {name for name in columns.distinct(gpu, "name")
             if "Pageable" in name and any(d in name for d in directions)}
    if not names:
        return set()
    return {c for c, kind, name in zip(columns.values(gpu, "correlation"),
                                       columns.values(gpu, "kind"),
                                       columns.values(gpu, "name"), strict=True)
            if kind != KERNEL and c is not None and name in names}


def blocking_copy_correlations(profile: Profile) -> set[int]:
    """Launches of device-to-host copies into pageable memory: the host call returns only
    when the copy (and everything queued before it) is done, as under ``.item()``/``.cpu()``."""
    return pageable_copy_correlations(profile, "DtoH")


def is_sync_call(name: str, correlation: int | None, blocking: set[int]) -> bool:
    return is_host_sync(name) or (correlation is not None and correlation in blocking)


def host_timeline(profile: Profile) -> HostTimeline:
    tids = _launch_tids(profile)
    blocking = blocking_copy_correlations(profile)
    data, sync, framework = _annotation_spans(profile.annotations)
    # Ops and runtime calls are most of the trace: columns, and each distinct name judged once.
    op_sync, op_other = _split_spans(profile.cpu_ops, tids, set())
    rt_sync, rt_other = _split_spans(profile.runtime, tids, blocking)
    return HostTimeline(Coverage.of_columns(*data), _union(sync, op_sync, rt_sync),
                        _union(framework, op_other, rt_other), blocking)


def _annotation_spans(annotations: Sequence[Any]) -> tuple[_Spans, _Spans, _Spans]:
    """(data fetch, sync, framework) [start, end) columns of the host annotations, each
    distinct (name, kind) judged once (an XPlane holds ~100k TraceMe ranges of a few names)."""
    n = len(annotations)
    names, kinds = columns.values(annotations, "name"), columns.values(annotations, "kind")
    classes = {key: _annotation_class(*key) for key in set(zip(names, kinds, strict=True))}
    cls = np.fromiter(map(classes.__getitem__, zip(names, kinds, strict=True)), np.int8, n)
    cls[np.fromiter(columns.values(annotations, "on_gpu"), bool, n)] = 3
    starts, ends = columns.floats(annotations, "start_us"), columns.ends(annotations)
    data, sync, framework = cls == 0, cls == 1, cls == 2
    return ((starts[data], ends[data]), (starts[sync], ends[sync]),
            (starts[framework], ends[framework]))


_Spans = tuple[np.ndarray, np.ndarray]


def _annotation_class(name: str, kind: str) -> int:
    """0: a data fetch, 1: a sync, 2: framework code, 3: none of these (step, optimizer)."""
    if kind == DATALOADER or name.startswith(LOADER_MARKERS):
        return 0
    if is_host_sync(name):
        return 1
    # TraceMe/NVTX ranges: XLA's dispatch (PjitFunction, Execute, DevicePut) and framework
    # ranges; the user's own record_function ranges hold ops anyway.
    return 2 if kind not in (STEP, OPTIMIZER) else 3


def _split_spans(items: Sequence[Any], tids: set[int], blocking: set[int]
                 ) -> tuple[_Spans, _Spans]:
    """(sync, other) [start, end) columns of the ops or runtime calls on the launching threads
    (all threads when none launches); sync as :func:`is_sync_call` says."""
    n = len(items)
    starts, ends = columns.floats(items, "start_us"), columns.ends(items)
    verdict = {name: is_host_sync(name) for name in columns.distinct(items, "name")}
    if any(verdict.values()):
        is_sync = np.fromiter(map(verdict.__getitem__, columns.values(items, "name")), bool, n)
    else:  # the usual case for ops: no name is a sync, no pass over them
        is_sync = np.zeros(n, dtype=bool)
    if blocking:
        is_sync |= np.fromiter(map(blocking.__contains__, columns.values(items, "correlation")),
                               bool, n)
    if tids and not tids.issuperset(columns.distinct(items, "tid")):
        on_host = np.fromiter(map(tids.__contains__, columns.values(items, "tid")), bool, n)
    else:  # no launching thread known, or every item on one
        on_host = np.ones(n, dtype=bool)
    sync, other = on_host & is_sync, on_host & ~is_sync
    if other.all():  # the usual case for ops: the columns as they are, not a copy of each
        return (starts[:0], ends[:0]), (starts, ends)
    return (starts[sync], ends[sync]), (starts[other], ends[other])


def _union(*spans: _Spans) -> Coverage:
    return Coverage.union(spans)


def _clip(cov: Coverage, a: float, b: float) -> Intervals:
    return cov.clip(a, b)


def gpu_intervals(profile: Profile, is_comm: Any) -> tuple[Coverage, Coverage, Coverage]:
    """(compute, copies/memsets, collectives) busy time over all devices and streams."""
    gpu = profile.gpu
    n = len(gpu)
    starts, ends = columns.floats(gpu, "start_us"), columns.ends(gpu)
    names, kinds = columns.values(gpu, "name"), columns.values(gpu, "kind")
    is_kernel = np.fromiter((k == KERNEL for k in kinds), bool, n)
    comm_names = {name: bool(is_comm(name)) for name in  # each kernel name judged once
                  {name for name, kind in zip(names, kinds, strict=True) if kind == KERNEL}}
    comm = is_kernel & np.fromiter((comm_names.get(name, False) for name in names), bool, n)
    compute = is_kernel & ~comm
    return (Coverage.of_columns(starts[compute], ends[compute]),
            Coverage.of_columns(starts[~is_kernel], ends[~is_kernel]),
            Coverage.of_columns(starts[comm], ends[comm]))


def iteration_shares(start: float, end: float, gpu: tuple[Coverage, Coverage, Coverage],
                     host: HostTimeline) -> dict[str, float]:
    """Microseconds of [start, end) charged to each class; they sum to ``end - start``."""
    out = dict.fromkeys(CLASSES, 0.0)
    compute = _clip(gpu[0], start, end)
    copies = subtract(_clip(gpu[1], start, end), compute)
    comm = subtract(subtract(_clip(gpu[2], start, end), compute), copies)
    out["gpu"], out["copy"], out["communication"] = length(compute), length(copies), length(comm)
    busy = merge(compute + copies + comm)
    gaps = subtract([(start, end)], busy)
    if gaps:
        # per gap what it adds to each host class, then the sums over the gaps in order
        for cls, parts in _charge_gaps(np.array(gaps, np.float64), host).items():
            out[cls] = float(np.cumsum(parts)[-1])
    return out


def window_shares(bounds: Sequence[tuple[float, float]],
                  gpu: tuple[Coverage, Coverage, Coverage], host: HostTimeline
                  ) -> list[dict[str, float]]:
    """:func:`iteration_shares` of every window [start, end) at once, with the same floats.

    Each window's copies are its copies minus its compute, which is the window's part of all
    copies minus all compute (and likewise for collectives and the busy union): the same
    set, and both are merged lists of picked ends, so the same intervals. So the differences
    are taken once over the whole trace and then cut at the window bounds in columns; every
    gap of every window is charged in one :func:`_charge_gaps` call (per gap, as before) and
    each window's sums run over its pieces left to right (segment_sums). Windows with
    ``end <= start`` go through iteration_shares (their cut may keep empty pieces)."""
    n = len(bounds)
    out = [dict.fromkeys(CLASSES, 0.0) for _ in range(n)]
    ws = np.array([b[0] for b in bounds], np.float64)
    we = np.array([b[1] for b in bounds], np.float64)
    regular = np.flatnonzero(we > ws)
    for i in np.flatnonzero(~(we > ws)).tolist():
        out[i] = iteration_shares(bounds[i][0], bounds[i][1], gpu, host)
    if not len(regular):
        return out
    ws, we = ws[regular], we[regular]
    m = len(regular)
    copies = _difference(gpu[1], gpu[0])
    comm = _difference(_difference(gpu[2], gpu[0]), copies)
    sums: dict[str, list[float | int]] = {}
    for cls, cov in (("gpu", gpu[0]), ("copy", copies), ("communication", comm)):
        q, ps, pe = cov.clip_columns(ws, we)
        total = segment_sums(np.where(0.0 > pe - ps, 0.0, pe - ps), q, m).tolist()
        # length() of no pieces is sum([]): the int 0
        sums[cls] = [t if c else 0 for t, c in zip(total, np.bincount(q, minlength=m).tolist(),
                                                   strict=True)]
    busy = Coverage.of_arrays(*(np.concatenate([c.arrays()[k] for c in (gpu[0], copies, comm)])
                                for k in (0, 1)))
    gap_q, gs, ge = _complements(busy, ws, we)
    charged: dict[str, list[float]] = {}
    has_gaps = np.bincount(gap_q, minlength=m) > 0
    if len(gap_q):
        charged = {cls: segment_sums(parts, gap_q, m).tolist()
                   for cls, parts in _charge_gaps(np.stack([gs, ge], axis=1), host).items()}
    for k, i in enumerate(regular.tolist()):
        shares = out[i]
        for cls, per_window in sums.items():
            shares[cls] = per_window[k]
        if has_gaps[k]:
            for cls, per_window in charged.items():
                shares[cls] = per_window[k]
    return out


def _difference(a: Coverage, b: Coverage) -> Coverage:
    """``a`` minus ``b`` as a columnar Coverage (subtract's pieces: picked ends)."""
    sa, ea, _ = a.arrays()
    sb, eb, _ = b.arrays()
    cut = subtract_columns(sa, ea, sb, eb)
    if cut is None:  # not reached: a Coverage's intervals are sorted and disjoint
        return Coverage(subtract(a.iv, b.iv))
    return Coverage.of_arrays(*cut)


def _complements(cov: Coverage, ws: np.ndarray, we: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per window [ws, we) (we > ws) what ``cov`` leaves of it: (window, start, end), each
    window's gaps in order, as ``subtract([(start, end)], cov.clip(start, end))`` gives."""
    m = len(ws)
    q, ps, pe = cov.clip_columns(ws, we)
    # per window the gap before each piece (from the window's start or the piece before),
    # then the one after its last piece
    new = np.r_[True, q[1:] != q[:-1]] if len(q) else np.empty(0, dtype=bool)
    before = np.where(new, ws[q], np.r_[0.0, pe[:-1]] if len(pe) else pe)
    last = np.full(m, -1)
    last[q] = np.arange(len(q))
    tail = np.where(last >= 0, pe[last] if len(pe) else ws, ws)
    gq = np.concatenate([q, np.arange(m)])
    gs, ge = np.concatenate([before, tail]), np.concatenate([ps, we])
    keep = ge > gs
    order = np.argsort(gq[keep], kind="stable")
    return gq[keep][order], gs[keep][order], ge[keep][order]


_HOST_CLASSES = ("data_wait", "host", "sync", "dispatch")


def _charge_gaps(gaps: np.ndarray, host: HostTimeline) -> dict[str, np.ndarray]:
    """What each gap ([n, 2] starts and ends) adds to the host classes, as :func:`_charge_gap`
    says. Most gaps meet no data fetch and no sync: for those only the framework pieces
    count, done in columns with _charge_gap's arithmetic; the others go through it."""
    gs, ge = np.ascontiguousarray(gaps[:, 0]), np.ascontiguousarray(gaps[:, 1])
    n = len(gs)
    involved = np.zeros(n, dtype=bool)
    for cov in (host.data, host.sync):
        involved[cov.clip_columns(gs, ge)[0]] = True
    out = {cls: np.zeros(n) for cls in _HOST_CLASSES}
    for i in np.flatnonzero(involved).tolist():
        parts = dict.fromkeys(CLASSES, 0.0)
        _charge_gap(float(gs[i]), float(ge[i]), host, parts)
        for cls in _HOST_CLASSES:
            out[cls][i] = parts[cls]
    simple = np.flatnonzero(~involved)
    glue, outside, framework = _framework_pieces(gs[simple], ge[simple], host.framework)
    dispatch = framework + glue
    if len(host.sync):
        edge = host.sync.overlaps(gs[simple] - SYNC_EDGE_US, gs[simple] + SYNC_EDGE_US) > 0
    else:
        edge = np.zeros(len(simple), dtype=bool)
    out["host"][simple] = outside
    out["sync"][simple] = np.where(edge, 0.0 + dispatch, 0.0)  # synced (0.0) + dispatch
    out["dispatch"][simple] = np.where(edge, 0.0, dispatch)
    return out


def _framework_pieces(gs: np.ndarray, ge: np.ndarray, framework: Coverage
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per gap with no data fetch or sync in it: (glue, outside, framework time), the sums
    _charge_gap forms, each added left to right (segment_sums)."""
    n = len(gs)
    query, ps, pe = framework.clip_columns(gs, ge)
    piece = pe - ps
    fw = segment_sums(np.where(0.0 > piece, 0.0, piece), query, n)  # length()'s max(d, 0.0)
    # what is left of each gap: before each piece (after the one before it) and after the last
    new = np.r_[True, query[1:] != query[:-1]] if len(query) else np.empty(0, dtype=bool)
    before = np.where(new, gs[query], np.r_[0.0, pe[:-1]] if len(pe) else pe)
    last = np.full(n, -1)
    last[query] = np.arange(len(query))  # the last piece of each gap
    tail_from = np.where(last >= 0, pe[last] if len(pe) else gs, gs)
    rest_s = np.concatenate([before, tail_from])
    rest_e = np.concatenate([ps, ge])
    rest_q = np.concatenate([query, np.arange(n)])
    keep = rest_e > rest_s  # subtract's pieces: "b start > cur" and "cur < e"
    order = np.argsort(rest_q[keep], kind="stable")  # per gap: its pieces in order, tail last
    rest_q, rest = rest_q[keep][order], (rest_e - rest_s)[keep][order]
    short = rest < GLUE_MAX_US
    glue = segment_sums(rest[short], rest_q[short], n)
    outside = segment_sums(rest[~short], rest_q[~short], n)
    return glue, outside, np.where(np.bincount(query, minlength=n) > 0, fw, 0.0)


def _charge_gap(gs: float, ge: float, host: HostTimeline, out: dict[str, float]) -> None:
    # A gap that meets a data fetch or a sync (_charge_gaps does the others in columns):
    # the subtractions of nothing are skipped; the sums are length()'s.
    data = host.data.clip(gs, ge)
    sync = host.sync.clip(gs, ge)
    framework = host.framework.clip(gs, ge)
    rest = [(gs, ge)]
    if data:
        sync, framework, rest = (subtract(sync, data), subtract(framework, data),
                                 subtract(rest, data))
    if sync:
        framework, rest = subtract(framework, sync), subtract(rest, sync)
    if framework:
        rest = subtract(rest, framework)
    glue = outside = 0.0
    for s, e in rest:
        if e - s < GLUE_MAX_US:
            glue += e - s
        else:
            outside += e - s
    dispatch = (length(framework) if framework else 0.0) + glue
    synced = length(sync) if sync else 0.0
    if data:
        out["data_wait"] += length(data)
    out["host"] += outside
    if len(host.sync) and host.sync.overlap(gs - SYNC_EDGE_US, gs + SYNC_EDGE_US) > 0:
        # The GPU ran dry while the host was blocked: re-filling its queue is the sync's cost.
        out["sync"] += synced + dispatch
    else:
        out["sync"] += synced
        out["dispatch"] += dispatch


def _minus(a: Intervals, b: Intervals) -> Intervals:
    return subtract(a, b) if b else a


def _corrected(mean: dict[str, float], profiled_ms: float,
               unprofiled_ms: float | None) -> dict[str, float] | None:
    """Shares rescaled to the un-profiled iteration time: the profiler inflates host time
    (per-op bookkeeping), not GPU time, so GPU classes keep their time and the host classes
    share what is left, in their profiled proportions."""
    if not unprofiled_ms or profiled_ms <= 0:
        return None
    device = sum(mean[c] for c in ("gpu", "copy", "communication"))
    host_total = profiled_ms - device
    room = max(unprofiled_ms - device, 0.0)
    scale = room / host_total if host_total > 0 else 0.0
    out = {c: (mean[c] if c in ("gpu", "copy", "communication") else mean[c] * scale)
           for c in CLASSES}
    total = sum(out.values())
    if total > unprofiled_ms > 0:  # the GPU alone is longer than the un-profiled period
        out = {c: v * unprofiled_ms / total for c, v in out.items()}
    return out


def _verdict(pct: dict[str, float], framework: str | None) -> tuple[str, str]:
    fw = {"pytorch": "PyTorch", "jax": "JAX", "tensorflow": "TensorFlow",
          "keras": "Keras"}.get(framework or "", "framework")
    top = max(CLASSES, key=lambda c: pct[c])
    share = round(pct[top])
    texts = {
        "gpu": f"GPU-bound: kernels run back to back {share}% of each iteration",
        "copy": f"copy-bound: {share}% of each iteration the GPU only copies data "
                "(host<->device transfers on the critical path)",
        "communication": f"communication-bound: {share}% of each iteration the GPU only runs "
                         "collectives (not overlapped with compute)",
        "dispatch": f"dispatch-bound: {share}% of each iteration the GPU waits while the host "
                    f"runs {fw} ops and launches kernels one by one",
        "host": f"host-bound: {share}% of each iteration the GPU waits for Python work outside "
                f"{fw} ops (data preparation, numpy, tokenisation, ...)",
        "data_wait": f"input-bound: {share}% of each iteration the GPU waits for the data "
                     "loader",
        "sync": f"sync-bound: {share}% of each iteration the GPU waits because the host "
                "blocked on a synchronization (.item(), .cpu(), synchronize) and then re-filled "
                "its queue",
    }
    if pct[top] < VERDICT_MIN_PCT:
        ranked = sorted(CLASSES, key=lambda c: -pct[c])[:2]
        return "mixed", (f"mixed: {_label(ranked[0])} {round(pct[ranked[0]])}% and "
                         f"{_label(ranked[1])} {round(pct[ranked[1]])}% of each iteration")
    return top, texts[top]


def _label(cls: str) -> str:
    return {"gpu": "GPU kernels", "copy": "copies", "communication": "communication",
            "dispatch": "op dispatch", "host": "host work outside ops",
            "data_wait": "data-loader wait", "sync": "host synchronization"}[cls]


def bottleneck_section(per_iteration: Sequence[dict[str, float]], steps: Iterable[int | None],
                       walls_us: Sequence[float], *, unprofiled_ms: float | None,
                       framework: str | None) -> dict[str, Any]:
    """The report's ``bottleneck`` section (docs/report-schema.md)."""
    n = max(len(per_iteration), 1)
    mean = {c: sum(it[c] for it in per_iteration) / n / 1e3 for c in CLASSES}
    wall_ms = sum(walls_us) / n / 1e3
    corrected = _corrected(mean, wall_ms, unprofiled_ms)
    basis = corrected or mean
    basis_total = sum(basis.values()) or 1.0
    pct = {c: 100.0 * basis[c] / basis_total for c in CLASSES}
    bound, verdict = _verdict(pct, framework)
    if corrected is not None:
        verdict += f" (corrected to the un-profiled {unprofiled_ms:.1f} ms iteration)"
    return {
        "bound": bound,
        "verdict": verdict,
        "basis": "unprofiled" if corrected is not None else "profiled",
        "mean_ms": {c: round(v, 4) for c, v in mean.items()},
        "mean_pct": {c: round(100.0 * mean[c] / wall_ms, 2) if wall_ms > 0 else 0.0
                     for c in CLASSES},
        "corrected_ms": ({c: round(v, 4) for c, v in corrected.items()}
                         if corrected is not None else None),
        "corrected_pct": ({c: round(v, 2) for c, v in pct.items()}
                          if corrected is not None else None),
        "items": [{"step": s, **{c: round(it[c] / 1e3, 4) for c in CLASSES}}
                  for s, it in zip(steps, per_iteration, strict=True)],
        "glue_max_us": GLUE_MAX_US,
        "note": None if corrected is not None else (
            "no un-profiled iteration time (an imported trace, or a hook run too short to "
            "measure one): host-side shares include the profiler's own per-op overhead"),
    }


__all__ = ["CLASSES", "NO_GPU_VERDICT", "HostTimeline", "bottleneck_section", "compiled_code",
           "gpu_intervals", "host_timeline", "input_prep", "is_host_sync", "iteration_shares",
           "window_shares"]
