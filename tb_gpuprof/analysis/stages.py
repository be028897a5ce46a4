"""The stages of :func:`tb_gpuprof.analysis.report.build_report`, each with typed inputs/outputs.

Data flows one way: select iterations -> link launches and assign GPU work to iterations ->
tally (classify each activity once: kernel table, Tensor Core totals, per-iteration breakdown,
what-if kernels) -> idle attribution -> sections (iterations, tensor cores, breakdown, phases,
bottleneck) -> distributed, throughput, rules -> savings. Only :func:`assign_to_iterations` and
:func:`tally_activities` visit every GPU activity (once each); the rest work per iteration, per
kernel name or per host event, so the split adds no pass over the trace.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from ..errors import EmptyProfileError
from ..model import DATALOADER, KERNEL, MEMCPY, MEMSET, GpuActivity, Profile
from . import columns
from .bottleneck import (
    GLUE_MAX_US,
    NO_GPU_VERDICT,
    HostTimeline,
    bottleneck_section,
    compiled_code,
    gpu_intervals,
    input_prep,
    is_host_sync,
    pageable_copy_correlations,
    window_shares,
)
from .classify import (
    KernelClass,
    classify_kernel,
    is_math_helper,
    is_tc_eligible_op,
    is_transform_conv_kernel,
)
from .demangle import demangle
from .intervals import Coverage, segment_sums
from .iterations import IterationPlan, IterationWindow, plan_iterations, select_windows
from .linking import (
    BACKWARD,
    FORWARD,
    OPTIMIZER_PHASE,
    PHASE_CODES,
    LaunchContext,
    Launches,
    link_launches,
)
from .roofline import Activities
from .savings import finalize, retime
from .whatif import (
    GPU_BOUND_HOST_SCALE,
    KernelTimes,
    Replay,
    SimKernel,
    build_replay,
    calibrate,
    calibrate_host,
    gpu_bound,
)

MAX_REPLAY_KERNELS = 100_000  # what-if re-timing replays at most this many GPU activities
PROFILER_OVERHEAD_WARN = 1.2  # window median / un-profiled median above this: say so
COMPUTE_EXCLUDED = {"memcpy", "memset", "communication", "layout"}
IDLE_CAUSES = ("data_loading", "cpu_ops", "launch_overhead", "synchronization", "other")
_DTYPE_PRECISION = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32",
                    "double": "fp64", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
                    "signed char": "int8", "bfloat16": "bf16", "half": "fp16", "float16": "fp16",
                    "float32": "fp32"}

Assigned = list[tuple[GpuActivity, LaunchContext | None]]  # one iteration's GPU work


@dataclass(slots=True)
class IterationSelection:
    """Stage 1: the iterations to analyse (bounds are moved to the GPU by stage 2)."""
    plan: IterationPlan
    windows: list[IterationWindow]
    warnings: list[str]


@dataclass(slots=True)
class Linked:
    """Stage 2: launches linked to their ops, and each iteration's GPU work."""
    launches: Launches
    op_flops: dict[int, float]
    per_window: list[Assigned]
    # the iterations' host-side bounds, before align_to_gpu moves them to the GPU's: allocator
    # events are host-side, so the memory section reads these
    host_windows: list[IterationWindow] = field(default_factory=list)
    # the assigned activities' times in per_window's order (read once, for the tally and the
    # what-if replay)
    times: KernelTimes | None = None


@dataclass(slots=True)
class WindowTally:
    """One iteration's GPU time by kind (µs) and the union of its activities."""
    breakdown_us: dict[str, float]
    busy: Coverage


class FlopEntries(NamedTuple):
    op: np.ndarray
    row: np.ndarray
    dur: np.ndarray
    is_math: np.ndarray
    rows: list[dict[str, Any]]


@dataclass(slots=True)
class Tally:
    """Stage 3: every assigned activity classified once and summed."""
    kernels: dict[tuple[str, str], dict[str, Any]]  # (kind, name) -> kernel-table row in making
    flop_groups: dict[int, list[tuple[dict[str, Any], float, bool]]]  # op -> (row, µs, is math)
    totals: dict[str, float]  # tc, elig, other, memory, comm, layout (µs)
    precision_us: dict[str, float]
    category_us: dict[str, float]
    phase_us: dict[str, float]
    phase_known: bool
    windows: list[WindowTally]
    sim_kernels: list[SimKernel]
    sim_counts: list[int]  # len(sim_kernels) after each iteration
    # flop_groups as columns, one entry per activity (tally_activities; tally_loop fills
    # flop_groups): the op whose FLOPs it shares (-1: none), its row in rows, its duration,
    # whether it is a math kernel, and the kernel-table rows
    flop_entries: FlopEntries | None = None
    sim_classes: np.ndarray | None = None  # per sim kernel its tally class (tally_activities)
    times: KernelTimes | None = None  # the activities' times, when assign gave them
    launch_op: np.ndarray | None = None  # per activity the op that launched it (-1: none)

    def activities(self) -> Activities | None:
        """The activities' rows, durations and ops, for the roofline (tally_activities)."""
        e = self.flop_entries
        if e is None or self.launch_op is None:
            return None
        return Activities(e.rows, e.row, e.dur, e.op, self.launch_op)


@dataclass(slots=True)
class KernelTable:
    """Stage 5: the finished kernel table, longest total first, and the GPU time it sums."""
    rows: list[dict[str, Any]]
    gpu_time_us: float


@dataclass(slots=True)
class IdleStage:
    """Stage 4: the per-iteration rows of the report and where idle GPU time went (µs)."""
    items: list[dict[str, Any]]
    idle_attribution_us: dict[str, float] = field(default_factory=dict)


def pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole > 0 else 0.0


# --- stage 1: iterations ----------------------------------------------------------------------

def select_iterations(profile: Profile, key: str | None, iter_start: int | None,
                      iter_stop: int | None) -> IterationSelection:
    """The iteration plan and the windows in [iter_start, iter_stop); none is an error."""
    if not profile.gpu and not profile.cpu_ops:
        raise EmptyProfileError(profile.source, "the trace holds no GPU or CPU activity")
    warnings: list[str] = []
    plan = plan_iterations(profile, key=key)
    if key and plan.method != "key_range" and plan.method != "profiler_step":
        warnings.append(f"no range named {key!r} in the trace; iterations from {plan.method}")
    windows = select_windows(plan, iter_start, iter_stop)
    if not windows:
        raise EmptyProfileError(
            profile.source, f"no iterations in [{iter_start}, {iter_stop}) "
            f"(the trace has {len(plan.windows)} by {plan.method})")
    return IterationSelection(plan, windows, warnings)


# --- stage 2: link and assign -----------------------------------------------------------------

def assign_to_iterations(profile: Profile, windows: list[IterationWindow]) -> Linked:
    """Link launches to ops, give each GPU activity to the iteration that launched it (GPU work
    lags the host), then move the windows' bounds to when their GPU work ran (in place)."""
    launches, op_flops = link_launches(profile, is_tc_eligible_op)
    gpu = profile.gpu
    n = len(gpu)
    correlation = columns.values(gpu, "correlation")
    rows = launches.rows(correlation)  # each activity's launch, -1 for none
    launches.forget_index()  # the sync sites' few lookups make it again (at 2 GB: 21 MB)
    linked = rows >= 0
    starts = columns.floats(gpu, "start_us")
    launched = starts.copy()  # the launch's time, else the activity's own start
    launched[linked] = launches.launch_us[rows[linked]]
    window = _window_of(windows, launched)
    retry = (window < 0) & linked
    window[retry] = _window_of(windows, starts[retry])  # launched outside every window
    if launches:
        # Launched before the trace began (e.g. in the profiler's warm-up step): backlog from
        # an earlier iteration, not work of the one it happens to overlap; left out.
        window[~linked & np.fromiter(map(bool, correlation), bool, n)] = -1
    assigned = np.flatnonzero(window >= 0)
    order = assigned[np.argsort(window[assigned], kind="stable")]  # by window, then in turn
    # a LaunchContext for each assigned activity's launch only (shared by its activities)
    pairs = list(zip(map(gpu.__getitem__, order.tolist()), launches.contexts(rows[order]),
                     strict=True))
    bounds = np.cumsum(np.bincount(window[assigned], minlength=len(windows))).tolist()
    per_window: list[Assigned] = [pairs[a:b] for a, b in zip([0, *bounds[:-1]], bounds,
                                                               strict=True)]
    host_windows = [IterationWindow(w.index, w.step, w.start_us, w.end_us) for w in windows]
    times = KernelTimes(starts[order], columns.floats(gpu, "dur_us")[order],
                        np.where(linked, launched, 0.0)[order], linked[order])
    ends = columns.ends(gpu)
    if np.isfinite(ends).all() and (ends != 0.0).all():
        _align_columns(windows, per_window, np.split(order, bounds[:-1]), starts, ends,
                       np.flatnonzero(window < 0))
    else:  # NaN or signed zeros: max()/min() order them otherwise than numpy
        align_to_gpu(windows, per_window, [gpu[i] for i in np.flatnonzero(window < 0).tolist()])
    return Linked(launches, op_flops, per_window, host_windows, times)


def _window_of(windows: list[IterationWindow], t: np.ndarray) -> np.ndarray:
    """Per time, the index of the window [start, end) holding it (the last one starting at
    or before it), -1 for none."""
    if not windows:
        return np.full(len(t), -1, np.int64)
    win_starts = np.array([w.start_us for w in windows], np.float64)
    win_ends = np.array([w.end_us for w in windows], np.float64)
    i = np.searchsorted(win_starts, t, "right") - 1
    inside = (i >= 0) & (t < win_ends[np.maximum(i, 0)])
    return np.where(inside, i, -1)


def align_to_gpu(windows: list[IterationWindow], per_window: list[Assigned],
                 unassigned: list[GpuActivity]) -> None:
    """Move iteration bounds from host ranges to when the iteration's work really finished.

    The host may run ahead of the GPU (nothing synchronizes), so a host step marker can be far
    shorter than the GPU work it launched. An iteration ends when both its host code and its GPU
    work are done, and the next one starts no earlier than that: in steady state the difference
    of consecutive ends is the iteration time whether the job is GPU- or host-bound. The first
    iteration may find the GPU still busy with work launched before it (recorded or not); it
    starts no earlier than that backlog's end, or its first kernel's start minus the host time
    before that kernel's launch.
    """
    prev_end: float | None = None
    for w, acts in zip(windows, per_window, strict=True):
        host_start = w.start_us
        if acts:
            w.end_us = max(w.end_us, max(a.start_us + a.dur_us for a, _ in acts))
        if prev_end is not None:
            w.start_us = max(host_start, prev_end)
        elif acts:
            first, ctx = min(acts, key=lambda ac: ac[0].start_us)
            backlog = [a.start_us + a.dur_us for a in unassigned if a.start_us < first.start_us]
            if backlog:
                w.start_us = max(host_start, min(max(backlog), first.start_us))
            elif ctx is not None:
                w.start_us = max(host_start, first.start_us - (ctx.launch_us - host_start))
        w.end_us = max(w.end_us, w.start_us)
        prev_end = w.end_us


def _align_columns(windows: list[IterationWindow], per_window: list[Assigned],
                   members: list[np.ndarray], starts: np.ndarray, ends: np.ndarray,
                   unassigned: np.ndarray) -> None:
    """:func:`align_to_gpu` from the activities' columns (``members``: each window's
    activities, as indices in trace order), for finite, non-zero ends: the same picks."""
    prev_end: float | None = None
    for w, acts, idx in zip(windows, per_window, members, strict=True):
        host_start = w.start_us
        if acts:
            w.end_us = max(w.end_us, float(ends[idx].max()))
        if prev_end is not None:
            w.start_us = max(host_start, prev_end)
        elif acts:
            k = int(np.argmin(starts[idx]))  # the first of the earliest, as min() picks
            first_start, ctx = float(starts[idx[k]]), acts[k][1]
            backlog = ends[unassigned][starts[unassigned] < first_start]
            if len(backlog):
                w.start_us = max(host_start, min(float(backlog.max()), first_start))
            elif ctx is not None:
                w.start_us = max(host_start, first_start - (ctx.launch_us - host_start))
        w.end_us = max(w.end_us, w.start_us)
        prev_end = w.end_us


# --- stage 3: classify and tally --------------------------------------------------------------

def _precision_from_types(types: list[str] | None, uses_tc: bool) -> str | None:
    if not types:
        return None
    for t in types:
        p = _DTYPE_PRECISION.get(t)
        if p:
            return "tf32" if (p == "fp32" and uses_tc) else p
    return None


def kernel_class(a: GpuActivity, ctx: LaunchContext | None) -> tuple[KernelClass, str, bool]:
    """The activity's class, its precision and whether Tensor Cores could run it."""
    cls = classify_kernel(a.name, a.kind)
    precision = cls.precision
    # Op input dtypes tell a math kernel's precision; for other kernels (casts, masks, indices
    # among the inputs) they would guess, so those stay "unknown".
    if precision == "unknown" and ctx is not None and (cls.tc_capable or cls.uses_tensor_cores):
        precision = _precision_from_types(ctx.input_types, cls.uses_tensor_cores) or precision
    eligible = cls.tc_capable or (ctx.eligible if ctx else False)
    if not eligible and (a.op_type or a.op):
        eligible = is_tc_eligible_op(a.op_type or a.op or "")
    if cls.category in COMPUTE_EXCLUDED:
        eligible = False
    return cls, precision, eligible


def _new_kernel_row(a: GpuActivity, cls: KernelClass, precision: str,
                    eligible: bool) -> dict[str, Any]:
    return {
        "name": a.name, "demangled": demangle(a.name) if a.kind == KERNEL else a.name,
        "kind": a.kind, "count": 0, "total_us": 0.0, "mean_us": 0.0,
        "min_us": a.dur_us, "max_us": a.dur_us, "pct": 0.0,
        "uses_tensor_cores": cls.uses_tensor_cores, "precision": precision,
        "category": cls.category, "tc_eligible": eligible, "_ops": {},
        "grid": list(a.grid) if a.grid else None,
        "block": list(a.block) if a.block else None,
        "registers": a.registers, "shared_mem": a.shared_mem,
        "occupancy_pct": a.occupancy, "flops": None, "bytes": None, "tflops": None,
        "flops_basis": None, "source": None,
    }


class _Judged(NamedTuple):
    """What tally_activities makes of one class of activities (same name, kind, op and
    launch eligibility): everything but the duration is the same for all of them."""

    cls: KernelClass
    precision: str
    eligible: bool
    row: dict[str, Any]  # the kernel-table row of (kind, name)
    buckets: tuple[str, ...]  # the totals it adds to, in _add_time's order
    breakdown: str  # its iteration breakdown key
    counts_precision: bool  # a kernel outside COMPUTE_EXCLUDED: precision_us counts it
    is_math: bool  # its time shares its op's FLOPs (kernel_table)


def _judge(a: GpuActivity, ctx: LaunchContext | None,
           kernels: dict[tuple[str, str], dict[str, Any]]) -> _Judged:
    cls, precision, eligible = kernel_class(a, ctx)
    row = kernels.get((a.kind, a.name))
    if row is None:  # made from the first activity of its name, as the table shows it
        row = kernels[(a.kind, a.name)] = _new_kernel_row(a, cls, precision, eligible)
    cat = cls.category
    buckets: tuple[str, ...]
    if a.kind in (MEMCPY, MEMSET) or cat in ("memcpy", "memset"):
        buckets, breakdown = ("memory",), "memory"
    elif cat == "communication":
        buckets, breakdown = ("comm", "other"), "communication"
    elif cls.uses_tensor_cores:
        buckets, breakdown = ("tc",), "tc_compute"
    elif eligible:
        buckets, breakdown = ("elig",), "non_tc_compute"
    elif cat == "layout":
        buckets, breakdown = ("other", "layout"), "layout"
    else:
        buckets, breakdown = ("other",), "non_tc_compute"
    is_math = ((cls.tc_capable or cls.uses_tensor_cores or cat in ("gemm", "conv", "attention"))
               and not is_math_helper(a.name))
    return _Judged(cls, precision, eligible, row, buckets, breakdown,
                   a.kind == KERNEL and cat not in COMPUTE_EXCLUDED, is_math)


def tally_activities(per_window: list[Assigned], times: KernelTimes | None = None) -> Tally:
    """Classify every assigned activity once and add it to the kernel table, the Tensor Core
    totals, its iteration's breakdown, the phases and the what-if kernel list.

    One pass in Python gives each activity its class (everything the sums read but its
    duration); the sums are then numpy's ``add.at`` over the classes' codes, which adds one
    value after the other in activity order, as the loop (:func:`tally_loop`) did.
    ``times``: the activities' time columns (``Linked.times``), not read again."""
    acts = [a for w in per_window for a, _ in w]
    if times is None or len(times.dur) != len(acts):
        start = np.fromiter(map(_START, acts), np.float64, len(acts))
        times = KernelTimes(start, np.fromiter(map(_DUR, acts), np.float64, len(acts)),
                            np.empty(0), np.empty(0, bool))
    dur = times.dur
    if not np.isfinite(dur).all() or np.signbit(dur).any():
        return tally_loop(per_window)
    classes = _Classes()
    cls_of, flop_op, launch_op, sim_kernels = classes.assign(per_window)
    t = classes.tally(per_window, acts, times.start, dur, np.array(cls_of, np.int64),
                      np.array(flop_op, np.int64), sim_kernels)
    t.sim_classes = np.array(cls_of, np.int64)
    t.launch_op = np.array(launch_op, np.int64)
    if len(times.launch) == len(acts):
        t.times = times
    return t


_DUR, _START = attrgetter("dur_us"), attrgetter("start_us")
_BUCKETS = ("tc", "elig", "other", "memory", "comm", "layout")
_BREAKDOWN = ("tc_compute", "non_tc_compute", "memory", "communication", "layout")
_PHASES = (FORWARD, BACKWARD, OPTIMIZER_PHASE)


class _Classes:
    """The classes of a window's activities: everything the tally adds an activity to but
    its duration (its judgement, kernel-table row, op name, phase), as numpy codes."""

    def __init__(self) -> None:
        self.judged: dict[tuple, _Judged] = {}  # as tally_loop's classes
        self.kernels: dict[tuple[str, str], dict[str, Any]] = {}
        self.rows: list[dict[str, Any]] = []  # the kernel table's rows, in order of making
        self.row_of: dict[int, int] = {}  # id(row) -> index in rows
        self.codes: list[tuple[int, ...]] = []  # per class: row, category, buckets, ...; see _new
        self.sim: list[tuple[str, str, bool, bool]] = []  # category, precision, uses_tc, elig
        self.categories: dict[str, int] = {}
        self.precisions: dict[str, int] = {}
        self.ops: dict[tuple[int, str], int] = {}  # (row, op name) -> code

    def assign(self, per_window: list[Assigned]
               ) -> tuple[list[int], list[int], list[int], list[SimKernel]]:
        """Each activity's class, the op whose FLOPs it shares and the op that launched it
        (-1: none) and its what-if kernel."""
        index: dict[tuple, int] = {}
        cls_of: list[int] = []
        flop_op: list[int] = []
        launch_op: list[int] = []
        sim_kernels: list[SimKernel] = []
        sim = self.sim
        for acts in per_window:
            for a, ctx in acts:
                if ctx is None:
                    key: tuple = (a.name, a.kind, a.op_type, a.op)
                else:
                    key = (a.name, a.kind, a.op_type, a.op, ctx.eligible, id(ctx.input_types),
                           ctx.op, ctx.source, ctx.phase)
                c = index.get(key)
                if c is None:
                    c = index[key] = self._new(a, ctx)
                cls_of.append(c)
                category, precision, uses_tc, eligible = sim[c]  # (a call with *sim: slower)
                if ctx is None:
                    flop_op.append(-1)
                    launch_op.append(-1)
                    sim_kernels.append(SimKernel(a, None, category, precision, uses_tc,
                                                 eligible))
                else:
                    f, op = ctx.flop_op, ctx.launch_op
                    flop_op.append(-1 if f is None else f)
                    launch_op.append(-1 if op is None else op)
                    sim_kernels.append(SimKernel(a, ctx.launch_us, category, precision, uses_tc,
                                                 eligible))
        return cls_of, flop_op, launch_op, sim_kernels

    def _new(self, a: GpuActivity, ctx: LaunchContext | None) -> int:
        key = (a.name, a.kind, a.op_type, a.op, None) if ctx is None else (
            a.name, a.kind, a.op_type, a.op, ctx.eligible, id(ctx.input_types))
        judged = self.judged.get(key)
        if judged is None:
            judged = self.judged[key] = _judge(a, ctx, self.kernels)
        k = judged.row
        row = self.row_of.get(id(k))
        if row is None:
            row = self.row_of[id(k)] = len(self.rows)
            self.rows.append(k)
        if ctx is not None and ctx.source and not k["source"]:
            k["source"] = ctx.source  # the first activity of the row with a source
        op_name = (ctx.op if ctx else None) or a.op
        op_code = -1
        if op_name:
            op_code = self.ops.setdefault((row, op_name), len(self.ops))
            k["_ops"].setdefault(op_name, 0.0)  # the ops in order of their first activity
        cls = judged.cls
        buckets = [_BUCKETS.index(b) for b in judged.buckets]
        phase = ctx.phase if ctx is not None else None
        self.codes.append((
            row, self.categories.setdefault(cls.category, len(self.categories)),
            buckets[0], buckets[1] if len(buckets) > 1 else -1,
            _BREAKDOWN.index(judged.breakdown),
            self.precisions.setdefault(judged.precision, len(self.precisions))
            if judged.counts_precision else -1,
            -1 if phase is None else _PHASES.index(phase), op_code, int(judged.is_math)))
        self.sim.append((cls.category, judged.precision, cls.uses_tensor_cores, judged.eligible))
        return len(self.codes) - 1

    def tally(self, per_window: list[Assigned], acts: list[GpuActivity], start: np.ndarray,
              dur: np.ndarray, cls_of: np.ndarray, flop_op: np.ndarray,
              sim_kernels: list[SimKernel]) -> Tally:
        n = len(acts)
        codes = np.array(self.codes or [(0,) * 9], np.int64).reshape(-1, 9)[cls_of]
        row, cat, b1, b2, bd, prec, phase, op_code, is_math = codes.T
        totals = _sums(np.concatenate([b1, b2]), np.concatenate([dur, dur]), len(_BUCKETS),
                       order=np.argsort(np.concatenate([np.arange(n), np.arange(n)]),
                                        kind="stable"))
        phase_us = _sums(phase, dur, len(_PHASES))
        t = Tally(kernels=self.kernels, flop_groups={},
                  totals=dict(zip(_BUCKETS, totals.tolist(), strict=True)),
                  precision_us=dict(zip(self.precisions, _sums(prec, dur, len(
                      self.precisions)).tolist(), strict=True)),
                  category_us=dict(zip(self.categories, _sums(cat, dur, len(
                      self.categories)).tolist(), strict=True)),
                  phase_us=dict(zip(_PHASES, phase_us.tolist(), strict=True)),
                  phase_known=bool((phase >= 0).any()), windows=[], sim_kernels=sim_kernels,
                  sim_counts=np.cumsum([len(w) for w in per_window]).tolist())
        self._rows(acts, dur, row, op_code)
        t.flop_entries = FlopEntries(flop_op, row, dur, is_math.astype(bool), self.rows)
        window = np.repeat(np.arange(len(per_window)), [len(w) for w in per_window])
        per_bd = _sums(window * len(_BREAKDOWN) + bd, dur,
                       len(per_window) * len(_BREAKDOWN)).reshape(-1, len(_BREAKDOWN))
        end = start + dur
        at = 0
        for w, sums in zip(per_window, per_bd.tolist(), strict=True):
            t.windows.append(WindowTally(dict(zip(_BREAKDOWN, sums, strict=True)),
                                         Coverage.of_columns(start[at:at + len(w)],
                                                             end[at:at + len(w)])))
            at += len(w)
        return t

    def _rows(self, acts: list[GpuActivity], dur: np.ndarray, row: np.ndarray,
              op_code: np.ndarray) -> None:
        """Count, total, min, max, bytes and per-op time of every kernel-table row."""
        r = len(self.rows)
        count = np.bincount(row, minlength=r).tolist()
        total = _sums(row, dur, r).tolist()
        low, high = np.full(r, np.inf), np.full(r, -np.inf)
        np.minimum.at(low, row, dur)
        np.maximum.at(high, row, dur)
        for k, c, tot, lo, hi in zip(self.rows, count, total, low.tolist(), high.tolist(),
                                     strict=True):
            k["count"] += c
            k["total_us"] += tot
            k["min_us"], k["max_us"] = min(k["min_us"], lo), max(k["max_us"], hi)
        for i, a in enumerate(acts):
            if a.bytes:
                k = self.rows[row[i]]
                k["bytes"] = (k["bytes"] or 0) + a.bytes
        op_us = _sums(op_code, dur, len(self.ops)).tolist()
        for (at, name), code in self.ops.items():
            self.rows[at]["_ops"][name] = op_us[code]


def _sums(code: np.ndarray, values: np.ndarray, n: int,
          order: np.ndarray | None = None) -> np.ndarray:
    """Per code in 0..n-1, its values added left to right from 0.0 (codes < 0 are left out;
    ``order``: the order to add them in, else as they come)."""
    if order is not None:
        code, values = code[order], values[order]
    keep = code >= 0
    return segment_sums(values[keep], code[keep], n)


def tally_loop(per_window: list[Assigned]) -> Tally:
    """:func:`tally_activities` one activity at a time: for durations that are not finite or
    have their sign bit set (numpy's minimum/maximum order those otherwise than min()/max()),
    and the reference its columns are tested against."""
    t = Tally(kernels={}, flop_groups={},
              totals={"tc": 0.0, "elig": 0.0, "other": 0.0, "memory": 0.0, "comm": 0.0,
                      "layout": 0.0},
              precision_us={}, category_us={},
              phase_us={FORWARD: 0.0, BACKWARD: 0.0, OPTIMIZER_PHASE: 0.0}, phase_known=False,
              windows=[], sim_kernels=[], sim_counts=[])
    # locals, not attribute lookups, in the one loop over every activity
    totals, kernels, sim_kernels = t.totals, t.kernels, t.sim_kernels
    category_us, precision_us, phase_us = t.category_us, t.precision_us, t.phase_us
    flop_groups = t.flop_groups
    phase_known = False
    # each class judged once; input type lists are shared between ops by the reader and live
    # as long as the launches that hold them
    classes: dict[tuple, _Judged] = {}
    for acts in per_window:
        bd = {"tc_compute": 0.0, "non_tc_compute": 0.0, "memory": 0.0, "communication": 0.0,
              "layout": 0.0}
        busy_iv = []
        for a, ctx in acts:
            key = (a.name, a.kind, a.op_type, a.op, None) if ctx is None else (
                a.name, a.kind, a.op_type, a.op, ctx.eligible, id(ctx.input_types))
            judged = classes.get(key)
            if judged is None:
                judged = classes[key] = _judge(a, ctx, kernels)
            cls = judged.cls
            sim_kernels.append(SimKernel(a, ctx.launch_us if ctx else None, cls.category,
                                         judged.precision, cls.uses_tensor_cores,
                                         judged.eligible))
            dur = a.dur_us
            busy_iv.append((a.start_us, a.start_us + dur))
            cat = cls.category
            category_us[cat] = category_us.get(cat, 0.0) + dur
            for bucket in judged.buckets:
                totals[bucket] += dur
            bd[judged.breakdown] += dur
            if judged.counts_precision:
                precision_us[judged.precision] = precision_us.get(judged.precision, 0.0) + dur
            if ctx is not None and ctx.phase is not None:
                phase_known = True
                phase_us[ctx.phase] += dur
            k = judged.row
            k["count"] += 1
            k["total_us"] += dur
            k["min_us"] = min(k["min_us"], dur)
            k["max_us"] = max(k["max_us"], dur)
            if a.bytes:
                k["bytes"] = (k["bytes"] or 0) + a.bytes
            op_name = (ctx.op if ctx else None) or a.op
            if op_name:
                k["_ops"][op_name] = k["_ops"].get(op_name, 0.0) + dur
            if ctx is not None:
                if ctx.source and not k["source"]:
                    k["source"] = ctx.source
                if ctx.flop_op is not None:
                    flop_groups.setdefault(ctx.flop_op, []).append((k, dur, judged.is_math))
        t.sim_counts.append(len(sim_kernels))
        t.windows.append(WindowTally(bd, Coverage(busy_iv)))
    t.phase_known = phase_known
    return t


# --- stage 4: idle attribution ----------------------------------------------------------------

def _idle_coverages(profile: Profile, blocking: set[int]) -> list[tuple[str, Coverage]]:
    """What the host may have been doing while the GPU idled, in the order gaps are charged.

    A runtime call is a synchronization when the bottleneck analysis calls it one
    (bottleneck.is_sync_call: the host-blocking sync calls, blocking memcpy by exact name and
    pageable device-to-host copies), so ``cudaMemcpyAsync`` and the GPU-side
    ``cudaStreamWaitEvent`` are launch overhead, not a host sync."""
    dl_cov = Coverage([(x.start_us, x.start_us + x.dur_us) for x in profile.annotations
                       if x.kind == DATALOADER and not x.on_gpu])
    # Runtime calls and ops are most of the trace: columns, no tuple per event, and each
    # distinct runtime call name judged once.
    rt = profile.runtime
    starts, ends = columns.floats(rt, "start_us"), columns.ends(rt)
    is_sync = sync_call_mask(profile, blocking)
    sync_cov = Coverage.of_columns(starts[is_sync], ends[is_sync])
    launch_cov = Coverage.of_columns(starts[~is_sync], ends[~is_sync])
    cpu_cov = Coverage.of_spans(profile.cpu_ops)
    return [("data_loading", dl_cov), ("synchronization", sync_cov),
            ("launch_overhead", launch_cov), ("cpu_ops", cpu_cov)]


def sync_call_mask(profile: Profile, blocking: set[int]) -> np.ndarray:
    """Per runtime call, whether bottleneck.is_sync_call says it is a synchronization (each
    distinct name judged once); ``blocking``: the blocking copies' correlations."""
    rt = profile.runtime
    host_sync = {name: is_host_sync(name) for name in columns.distinct(rt, "name")}
    is_sync = np.fromiter(map(host_sync.__getitem__, columns.values(rt, "name")), bool, len(rt))
    if blocking:
        is_sync |= np.fromiter(map(blocking.__contains__, columns.values(rt, "correlation")),
                               bool, len(rt))
    return is_sync


def attribute_idle(profile: Profile, windows: list[IterationWindow], tallies: list[WindowTally],
                   blocking: set[int]) -> IdleStage:
    """Each iteration's row (wall, busy, breakdown, idle) and the idle time by host cause;
    ``blocking``: the correlations of blocking copies (``HostTimeline.blocking``)."""
    causes = _idle_coverages(profile, blocking)
    items: list[dict[str, Any]] = []
    idles: list[float] = []
    for w, wt in zip(windows, tallies, strict=True):
        # Work launched in this iteration may run past its end (GPU lags the host): its union is
        # the iteration's busy time, and idle is what is left of the wall time.
        busy_all = wt.busy.total()
        idle = max(w.wall_us - busy_all, 0.0)
        idles.append(idle)
        items.append({
            "step": w.step, "start_us": round(w.start_us, 3), "wall_ms": round(w.wall_us / 1e3, 4),
            "gpu_busy_ms": round(min(busy_all, w.wall_us) / 1e3, 4),
            "breakdown_ms": {**{k: round(v / 1e3, 4) for k, v in wt.breakdown_us.items()},
                             "idle": round(idle / 1e3, 4)},
        })
    return IdleStage(items, _charge_idle(windows, tallies, idles, causes))


def _charge_idle(windows: list[IterationWindow], tallies: list[WindowTally], idles: list[float],
                 causes: list[tuple[str, Coverage]]) -> dict[str, float]:
    """What was the host doing while the GPU had nothing? Attribute each iteration's gaps in
    priority order, then scale so its attribution sums to its idle time.

    All gaps of all idle iterations at once: each cause takes what it covers of what is left
    of a gap; each iteration's sums run over its gaps left to right (segment_sums), then are
    added to the totals iteration by iteration, as the loop over iterations did."""
    idle_attr = dict.fromkeys(IDLE_CAUSES, 0.0)
    charged = [i for i, idle in enumerate(idles) if idle > 0]
    gaps = [tallies[i].busy.gap_columns(windows[i].start_us, windows[i].end_us)
            for i in charged]
    gap_of = np.repeat(np.arange(len(charged)), [len(gs) for gs, _ in gaps])
    gs = np.concatenate([gs for gs, _ in gaps] or [np.empty(0)])
    ge = np.concatenate([ge for _, ge in gaps] or [np.empty(0)])
    left = ge - gs
    sums: dict[str, list[float]] = {}
    for name, cov in causes:
        part = np.minimum(left, cov.overlaps(gs, ge))
        sums[name] = segment_sums(part, gap_of, len(charged)).tolist()
        left = left - part
    sums["other"] = segment_sums(left, gap_of, len(charged)).tolist()
    for k, i in enumerate(charged):
        attr = {name: sums[name][k] for name in IDLE_CAUSES}
        gap_total = sum(attr.values())
        for name, v in attr.items():
            idle_attr[name] += v * idles[i] / gap_total if gap_total > 0 else 0.0
        if gap_total <= 0:
            idle_attr["other"] += idles[i]
    return idle_attr


# --- stage 5: sections ------------------------------------------------------------------------

def kernel_table(tally: Tally, op_flops: dict[int, float]) -> KernelTable:
    """The kernel table, longest total first: FLOPs recorded on an op go to the math kernels it
    launched, split by their time; rows are finished (mean, pct, top ops, rounding)."""
    if tally.flop_entries is not None:
        _share_flops(tally.flop_entries, op_flops)
    for op_idx, group in tally.flop_groups.items():
        flops = op_flops.get(op_idx, 0.0)
        math = [g for g in group if g[2]]  # casts/copies under a conv op do none of its math
        if not math:
            continue
        tot = sum(d for _, d, _ in math) or 1.0
        transform = flops > 0 and any(_is_transform_conv(k) for k, _, _ in math)
        for k, d, _ in math:
            k["flops"] = (k["flops"] or 0.0) + flops * d / tot
            if transform:
                k["flops_basis"] = DIRECT_CONV_EQUIVALENT

    gpu_time = sum(k["total_us"] for k in tally.kernels.values())
    kernel_list = sorted(tally.kernels.values(), key=lambda k: -k["total_us"])
    for k in kernel_list:
        k["mean_us"] = k["total_us"] / k["count"]
        k["pct"] = pct(k["total_us"], gpu_time)
        ops = k.pop("_ops")
        k["ops"] = [n for n, _ in sorted(ops.items(), key=lambda kv: -kv[1])[:5]]
        if not k["flops"]:
            k["flops_basis"] = None
        elif k["flops_basis"] is None:
            k["flops_basis"] = "counted"
            # only FLOPs the kernel executes make a rate of the kernel (flops_basis)
            k["tflops"] = round(k["flops"] / (k["total_us"] * 1e6), 3) if k["total_us"] else None
        for f in ("total_us", "mean_us", "min_us", "max_us"):
            k[f] = round(k[f], 3)
    return KernelTable(kernel_list, gpu_time)


# A kernel row's flops_basis (docs/report-schema.md#kernels) when an op it shares FLOPs of ran
# an FFT or Winograd convolution. Such a convolution does fewer multiply-adds than the direct
# one its op's FLOPs count (and the FFT's complex arithmetic and transforms are not
# multiply-adds of the model at all), and how many depends on tile and transform sizes cuDNN
# picks inside the call, which no trace records. So the work done is not countable: the FLOPs
# stay on the row as the direct convolution's equivalent (the model FLOPs MFU counts, whatever
# the algorithm), with no TFLOP/s of the kernel, and the roofline leaves them out.
DIRECT_CONV_EQUIVALENT = "direct_conv_equivalent"


def _is_transform_conv(k: dict[str, Any]) -> bool:
    """A kernel row of an FFT or Winograd convolution (its name, under a convolution op)."""
    if not is_transform_conv_kernel(k["name"]):
        return False
    return k["category"] == "conv" or any("conv" in op.lower() for op in k["_ops"])


def _share_flops(entries: FlopEntries, op_flops: dict[int, float]) -> None:
    """kernel_table's split of each op's FLOPs over its math kernels, from the columns: the
    ops in order of their first activity, each op's math kernels in activity order (the
    order the loop over flop_groups added them in)."""
    has_op = entries.op >= 0
    op = entries.op[has_op]
    if not len(op):
        return
    ops, first, code = np.unique(op, return_index=True, return_inverse=True)
    rank = np.empty(len(ops), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(ops))
    math = entries.is_math[has_op]  # casts/copies under a conv op do none of its math
    code, row, dur = code[math], entries.row[has_op][math], entries.dur[has_op][math]
    tot = segment_sums(dur, code, len(ops))
    tot = np.where(tot == 0.0, 1.0, tot)  # sum(...) or 1.0
    flops = np.array([op_flops.get(i, 0.0) for i in ops.tolist()], np.float64)
    order = np.argsort(rank[code], kind="stable")
    share = (flops[code] * dur / tot[code])[order]
    row = row[order]
    sums = segment_sums(share, row, len(entries.rows)).tolist()
    # the rows it touched, ascending (np.unique without indices imports numpy.ma: 20 ms)
    for r in np.flatnonzero(np.bincount(row, minlength=len(entries.rows))).tolist():
        k = entries.rows[r]
        k["flops"] = (k["flops"] or 0.0) + sums[r]
    _mark_transform_ops(entries.rows, code[order], row, flops)


def _mark_transform_ops(rows: list[dict[str, Any]], code: np.ndarray, row: np.ndarray,
                        flops: np.ndarray) -> None:
    """Every math row of an op with FLOPs one of whose math kernels is an FFT or Winograd
    convolution's shares a direct-convolution equivalent (``code``/``row``: per math activity
    its op and its row)."""
    transform_row = np.fromiter(map(_is_transform_conv, rows), bool, len(rows))
    if not transform_row[row].any():
        return
    transform_op = np.zeros(len(flops), bool)
    transform_op[code[transform_row[row]]] = True
    transform_op &= flops > 0
    for r in np.flatnonzero(np.bincount(row[transform_op[code]],
                                        minlength=len(rows))).tolist():
        rows[r]["flops_basis"] = DIRECT_CONV_EQUIVALENT


def unprofiled_median(unprofiled: Any) -> float | None:
    """The hook's median iteration period outside the window (``env["unprofiled"]``)."""
    if not isinstance(unprofiled, dict):
        return None
    v = unprofiled.get("median_ms")
    return float(v) if isinstance(v, int | float) and v > 0 else None


def iterations_section(sel: IterationSelection, items: list[dict[str, Any]],
                       unprofiled: Any) -> dict[str, Any]:
    """The report's ``iterations``; warns (into ``sel.warnings``) when the profiler slowed the
    window well past the un-profiled time."""
    windows = sel.windows
    walls = [w.wall_us / 1e3 for w in windows]
    median_ms = statistics.median(walls)
    unprofiled_ms = unprofiled_median(unprofiled)
    overhead = round(median_ms / unprofiled_ms, 3) if unprofiled_ms else None
    if overhead is not None and overhead > PROFILER_OVERHEAD_WARN:
        sel.warnings.append(
            f"the profiler slowed the window's iterations {overhead:.2f}x ({median_ms:.1f} ms "
            f"vs {unprofiled_ms:.1f} ms un-profiled): host-side figures are shown against the "
            "un-profiled time")
    busy_total = sum(it["gpu_busy_ms"] for it in items) * 1e3
    step_range, range_kind = _step_range(windows)
    return {
        "method": sel.plan.method, "key": sel.plan.key, "count": len(windows),
        "range": step_range, "range_kind": range_kind,
        "mean_ms": round(statistics.fmean(walls), 4),
        "median_ms": round(median_ms, 4),
        "min_ms": round(min(walls), 4), "max_ms": round(max(walls), 4),
        "p95_ms": round(_percentile(walls, 95), 4),
        "gpu_busy_mean_ms": round(busy_total / len(windows) / 1e3, 4),
        "unprofiled_median_ms": round(unprofiled_ms, 4) if unprofiled_ms else None,
        "unprofiled_source": (unprofiled or {}).get("source") if unprofiled_ms else None,
        "profiler_overhead_ratio": overhead,
        "items": items,
    }


def tensor_core_section(totals: dict[str, float], gpu_time: float) -> dict[str, Any]:
    eligible_total = totals["tc"] + totals["elig"]
    return {
        "tc_us": round(totals["tc"], 3), "eligible_not_tc_us": round(totals["elig"], 3),
        "other_us": round(totals["other"], 3), "memory_us": round(totals["memory"], 3),
        "tc_pct": pct(totals["tc"], gpu_time),
        "eligible_not_tc_pct": pct(totals["elig"], gpu_time),
        "other_pct": pct(totals["other"], gpu_time),
        "memory_pct": pct(totals["memory"], gpu_time),
        "tc_kernel_efficiency_pct": pct(totals["tc"], eligible_total)
        if eligible_total > 0 else None,
    }


def breakdown_section(windows: list[IterationWindow], idle: IdleStage,
                      totals: dict[str, float]) -> dict[str, Any]:
    items = idle.items
    busy_total = sum(it["gpu_busy_ms"] for it in items) * 1e3
    return {
        "wall_us": round(sum(w.wall_us for w in windows), 3), "gpu_busy_us": round(busy_total, 3),
        "tc_compute_us": round(sum(i["breakdown_ms"]["tc_compute"] for i in items) * 1e3, 3),
        "non_tc_compute_us": round(
            sum(i["breakdown_ms"]["non_tc_compute"] for i in items) * 1e3, 3),
        "memory_us": round(totals["memory"], 3),
        "communication_us": round(totals["comm"], 3),
        "layout_us": round(totals["layout"], 3),
        "idle_us": round(sum(i["breakdown_ms"]["idle"] for i in items) * 1e3, 3),
        "idle_attribution_us": {k: round(v, 3) for k, v in idle.idle_attribution_us.items()},
    }


def phases_section(tally: Tally, gpu_time: float, n_windows: int) -> dict[str, Any] | None:
    """Forward/backward/optimizer GPU time per iteration, when autograd marked the launches."""
    if not tally.phase_known:
        return None
    phase_us = tally.phase_us
    return {"method": "autograd",
            **{f"{p}_ms": round(v / n_windows / 1e3, 4) for p, v in phase_us.items()},
            "unattributed_ms": round(max(gpu_time - sum(phase_us.values()), 0.0)
                                     / n_windows / 1e3, 4)}


def bottleneck_stage(profile: Profile, linked: Linked, windows: list[IterationWindow],
                     host: HostTimeline, unprofiled_ms: float | None,
                     framework: str | None) -> dict[str, Any]:
    """The ``bottleneck`` section with its sync sites (``host``: bottleneck.host_timeline)."""
    comm_names: dict[str, bool] = {}

    def is_comm(name: str) -> bool:
        v = comm_names.get(name)
        if v is None:
            v = comm_names[name] = classify_kernel(name, KERNEL).category == "communication"
        return v

    gpu_cov = gpu_intervals(profile, is_comm)
    shares = window_shares([(w.start_us, w.end_us) for w in windows], gpu_cov, host)
    section = bottleneck_section(shares, [w.step for w in windows], [w.wall_us for w in windows],
                                 unprofiled_ms=unprofiled_ms, framework=framework)
    section["sync_sites"] = sync_sites(profile, linked.launches, windows, host.blocking)
    _forward_context(section, profile, linked, windows, host)
    section["compiled_code"] = compiled_code(profile)
    if not profile.gpu:  # a CPU-only run: no share of it is a GPU waiting
        section["bound"], section["verdict"] = "no_gpu", NO_GPU_VERDICT
    return section


def _forward_context(section: dict[str, Any], profile: Profile, linked: Linked,
                     windows: list[IterationWindow], host: HostTimeline) -> None:
    """What happens around each iteration's forward (in place): the syncs inside it (graph
    breaks for torch.compile, rules/trace.py), the input's preparation before it, and on
    ``host`` the prep pieces and the model's spans that the savings' replay reads."""
    host_windows = linked.host_windows or windows
    fwd, bwd = _phase_launches(profile, linked.launches)
    inside = _inside_forward(fwd, bwd, host_windows)
    section["graph_breaks"] = sync_sites(
        profile, linked.launches, windows, host.blocking, inside=inside)
    section["branch_dispatch_ms"] = section["branch_share"] = None
    if section["graph_breaks"]:
        _branch_regions(section, profile, host_windows, host, fwd, bwd, inside)
    section["input_prep_ms"], prep = input_prep(
        host, [(w.start_us, w.end_us) for w in host_windows],
        [_first_in(fwd, w.start_us, w.end_us) for w in host_windows])
    host.prep = Coverage(prep)  # input_pipeline's fix moves it to workers
    host.model = Coverage(_model_spans(fwd, bwd, host_windows))


def _branch_regions(section: dict[str, Any], profile: Profile,
                    windows: list[IterationWindow], host: HostTimeline, fwd: np.ndarray,
                    bwd: np.ndarray, inside: Callable[[float], bool]) -> None:
    """The dispatch that exists because the forward branches on GPU values (in place):
    ``branch_dispatch_ms`` and ``branch_share`` in ``section``, ``host.branches`` and
    ``host.backward`` for the replay (host_sync's fix, analysis/savings.py).

    The region is, per iteration, the forward from its first sync to its last: there the host
    reads a GPU value, branches on it (``nonzero`` + Python ``if``, ``.item()``) and issues
    the branch's ops one branch at a time, so its framework time is per-branch dispatch
    (the ops between two routed layers, attention say, are counted with it: the span is an
    upper bound, and the fix's speed-up range says so). Model for the backward: autograd
    replays the forward's ops one for one, so the region holds the same share of the
    backward's dispatch as of the forward's (forward: first forward kernel launch to the
    first backward launch). Profiled milliseconds per iteration."""
    rt = profile.runtime
    starts, ends = columns.floats(rt, "start_us"), columns.ends(rt)
    at = np.flatnonzero(sync_call_mask(profile, host.blocking))
    at = at[np.argsort(starts[at], kind="stable")]
    regions, backward = [], []
    region_us = backward_us = forward_us = 0.0
    for w in windows:
        first = _first_in(fwd, w.start_us, w.end_us)
        lo, hi = np.searchsorted(starts[at], w.start_us), np.searchsorted(starts[at], w.end_us)
        inner = [i for i in at[lo:hi].tolist() if inside(float(starts[i]))]
        b = bwd[np.searchsorted(bwd, w.start_us):np.searchsorted(bwd, w.end_us)]
        if first is None or not inner or not len(b):
            continue
        span = (float(starts[inner[0]]), float(ends[inner[-1]]))
        regions.append(span)
        backward.append((float(b[0]), float(b[-1])))
        region_us += _covered(host.framework, *span)
        forward_us += _covered(host.framework, first, float(b[0]))
        backward_us += _covered(host.framework, float(b[0]), float(b[-1]))
    if not regions or forward_us <= 0:
        return
    share = min(region_us / forward_us, 1.0)
    n = max(len(windows), 1)
    section["branch_dispatch_ms"] = round((region_us + share * backward_us) / n / 1e3, 4)
    section["branch_share"] = round(share, 4)
    host.branches = Coverage(regions)
    host.backward = Coverage(backward)


def _covered(cov: Coverage, lo: float, hi: float) -> float:
    return sum(e - s for s, e in cov.clip(lo, hi)) if hi > lo else 0.0


def _phase_launches(profile: Profile, launches: Launches) -> tuple[np.ndarray, np.ndarray]:
    """Launch times, ascending, of the kernels (not copies) launched in the forward and of
    everything launched in the backward (from the launches' columns, in their order)."""
    kernels = {c for c, k in zip(columns.values(profile.gpu, "correlation"),
                                 columns.values(profile.gpu, "kind"), strict=True)
               if k == KERNEL}
    phase = launches.phase
    bwd = launches.launch_us[phase == PHASE_CODES[BACKWARD]]
    forward = np.flatnonzero(phase == PHASE_CODES[FORWARD])
    fwd = launches.launch_us[forward[np.fromiter(
        map(kernels.__contains__, launches.ids(forward)), bool, len(forward))]]
    return np.sort(fwd), np.sort(bwd)



def _model_spans(fwd: np.ndarray, bwd: np.ndarray, windows: list[IterationWindow]
                 ) -> list[tuple[float, float]]:
    """Per iteration the host span of the model's forward and backward: from its first
    forward kernel launch (``fwd``) to its last backward launch (``bwd``; its last forward
    kernel launch when it runs no backward)."""
    spans = []
    for w in windows:
        first = _first_in(fwd, w.start_us, w.end_us)
        if first is None:
            continue
        lo, hi = (np.searchsorted(bwd, w.start_us), np.searchsorted(bwd, w.end_us))
        last = float(bwd[hi - 1]) if hi > lo else float(
            fwd[np.searchsorted(fwd, w.end_us) - 1])
        spans.append((first, max(last, first)))
    return spans


def _first_in(times: np.ndarray, lo: float, hi: float) -> float | None:
    at = int(np.searchsorted(times, lo))
    return float(times[at]) if at < len(times) and times[at] < hi else None


def _inside_forward(fwd: np.ndarray, bwd: np.ndarray, windows: list[IterationWindow]
                    ) -> Callable[[float], bool]:
    """Whether a host time lies inside a forward pass: between two forward kernel launches
    (``fwd``) of its iteration, before the iteration's first backward launch (the input's
    copy before the model, a ``loss.item()`` after the step or gradient norms after
    backward are not). ``bwd``: the backward's launch times, ascending."""
    ws = np.array([w.start_us for w in windows])
    we = np.array([w.end_us for w in windows])

    def inside(t: float) -> bool:
        i = int(np.searchsorted(ws, t, side="right")) - 1
        if i < 0 or t >= we[i]:
            return False
        first_bwd = bwd[np.searchsorted(bwd, ws[i]):np.searchsorted(bwd, we[i])]
        end = float(first_bwd[0]) if len(first_bwd) else float(we[i])
        if t >= end:
            return False
        nxt = int(np.searchsorted(fwd, t, side="right"))
        return bool(0 < nxt < len(fwd) and fwd[nxt - 1] >= ws[i] and fwd[nxt] < end)
    return inside


def sync_sites(profile: Profile, launches: Launches,
               windows: list[IterationWindow], blocking: set[int],
               inside: Callable[[float], bool] | None = None) -> list[dict[str, Any]]:
    """Where the host blocked on the device inside the analyzed iterations: the op that did it
    (``aten::item`` under ``.item()``/``float(t)``) and its source line when stacks were kept;
    ``inside``: only the syncs at whose start it is true (:func:`_inside_forward`)."""
    lo, hi = windows[0].start_us, windows[-1].end_us
    sites: dict[tuple[str, str | None], list[float]] = {}
    rt = profile.runtime
    starts = columns.floats(rt, "start_us")
    # the calls is_sync_call names, inside [lo, hi), in trace order
    at = np.flatnonzero(sync_call_mask(profile, blocking) & (starts >= lo) & (starts < hi))
    for r in map(rt.__getitem__, at.tolist()):
        ctx = launches.get(r.correlation) if r.correlation is not None else None
        if inside is not None and not inside(r.start_us):
            continue
        key = ((ctx.op if ctx and ctx.op else r.name), ctx.source if ctx else None)
        sites.setdefault(key, []).append(r.dur_us)
    n = max(len(windows), 1)
    ranked = sorted(sites.items(), key=lambda kv: -sum(kv[1]))[:5]
    return [{"op": op, "source": src, "count_per_iteration": round(len(d) / n, 2),
             "blocked_ms_per_iteration": round(sum(d) / n / 1e3, 4)}
            for (op, src), d in ranked]


# --- stage 6: savings -------------------------------------------------------------------------

def savings_stage(report: dict[str, Any], profile: Profile, tally: Tally, host: HostTimeline,
                  windows: list[IterationWindow], unprofiled_ms: float | None,
                  probe: float | None = None,
                  host_windows: list[IterationWindow] | None = None) -> None:
    """Re-time each recommendation's fix on a replay of the window (analysis/savings.py),
    set severity from the savings, leave out what saves nothing, and order them (in place:
    ``report["recommendations"]`` is replaced). ``probe``: the hook's un-profiled host time
    of a step started on an idle GPU (:func:`host_probe_ms`), which sets the host's speed
    where a GPU-bound window cannot; ``host_windows``: the iterations' host spans
    (``Linked.host_windows``; ``windows`` have moved to their GPU work)."""
    recs = report["recommendations"]
    measured = unprofiled_ms or report["iterations"]["mean_ms"]
    # LLM-scale windows: the first iterations are enough to re-time (bounded cost)
    counts = tally.sim_counts
    n = max(1, sum(1 for c in counts if c <= MAX_REPLAY_KERNELS))
    classes = tally.sim_classes[:counts[n - 1]] if tally.sim_classes is not None else None
    times = None
    if tally.times is not None:
        times = KernelTimes(*(c[:counts[n - 1]] for c in tally.times))
    dispatched = (host_windows or windows)[:n]  # where the host launched the iterations
    replay = window_replay(profile, tally.sim_kernels[:counts[n - 1]], host, dispatched,
                           classes, times)
    # without an un-profiled time (imported traces) the host is taken at the profiler's
    # typical inflation, as for GPU-bound windows: the trace was profiled all the same
    scale = (calibrate(replay, measured * n * 1e3) if unprofiled_ms and replay
             else GPU_BOUND_HOST_SCALE)
    note = ""
    if replay and probe and unprofiled_ms and gpu_bound(replay, measured * n * 1e3):
        probed = probe_host_scale(profile, tally, host, dispatched, probe)
        if probed is not None:
            scale = probed
            note = (f"; the host at {probed:.2f} of its profiled time, from the hook's "
                    f"un-profiled {probe:.1f} ms dispatch of a step on an idle GPU")
    retime(recs, replay, measured, scale, "un-profiled" if unprofiled_ms else "profiled", note)
    report["recommendations"] = finalize(recs, measured, syncs_bound(report))


# Iterations whose dispatch from an idle GPU is replayed against the hook's probe (each its
# own replay; the median scale is taken)
PROBE_ITERATIONS = 3


def host_probe_ms(unprofiled: Any) -> float | None:
    """The hook's un-profiled host time of a step started on an idle GPU
    (``env["unprofiled"]["host_probe"]["host_ms"]``), None where it has none."""
    probe = unprofiled.get("host_probe") if isinstance(unprofiled, dict) else None
    v = probe.get("host_ms") if isinstance(probe, dict) else None
    return float(v) if isinstance(v, int | float) and v > 0 else None


def probe_host_scale(profile: Profile, tally: Tally, host: HostTimeline,
                     windows: list[IterationWindow], probe_ms: float) -> float | None:
    """The host scale a GPU-bound window's time cannot give (whatif.calibrate): each of the
    first iterations' host spans (``windows``: where the host dispatched them, not where
    their GPU work ran) replayed alone from an idle GPU with the work launched there, as the
    hook's probe ran its step, and the scale at which the replayed host finishes in the
    probe's time (whatif.calibrate_host), its launches waiting on a full launch queue as
    deep as the window's (:func:`launch_queue_depth`)."""
    counts = tally.sim_counts
    replays = []
    for i in range(min(PROBE_ITERATIONS, len(windows), len(counts))):
        lo = counts[i - 1] if i else 0
        classes = (tally.sim_classes[lo:counts[i]] if tally.sim_classes is not None
                   else None)
        times = (KernelTimes(*(c[lo:counts[i]] for c in tally.times))
                 if tally.times is not None else None)
        replay = window_replay(profile, tally.sim_kernels[lo:counts[i]], host,
                               windows[i:i + 1], classes, times)
        if replay is not None:
            replays.append(replay)
    depth = launch_queue_depth(profile, windows[0].start_us, windows[-1].end_us)
    return calibrate_host(replays, probe_ms * 1e3, depth)


def syncs_bound(report: dict[str, Any]) -> bool:
    """Whether host syncs are the largest share of the iteration (the un-profiled shares
    where the hook measured them)."""
    bn = report.get("bottleneck") or {}
    shares = bn.get("corrected_pct") or bn.get("mean_pct") or {}
    sync = shares.get("sync") or 0.0
    return sync > 0 and sync >= max(shares.values())


def window_replay(profile: Profile, kernels: list[SimKernel], host: HostTimeline,
                  windows: list[IterationWindow], classes: np.ndarray | None = None,
                  times: KernelTimes | None = None) -> Replay | None:
    """The window ready for what-if re-timing (analysis/whatif.py); ``classes``: the
    kernels' tally classes (``Tally.sim_classes``), ``times``: their time columns
    (``Tally.times``)."""
    if not kernels:
        return None
    lo, hi = windows[0].start_us, windows[-1].end_us
    blocking = host.blocking
    pageable_h2d = pageable_copy_correlations(profile, "HtoD", "H2D")
    rt = profile.runtime
    starts, ends = columns.floats(rt, "start_us"), columns.ends(rt)
    corr = columns.values(rt, "correlation")
    at = np.flatnonzero(sync_call_mask(profile, blocking) & (starts >= lo) & (starts < hi))
    syncs = list(zip(starts[at].tolist(), ends[at].tolist(), strict=True))
    copying = (np.fromiter(map(pageable_h2d.__contains__, corr), bool, len(rt))
               if pageable_h2d else np.zeros(len(rt), bool))
    copy_calls = Coverage.of_columns(starts[copying], ends[copying])
    blocked = blocked_launches(profile, lo, hi)
    sync = host.sync
    if len(blocked[0]):  # waiting on a full queue, as a sync waits: no host work
        have = host.sync.arrays()
        sync = Coverage.of_columns(np.concatenate([have[0], blocked[0]]),
                                   np.concatenate([have[1], blocked[1]]))
    return build_replay(kernels, syncs, data=host.data, sync=sync,
                        framework=host.framework, copy_calls=copy_calls, start_us=lo,
                        end_us=hi, glue_max_us=GLUE_MAX_US, classes=classes, times=times,
                        prep=host.prep, model=host.model, branches=host.branches,
                        backward=host.backward)


# A launch call this much longer than the window's typical launch waited for a slot in the
# GPU's full launch queue (back-pressure): the GPU, not the host, set that time. UNet training
# on the H200: 145 of 6,544 launches took over 100 us, 215 ms of a 437 ms iteration.
BLOCKED_LAUNCH_US = 100.0


def blocked_launches(profile: Profile, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The spans in [lo, hi) where kernel launch calls waited on a full launch queue: each
    launch call longer than ``BLOCKED_LAUNCH_US``, past the median time of the other launches
    (a launch's own cost).

    In a GPU-bound loop the host runs ahead until the queue is full, then every launch waits
    for the GPU to free a slot, so the profiled host timeline is stretched to the GPU's. A
    replay that counted that wait as host work would cap every GPU fix at the old GPU time
    (a UNet's bf16 autocast predicted 40% where 65% was measured)."""
    rt = profile.runtime
    empty = np.zeros(0, np.float64)
    if not len(rt):
        return empty, empty
    names = columns.values(rt, "name")
    launch = np.fromiter(("Launch" in n for n in names), bool, len(rt))
    starts, ends = columns.floats(rt, "start_us"), columns.ends(rt)
    launch &= (starts >= lo) & (starts < hi)
    if not launch.any():
        return empty, empty
    dur = ends[launch] - starts[launch]
    long = dur > BLOCKED_LAUNCH_US
    typical = float(np.median(dur[~long])) if (~long).any() else 0.0  # a launch's own cost
    return starts[launch][long] + typical, ends[launch][long]


def launch_queue_depth(profile: Profile, lo: float, hi: float) -> int | None:
    """How many launched kernels the GPU's launch queue held when it was full: at each
    launch in [lo, hi) that waited for a slot (:func:`blocked_launches`), the earlier
    launches whose kernel had not started by the time it returned; the median. None where no
    launch waited (the window never filled the queue). The queue is counted in bytes, not
    kernels (H200 traces: about 850 launched kernels for a ViT-B/16, 1,050 for a ResNet-50)."""
    rt = profile.runtime
    if not len(rt) or not len(profile.gpu):
        return None
    names = columns.values(rt, "name")
    starts, ends = columns.floats(rt, "start_us"), columns.ends(rt)
    corr = columns.values(rt, "correlation")
    launch = np.flatnonzero(np.fromiter(("Launch" in n for n in names), bool, len(rt)))
    began: dict[int, float] = {}
    for a in profile.gpu:
        if a.correlation is not None and a.correlation not in began:
            began[a.correlation] = a.start_us
    at = [i for i in launch.tolist() if began.get(corr[i]) is not None]
    if not at:
        return None
    order = np.argsort(starts[at], kind="stable")
    ls, le = starts[at][order], ends[at][order]
    ks = np.array([began[corr[i]] for i in at], np.float64)[order]
    # every earlier launch counts (the queue filled before the span), the waits in it only
    waited = np.flatnonzero((le - ls > BLOCKED_LAUNCH_US) & (ls >= lo) & (ls < hi))
    if not len(waited):
        return None
    pending = [int((ks[:i] > le[i]).sum()) for i in waited.tolist()]
    depth = int(np.median(pending))
    return depth if depth > 0 else None


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _step_range(windows: list[IterationWindow]) -> tuple[list[int], str]:
    """First and last step number, or 0-based iteration indices when markers carry none."""
    steps = [w.step for w in windows if w.step is not None]
    if len(steps) != len(windows):
        return [windows[0].index, windows[-1].index], "index"
    return [min(steps), max(steps)], "step"
