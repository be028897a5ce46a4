"""What-if re-timing: the iteration replayed with a fix applied to the work it changes.

A small discrete-event replay of the window (the approach of Daydream, USENIX ATC 2020, on the
dependencies a trace records): every GPU activity starts when its stream is free and its launch
has happened; the host's timeline is a piecewise-linear clock over the segments the bottleneck
model distinguishes (framework ops and their glue, op-less host work, data-loader waits), and a
host synchronization waits until the GPU has finished what was launched before it. A fix scales
kernel durations (TF32, AMP, channels_last, fusion), host segments (compile's cheaper dispatch,
an input pipeline moved to workers) or drops the waits (no per-step sync). A GPU speedup on a
host-bound iteration therefore predicts little, and a host fix on a GPU-bound one too.

The replay is calibrated before it predicts: host framework time is scaled until the replay
without any fix takes the un-profiled iteration time (the profiler inflates host time, not GPU
time). The prediction is the ratio replay(fix) / replay(no fix) applied to the measured time.
The speed-up factors live in one table, :data:`SPEEDUPS` (docs/recommendations.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from operator import attrgetter
from typing import NamedTuple

import msgspec
import numpy as np

from ..model import GpuActivity
from .intervals import Coverage, subtract, subtract_columns

# Per-kernel-class speed-ups on an H200, as (typical, low, high): the kernel runs `typical`
# times faster after the fix; low/high bound the estimate's range. Measured by
# benchmarks/measure_speedups.py (now `git show e6bc77a:benchmarks/measure_speedups.py`;
# docs/recommendations.md has the run and its shapes).
SPEEDUPS: dict[str, tuple[float, float, float]] = {
    # measured: GPU time of the class before / after, fwd+bwd (docs/recommendations.md)
    "fp32_to_tf32_gemm": (6.7, 5.0, 8.0),  # 8192x4096x4096 GEMMs, FP32 SIMT -> TF32
    "fp32_to_tf32_conv": (4.2, 3.2, 5.5),  # ResNet-50 layer1-2 convs (conv + GEMM kernels)
    "tf32_to_half_gemm": (2.44, 1.9, 2.8),  # TF32 -> BF16
    "tf32_to_half_conv": (2.16, 1.7, 2.6),  # TF32 -> FP16, NCHW
    "tf32_to_half_attention": (8.3, 5.0, 9.0),  # SDPA: FP32 math path -> BF16 flash
    "memory_half_norm": (1.1, 1.0, 1.3),  # batch/layer norm under autocast (stays FP32 math)
    "memory_half_elementwise": (1.6, 1.3, 1.9),  # elementwise kernels at half the bytes
    "nchw_to_nhwc_norm": (2.94, 2.2, 3.4),  # FP16 batch norm + ReLU, NCHW -> channels_last
    "nchw_to_nhwc_half_conv": (1.0, 0.9, 1.1),  # FP16 conv kernels themselves: unchanged
    "fusion_small_kernels": (1.2, 1.0, 1.6),  # eager vs torch.compile LayerNorm/GELU block
    # host time per training step of a small HF GPT-2 (6 x 512, batch 1 x 64, AdamW) where the
    # GPU keeps up: TF32 17.5 ms, bf16 autocast 22.3 / 25.8 ms (cast ops), compiled 14.0 ms
    "amp_dispatch": (0.79, 0.68, 0.90),
    "compile_dispatch": (1.6, 1.3, 2.2),  # eager -> torch.compile (fwd, bwd; AdamW eager)
    # host dispatch of a forward that branches on GPU values once per branch (an MoE's
    # per-expert loop: nonzero + if + index + MLP + index_add per expert), vectorised
    # (grouped GEMM experts, masks): an op-count model, not a timing. n branches of k ops
    # become about one branch's ops on grouped tensors plus the routing (sort, counts,
    # gather/scatter), about 2k: n / 2 fewer ops. typical: n = 8 (Mixtral-style, 8 experts);
    # low: n = 4, or the ops between the routed layers in the measured span (attention)
    # that stay; high: all of it but one branch's worth (n = 8)
    "vectorised_branch_dispatch": (4.0, 2.0, 8.0),
}
PINNED_H2D_BYTES_PER_US = 50e3  # 50 GB/s: pinned host-to-device copies on the H200 (56 measured)
MIN_LAUNCH_LATENCY_US = 2.0
MAX_QUEUE_GAP_US = 20.0  # a larger median gap on a full queue is not the front end's
MAX_LAUNCH_LATENCY_US = 50.0
CALIBRATION_STEPS = 12  # bisection steps: the scale to 0.03% of its range
CALIBRATION_TOLERANCE = 0.03  # replay within 3% of the un-profiled time: no host scaling
# Host framework time with / without the profiler where it sets the iteration time: HF GPT-2
# eager on the H200, 25.2 / 61.7 ms and 42.2 / 86.8 ms (record_shapes + with_flops).
GPU_BOUND_HOST_SCALE = 0.45


class SimKernel(msgspec.Struct, gc=False):
    """One GPU activity of the window with what the fixes need to know about it (outside the
    cycle collector, as the model's events: one per activity, no cycles)."""

    act: GpuActivity
    launch_us: float | None  # host time of its launch call, None when the trace has none
    category: str
    precision: str
    uses_tc: bool
    eligible: bool


def _no_factor(k: SimKernel) -> float:
    return 1.0


_NO_FACTOR = _no_factor  # a Fix that changes no kernel: the replay skips the calls


@dataclass(slots=True)
class Fix:
    """What a recommendation changes: kernel durations, host segment rates, syncs."""

    kernel_factor: Callable[[SimKernel], float] = _no_factor
    # kernel_factor reads only a kernel's class (its activity's name and kind, its category,
    # precision, uses_tc, eligible): the replay then calls it once per distinct class
    by_class: bool = False
    framework_rate: float = 1.0  # host time inside framework ops and their glue
    outside_rate: float = 1.0  # host work outside ops (numpy, tokenisation)
    data_rate: float = 1.0  # data-loader waits
    copy_call_rate: float = 1.0  # host calls of pageable host-to-device copies
    syncs_wait: bool = True
    # framework time where the forward branches on GPU values (Replay's "branch" pieces) and
    # inside the backward (its "backward" pieces), on top of framework_rate
    branch_rate: float = 1.0
    backward_rate: float = 1.0


@dataclass(slots=True)
class Replay:
    """The window's timeline, ready to be replayed under any fix."""

    kernels: list[SimKernel]
    syncs: list[tuple[float, float]]
    segments: Segments  # covering [start, end)
    start_us: float
    end_us: float
    latency_us: float
    host_end_us: float = 0.0  # the host's last activity: op-less time after it is waiting
    gap_us: float = 0.0  # GPU idle between two kernels of a full queue (see _queue_gap)

    _table: _EventTable | None = None
    _columns: _KernelColumns | None = None  # the kernels' columns (None: not all finite)
    # per kernel a class code (build_replay's ``classes``), None: the replay finds them
    classes: np.ndarray | None = None

    def run(self, fix: Fix, host_scale: float = 1.0) -> float:
        """Replayed window time (us) under ``fix``; host framework time times ``host_scale``."""
        table = self._table or self._prepare()
        per_class, durations_key = table.class_factors(fix)
        # The same durations and rates replay to the same time: a fix whose variants differ
        # in nothing (input_pipeline), TF32 again under AMP, the base of every prediction.
        key = (durations_key, fix.framework_rate, fix.outside_rate, fix.data_rate,
               fix.copy_call_rate, fix.syncs_wait, host_scale, fix.branch_rate,
               fix.backward_rate)
        if durations_key is not None and key in table.runs:
            return table.runs[key]
        host_done, gpu_done, origin = self._simulate(fix, host_scale, table, per_class,
                                                     durations_key)
        total = max(host_done, gpu_done) - origin
        if durations_key is not None:
            table.runs[key] = total
        return total

    def host_time(self, fix: Fix, host_scale: float = 1.0, queue_depth: int | None = None
                  ) -> float:
        """Replayed time (us) from the window's start until the host has finished its work
        under ``fix``, with the waits its syncs make: on a window of one iteration, what the
        host takes to dispatch that iteration when it starts on an idle GPU. ``queue_depth``:
        a launch waits while that many launched kernels have not started (the GPU's full
        launch queue); None: the queue never fills."""
        table = self._table or self._prepare()
        host_done, _, origin = self._simulate(fix, host_scale, table,
                                              *table.class_factors(fix), queue_depth)
        return host_done - origin

    def _simulate(self, fix: Fix, host_scale: float, table: _EventTable,
                  per_class: np.ndarray | None, durations_key: bytes | None,
                  queue_depth: int | None = None) -> tuple[float, float, float]:
        """(the host's end, the GPU's end, the window's start) on the replayed clock."""
        factor = fix.kernel_factor
        rates = {"framework": fix.framework_rate * host_scale,
                 "outside": fix.outside_rate * host_scale, "data": fix.data_rate,
                 "copy_call": fix.copy_call_rate * host_scale, "sync": 0.0,
                 "eager": host_scale,
                 "branch": fix.framework_rate * fix.branch_rate * host_scale,
                 "backward": fix.framework_rate * fix.backward_rate * host_scale}
        now, origin, host_end0 = table.host_time_column(rates)
        if per_class is not None:  # the same divisions, in numpy (IEEE: the same quotients)
            durations = np.where(table.is_sync, 0.0, table.duration_column / np.maximum(
                per_class[table.class_index], 1e-6))
        elif durations_key is not None:
            durations = table.duration_column
        else:
            durations = np.array([k.act.dur_us / max(factor(k), 1e-6) if k is not None
                                  else 0.0 for k in table.kernels], np.float64)
        queue = table.queue_column
        state = _Queues(origin, table.queues, self.latency_us, self.gap_us)
        if queue_depth is not None:
            state.loop(now.tolist(), table.queue, durations.tolist(), fix.syncs_wait,
                       queue_depth)
        elif not (np.isfinite(now).all() and np.isfinite(durations).all()
                  and np.isfinite([origin, self.latency_us, self.gap_us]).all()):
            state.loop(now.tolist(), table.queue, durations.tolist(), fix.syncs_wait)
        else:
            state.columns(now, queue, durations, fix.syncs_wait)
        return host_end0 + state.waited, state.gpu_done, origin

    def _prepare(self) -> _EventTable:
        """Syncs and kernel launches in host-time order (a sync before a kernel launched at
        its time), then the event table."""
        sync_t = np.array([t0 for t0, _ in self.syncs], np.float64)
        cols = self._columns
        if cols is not None:
            launch_t = np.where(cols.has_launch, cols.launch, cols.start - self.latency_us)
        else:
            launch_t = np.array([k.launch_us if k.launch_us is not None
                                 else k.act.start_us - self.latency_us for k in self.kernels],
                                np.float64)
        t = np.concatenate([sync_t, launch_t])
        index = np.concatenate([np.full(len(sync_t), -1), np.arange(len(launch_t))])
        if np.isfinite(t).all():
            order = np.lexsort((index >= 0, t))  # stable, as sorted() is
            self._table = _EventTable(self, t[order].tolist(), index[order].tolist())
        else:  # NaN: sorted()'s order, which numpy's is not
            times, idx = t.tolist(), index.tolist()
            by = sorted(range(len(times)), key=lambda j: (times[j], idx[j] >= 0))
            self._table = _EventTable(self, [times[j] for j in by], [idx[j] for j in by])
        return self._table


class _Queues:
    """The GPU's queues during a replay: each kernel starts at its launch (the host's time
    plus what syncs made it wait, plus the launch latency) or when its queue is free again
    (plus the queue's gap), whichever is later; a sync waits for all work launched before it
    (``syncs_wait``)."""

    def __init__(self, origin: float, queues: int, latency: float, gap: float) -> None:
        self.free = [origin] * queues  # the window opens when the GPU finished earlier work
        self.latency, self.gap = latency, gap
        self.waited = 0.0
        self.gpu_done = float("-inf")

    def loop(self, now_of: list[float], queues: list[int], durations: list[float],
             syncs_wait: bool, depth: int | None = None) -> None:
        """One event at a time (the reference; NaN and infinities take it). ``depth``: a
        launch waits until the kernel launched ``depth`` launches before it has started."""
        free, latency, gap = self.free, self.latency, self.gap
        waited, gpu_done = self.waited, self.gpu_done
        begins: list[float] = []
        for now0, queue, dur in zip(now_of, queues, durations, strict=True):
            if queue < 0:  # a host sync: wait for all work launched before it
                if syncs_wait and gpu_done > now0 + waited:
                    waited += gpu_done - (now0 + waited)
                continue
            if depth is not None and len(begins) >= depth:
                slot = begins[len(begins) - depth]  # the launch queue is full until then
                if slot > now0 + waited:
                    waited += slot - (now0 + waited)
            begin = now0 + waited + latency  # max(now + latency, free + gap), as max() picks
            ready = free[queue] + gap
            if ready > begin:
                begin = ready
            end = begin + dur
            free[queue] = end
            if depth is not None:
                begins.append(begin)
            if end > gpu_done:
                gpu_done = end
        self.waited, self.gpu_done = waited, gpu_done

    def columns(self, now: np.ndarray, queue: np.ndarray, dur: np.ndarray,
                syncs_wait: bool) -> None:
        """:meth:`loop` for finite times, a queue's kernels between two syncs at once
        (:func:`_chain`); the syncs in turn, as the loop."""
        syncs = np.flatnonzero(queue < 0).tolist() if syncs_wait else []
        lo = 0
        for stop in [*syncs, len(queue)]:
            if stop > lo:
                self._stretch(lo, now[lo:stop], queue[lo:stop], dur[lo:stop])
            if stop < len(queue):
                now0 = float(now[stop])
                if self.gpu_done > now0 + self.waited:
                    self.waited += self.gpu_done - (now0 + self.waited)
            lo = stop + 1

    def _stretch(self, lo: int, now: np.ndarray, queue: np.ndarray, dur: np.ndarray) -> None:
        for q in range(len(self.free)):
            at = np.flatnonzero(queue == q) if len(self.free) > 1 else np.flatnonzero(queue >= 0)
            if not len(at):
                continue
            begin = (now[at] + self.waited) + self.latency
            end = _chain(begin, dur[at], self.free[q] + self.gap, self.gap)
            self.free[q] = float(end[-1])
            if (end == 0.0).any():  # max() keeps the first of 0.0 and -0.0, numpy may not
                for done in end.tolist():
                    if done > self.gpu_done:
                        self.gpu_done = done
                continue
            done = float(end.max())
            if done > self.gpu_done:
                self.gpu_done = done


_CHAIN_KERNELS_PER_RUN = 16  # fewer kernels per run of queued ones: the loop is as fast


def _chain(begin: np.ndarray, dur: np.ndarray, ready0: float, gap: float) -> np.ndarray:
    """The ends of one queue's kernels: ``end[i] = max(begin[i], ready[i]) + dur[i]`` with
    ``ready[0] = ready0`` and ``ready[i] = end[i - 1] + gap`` (the ready time wins only when
    later, as the loop picks). Which kernels wait for the queue is guessed in real arithmetic
    (a running maximum over cumulative sums), each run of waiting kernels is then added left
    to right (``np.add.accumulate``: the loop's floats) and every guess checked against the
    ends it gave; a wrong guess, or too many runs, takes the loop."""
    n = len(begin)
    step = gap + dur
    before = np.cumsum(step) - step  # ~ the sum of the steps before each kernel
    offset = begin - gap - before
    lead = np.maximum.accumulate(np.concatenate(([ready0 - gap], offset)))[:-1]
    fresh = offset >= lead  # a kernel that starts at its own begin (the queue was idle)
    end = np.empty(n)
    end[fresh] = begin[fresh] + dur[fresh]
    heads = np.flatnonzero(fresh)
    starts = np.concatenate(([0], heads)) if not (n and fresh[0]) else heads
    bounds = np.append(starts, n)
    runs = np.flatnonzero(np.diff(bounds) > 1)  # stretches with kernels that queued
    if len(runs) > max(8, n // _CHAIN_KERNELS_PER_RUN):
        return _chain_loop(begin, dur, ready0, gap)
    if n and not fresh[0]:
        end[0] = ready0 + dur[0]
    for r in runs.tolist():
        a, b = int(bounds[r]), int(bounds[r + 1])
        terms = np.empty(2 * (b - a) - 1)
        terms[0] = end[a]
        terms[1::2] = gap
        terms[2::2] = dur[a + 1:b]
        end[a + 1:b] = np.add.accumulate(terms)[2::2]
    ready = np.concatenate(([ready0], end[:-1] + gap))
    if not np.array_equal(fresh, ~(ready > begin)) or (end == 0.0).any():
        return _chain_loop(begin, dur, ready0, gap)  # a guess was wrong (or signed zeros)
    return end


def _chain_loop(begin: np.ndarray, dur: np.ndarray, ready0: float, gap: float
                ) -> np.ndarray:
    """:func:`_chain` one kernel at a time."""
    out = []
    ready = ready0
    for b, d in zip(begin.tolist(), dur.tolist(), strict=True):
        if ready > b:
            b = ready
        end = b + d
        out.append(end)
        ready = end + gap
    return np.array(out, np.float64)


# "eager": framework time outside the model's forward and backward (the optimizer step, a
# gradient norm, .item()): what torch.compile(model) leaves eager, so compile and autocast do
# not change it
# "branch", "backward": the model's framework time where its forward branches on GPU values
# and in its backward (HostTimeline.branches/backward: only with graph breaks), which
# host_sync's fix vectorises
KINDS = ("framework", "outside", "data", "copy_call", "sync", "eager", "branch", "backward")


class _EventTable:
    """Every event's place on the host clock, computed once: replaying under another fix
    only re-weights the segments (one cumulative sum, vectorized)."""

    def __init__(self, replay: Replay, times: list[float], index: list[int]) -> None:
        self.index = index
        self._replay = replay
        self._kernels: list[SimKernel | None] | None = None
        self._queue_column: np.ndarray | None = None
        # per event: its queue (-1 for a sync), its duration (0.0 for a sync)
        cols = replay._columns
        if cols is None:
            queue_of: dict[tuple[int, bool], int] = {}
            self.queue = [-1 if k is None else queue_of.setdefault(
                (k.act.device, k.category == "communication"), len(queue_of))
                for k in self.kernels]
            self.queues = len(queue_of)
            self.duration_column = np.array([0.0 if k is None else k.act.dur_us
                                             for k in self.kernels], np.float64)
            self.is_sync = np.array([k is None for k in self.kernels], bool)
        else:
            self._from_columns(replay, cols, np.array(index, np.int64))
        self.class_kernels, self.class_index = (
            self._kernel_classes() if replay.classes is None or cols is None
            else self._given_classes(replay.classes))
        # (durations' key, rates, syncs wait, host scale) -> run's time (Replay.run)
        self.runs: dict[tuple, float] = {}
        starts, ends = replay.segments.start, replay.segments.end
        self.kind = replay.segments.kind
        self.length = ends - starts
        probe = np.array([*times, replay.start_us, replay.host_end_us or replay.end_us])
        seg = np.searchsorted(starts, probe, side="right") - 1
        safe = np.maximum(seg, 0)
        self.seg = safe
        self.before = seg < 0
        first = starts[0] if len(starts) else 0.0
        self.lead = probe - first  # events before the first segment keep their own time
        self.within = np.where(self.before, 0.0, np.minimum(probe, ends[safe]) - starts[safe]
                               if len(starts) else 0.0)
        self.beyond = np.where(self.before, 0.0, np.maximum(probe - ends[safe], 0.0)
                               if len(starts) else 0.0)

    @property
    def kernels(self) -> list[SimKernel | None]:
        """Per event its kernel, None for a sync (made when a fix needs it)."""
        if self._kernels is None:
            kernels = self._replay.kernels
            self._kernels = [kernels[i] if i >= 0 else None for i in self.index]
        return self._kernels

    def class_factors(self, fix: Fix) -> tuple[np.ndarray | None, bytes | None]:
        """(the fix's factor per kernel class or None, the durations' key): ``b""`` where the
        fix changes no kernel (x / max(1.0, 1e-6) is x), None where its factor is per kernel
        (not worth a key)."""
        factor = fix.kernel_factor
        if factor is _NO_FACTOR:
            return None, b""
        if fix.by_class:
            per_class = np.array([factor(k) for k in self.class_kernels] or [1.0], np.float64)
            return per_class, per_class.tobytes()
        return None, None

    def _from_columns(self, replay: Replay, cols: _KernelColumns, index: np.ndarray) -> None:
        """Queues and durations from the kernels' columns: a queue per device and whether
        the kernel is a collective, numbered in order of first use (as the loop does)."""
        self.is_sync = index < 0
        at = index[~self.is_sync]
        comm = np.array([k.category == "communication" for k in replay.kernels], bool)
        key = (cols.stream[at] >> 40) * 2 + comm[at]
        keys, first, code = np.unique(key, return_index=True, return_inverse=True)
        rank = np.empty(len(keys), np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(keys))
        queue = np.full(len(index), -1, np.int64)
        queue[~self.is_sync] = rank[code]
        self.queue, self.queues = queue.tolist(), len(keys)
        self._queue_column = queue
        self.duration_column = np.zeros(len(index))
        self.duration_column[~self.is_sync] = cols.dur[at]

    def _given_classes(self, classes: np.ndarray) -> tuple[list[SimKernel], np.ndarray]:
        """:meth:`_kernel_classes` from the caller's class codes (kernels of one code agree
        in everything a by-class factor reads): the first kernel of each code stands for it."""
        _, first, code = np.unique(classes, return_index=True, return_inverse=True)
        index = np.array(self.index, np.int64)
        of_event = np.zeros(len(index), np.int64)
        of_event[index >= 0] = code[index[index >= 0]]
        kernels = self._replay.kernels
        return [kernels[i] for i in first.tolist()], of_event

    def _kernel_classes(self) -> tuple[list[SimKernel], np.ndarray]:
        """One kernel standing for each kernel class (Fix.by_class) and each event's class
        (0 for a sync: its duration is 0.0 under every fix)."""
        classes: dict[tuple, int] = {}
        stand_ins: list[SimKernel] = []
        index_of = []
        for k in self.kernels:
            if k is None:
                index_of.append(0)
                continue
            key = (k.act.name, k.act.kind, k.category, k.precision, k.uses_tc, k.eligible)
            at = classes.get(key)
            if at is None:
                at = classes[key] = len(stand_ins)
                stand_ins.append(k)
            index_of.append(at)
        return stand_ins, np.array(index_of, np.int64)

    def host_time_column(self, rates: dict[str, float]) -> tuple[np.ndarray, float, float]:
        """Replayed host time of every event (a column), of the window's start and of the
        host's end."""
        if not len(self.kind):
            lead = self.lead
        else:
            rate = np.array([rates.get(k, 1.0) for k in KINDS])[self.kind]
            cum = np.concatenate(([0.0], np.cumsum(self.length * rate)))
            at = cum[self.seg] + self.within * rate[self.seg] + self.beyond
            lead = np.where(self.before, self.lead, at)
        return lead[:-2], float(lead[-2]), float(lead[-1])

    @property
    def queue_column(self) -> np.ndarray:
        """:attr:`queue` as an int64 column (made once)."""
        if self._queue_column is None:
            self._queue_column = np.array(self.queue, np.int64)
        return self._queue_column


@dataclass(slots=True)
class Segments:
    """The window's host timeline as columns: [start, end) pieces, ascending, and each
    piece's kind (an index into KINDS)."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def kinds(self) -> list[str]:
        return [KINDS[k] for k in self.kind.tolist()]


_Columns = tuple[np.ndarray, np.ndarray]


def _minus(a: _Columns, b: _Columns) -> _Columns:
    """:func:`intervals.subtract` of sorted, disjoint (start, end) columns."""
    if not len(b[0]):
        keep = a[0] < a[1]  # as subtract() keeps a's non-empty intervals
        return a[0][keep], a[1][keep]
    cut = subtract_columns(a[0], a[1], b[0], b[1])
    if cut is None:  # not sorted and disjoint: the loop
        left = subtract(list(zip(a[0].tolist(), a[1].tolist(), strict=True)),
                        list(zip(b[0].tolist(), b[1].tolist(), strict=True)))
        return np.array([s for s, _ in left]), np.array([e for _, e in left])
    return cut


class KernelTimes(NamedTuple):
    """Columns of the kernels' times the caller already holds, in the kernels' order: the
    activities' start and duration, the launch's time (0.0 where ``has_launch`` is False)."""

    start: np.ndarray
    dur: np.ndarray
    launch: np.ndarray
    has_launch: np.ndarray


def build_replay(kernels: list[SimKernel], syncs: list[tuple[float, float]], *,
                 data: Coverage, sync: Coverage, framework: Coverage, copy_calls: Coverage,
                 start_us: float, end_us: float, glue_max_us: float,
                 classes: np.ndarray | None = None, times: KernelTimes | None = None,
                 prep: Coverage | None = None, model: Coverage | None = None,
                 branches: Coverage | None = None, backward: Coverage | None = None
                 ) -> Replay:
    """Segments of [start, end) by the host's state, in the bottleneck model's precedence:
    data waits, syncs, copy calls, framework ops, then what is left (glue when short, else
    work outside ops). In columns: the pieces' ends are picked, never computed.

    ``classes``: a class code per kernel, kernels of one code alike in all that
    :attr:`Fix.by_class` factors read (the tally's classes); without it the replay groups
    the kernels itself. ``times``: the kernels' time columns, not read again. ``prep``: the
    op-less host time that prepares the input (bottleneck.input_prep): work outside ops
    however short, since no glue between two of the model's ops runs there. ``model``: the
    host spans of the model's forward and backward; framework time outside them is
    ``eager`` (none given: all of it is the model's). ``branches``, ``backward``: the spans
    where the forward branches on GPU values and the backward's (the model's framework time
    there is ``branch`` and ``backward``; none given: ``framework``)."""
    whole = (np.array([start_us], np.float64), np.array([end_us], np.float64))
    d, sy, cc, fw = (cov.clip_columns(*whole)[1:] for cov in (data, sync, copy_calls, framework))
    sy = _minus(sy, d)
    cc = _minus(_minus(cc, d), sy)
    fw = _minus(_minus(_minus(fw, d), sy), cc)
    taken = Coverage.of_arrays(np.concatenate([d[0], sy[0], cc[0], fw[0]]),
                               np.concatenate([d[1], sy[1], cc[1], fw[1]])).arrays()
    rest = _minus(whole, (taken[0], taken[1]))
    short = rest[1] - rest[0] < glue_max_us
    if prep is not None and len(prep) and len(rest[0]):
        short &= ~(prep.overlaps(rest[0], rest[1]) > 0)
    rest_kind = np.where(short, KINDS.index("framework"), KINDS.index("outside"))
    eager: _Columns = (fw[0][:0], fw[1][:0])
    if model is not None and len(model):
        spans = model.arrays()
        eager = _minus(fw, (spans[0], spans[1]))
        fw = _minus(fw, eager)
        if len(rest[0]):
            glue_out = short & ~(model.overlaps(rest[0], rest[1]) > 0)
            rest_kind = np.where(glue_out, KINDS.index("eager"), rest_kind)
    br: _Columns = (fw[0][:0], fw[1][:0])
    bw: _Columns = (fw[0][:0], fw[1][:0])
    for spans_of, kind_of in ((branches, "branch"), (backward, "backward")):
        if spans_of is None or not len(spans_of):
            continue
        arr = spans_of.arrays()
        outside_of = _minus(fw, (arr[0], arr[1]))
        inside_of = _minus(fw, outside_of)
        fw = outside_of
        if kind_of == "branch":
            br = inside_of
        else:
            bw = inside_of
    parts = ((d, "data"), (sy, "sync"), (cc, "copy_call"), (fw, "framework"),
             (eager, "eager"), (br, "branch"), (bw, "backward"))
    start = np.concatenate([p[0] for p, _ in parts] + [rest[0]])
    end = np.concatenate([p[1] for p, _ in parts] + [rest[1]])
    kind = np.concatenate([np.full(len(p[0]), KINDS.index(k)) for p, k in parts] + [rest_kind])
    order = np.argsort(start, kind="stable")  # the pieces are disjoint: no two share a start
    segments = Segments(start[order], end[order], kind[order].astype(np.int64))
    cols = _KernelColumns.of(kernels, times)
    replay = Replay(kernels, sorted(syncs), segments, start_us, end_us,
                    _launch_latency(kernels, cols), gap_us=_queue_gap(kernels, cols))
    replay._columns = cols
    replay.classes = classes
    active = segments.end[segments.kind != KINDS.index("outside")]
    replay.host_end_us = float(active.max()) if len(active) else end_us
    return replay


_LAUNCH_US = attrgetter("launch_us")
_START_US, _DUR_US = attrgetter("start_us"), attrgetter("dur_us")


@dataclass(slots=True)
class _KernelColumns:
    """The kernels' start, duration, launch time (``has_launch`` where there is one) and
    stream (device and stream as one code) as numpy columns, in the kernels' order."""

    start: np.ndarray
    dur: np.ndarray
    launch: np.ndarray
    has_launch: np.ndarray
    stream: np.ndarray
    is_kernel: np.ndarray

    @classmethod
    def of(cls, kernels: Sequence[SimKernel], times: KernelTimes | None = None
           ) -> _KernelColumns | None:
        """None when a value is not finite or a stream key is not a small int: the loops
        below then decide (their comparisons with NaN are not numpy's). ``times``: the
        start, duration and launch columns when the caller has them."""
        n = len(kernels)
        acts = [k.act for k in kernels]  # list comprehensions: the fastest reads (columns.py)
        try:
            if times is not None and len(times.start) == n:
                start, dur, launch, has_launch = times
            else:
                launches = list(map(_LAUNCH_US, kernels))
                has_launch = np.array([t is not None for t in launches], bool)
                start = np.fromiter(map(_START_US, acts), np.float64, n)
                dur = np.fromiter(map(_DUR_US, acts), np.float64, n)
                launch = np.array([0.0 if t is None else t for t in launches], np.float64)
            device = np.fromiter([a.device for a in acts], np.int64, n)
            stream = np.fromiter([a.stream for a in acts], np.int64, n)
        except (TypeError, OverflowError, ValueError):
            return None
        if not (np.isfinite(start).all() and np.isfinite(dur).all()
                and np.isfinite(launch).all()):
            return None
        if n and (device.min() < 0 or device.max() >= 2**20 or stream.min() < 0
                  or stream.max() >= 2**40):
            return None
        is_kernel = np.array([a.kind == "kernel" for a in acts], bool)
        return cls(start, dur, launch, has_launch, (device << 40) | stream, is_kernel)


def _median_latency(gaps: list[float]) -> float:
    return _latency_of_sorted(sorted(g for g in gaps if g >= 0))


def _latency_of_sorted(gaps: Sequence[float] | np.ndarray) -> float:
    """The median of the launch gaps (ascending, none negative), within the bounds."""
    if not len(gaps):
        return 5.0
    return min(max(float(gaps[len(gaps) // 2]), MIN_LAUNCH_LATENCY_US), MAX_LAUNCH_LATENCY_US)


def _sorted_column(values: np.ndarray) -> np.ndarray:
    """``sorted()`` of a column of finite floats: numpy's stable sort leaves equal values
    (0.0 and -0.0) in their order, as sorted() does, so the same floats sit at each place."""
    return np.sort(values, kind="stable")


def _launch_latency(kernels: Sequence[SimKernel], cols: _KernelColumns | None = None) -> float:
    """Median launch-to-start time of kernels that found their stream idle. Only the first
    kernel of a launch counts: a CUDA graph's kernels share one launch call. ``cols``: the
    kernels' columns, when the caller has them."""
    cols = cols or _KernelColumns.of(kernels)
    if cols is None:
        return _launch_latency_loop(kernels)
    order = np.argsort(cols.start, kind="stable")  # sorted() by start: ties keep their order
    start, end = cols.start[order], (cols.start + cols.dur)[order]
    stream, launch, has_launch = cols.stream[order], cols.launch[order], cols.has_launch[order]
    # what its stream was busy until before each kernel: the running maximum of the ends of
    # the stream's earlier kernels (-inf before the first)
    free = np.full(len(start), -np.inf)
    for code in set(stream.tolist()):
        at = np.flatnonzero(stream == code)
        free[at[1:]] = np.maximum.accumulate(end[at])[:-1]
    first = np.zeros(len(start), dtype=bool)  # the first kernel of each launch time
    launched = np.flatnonzero(has_launch)
    by_launch = launched[np.argsort(launch[launched], kind="stable")]
    values = launch[by_launch]
    first[by_launch[np.r_[True, values[1:] != values[:-1]]] if len(values) else by_launch] = True
    counted = first & (start > free + 1.0)
    gaps = start[counted] - launch[counted]  # finite: the columns are
    return _latency_of_sorted(_sorted_column(gaps[gaps >= 0]))


def _act_start(k: SimKernel) -> float:
    return k.act.start_us


def _launch_latency_loop(kernels: Sequence[SimKernel]) -> float:
    """:func:`_launch_latency` one kernel at a time (for values numpy would order otherwise)."""
    free: dict[tuple[int, int], float] = {}
    gaps = []
    seen: set[float] = set()
    never = float("-inf")
    for k in sorted(kernels, key=_act_start):
        a = k.act
        key = (a.device, a.stream)
        launch = k.launch_us
        if launch is not None:
            if launch not in seen and a.start_us > free.get(key, never) + 1.0:
                gaps.append(a.start_us - launch)
            seen.add(launch)
        end = a.start_us + a.dur_us
        if end > free.get(key, never):
            free[key] = end
        elif key not in free:
            free[key] = never  # as max(-inf, end) for an end that is not above -inf (NaN)
    return _median_latency(gaps)


def _median_gap(gaps: list[float]) -> float:
    gaps.sort()
    return _gap_of_sorted(gaps)


def _gap_of_sorted(gaps: Sequence[float] | np.ndarray) -> float:
    """The median of the queue gaps (ascending), at most MAX_QUEUE_GAP_US; 0.0 for few."""
    if len(gaps) < 16:
        return 0.0
    return min(float(gaps[len(gaps) // 2]), MAX_QUEUE_GAP_US)


def _queue_gap(kernels: Sequence[SimKernel], cols: _KernelColumns | None = None) -> float:
    """Median idle time between consecutive kernels of one stream when the second was
    launched before the first ended (the queue was full, so the host did not cause it).

    Even a GPU-bound iteration is not kernels packed end to end: the GPU front end needs
    about a microsecond or more between kernels, so a ResNet-50 step with ~1,600 kernels
    spends about 3 ms between them. A replay without it reads that time as host-bound."""
    cols = cols or _KernelColumns.of(kernels)
    if cols is None:
        return _queue_gap_loop(kernels)
    at = np.flatnonzero(cols.is_kernel & cols.has_launch)
    at = at[np.lexsort((cols.start[at], cols.stream[at]))]  # per stream by start, stably
    start, launch, stream = cols.start[at], cols.launch[at], cols.stream[at]
    end = start + cols.dur[at]
    same = stream[1:] == stream[:-1]  # (previous, next) pairs of one stream
    full = same & (launch[1:] < end[:-1] - MIN_LAUNCH_LATENCY_US)
    idle = start[1:][full] - end[:-1][full]
    return _gap_of_sorted(_sorted_column(np.where(0.0 > idle, 0.0, idle)))  # max(idle, 0.0)


def _queue_gap_loop(kernels: Sequence[SimKernel]) -> float:
    by_stream: dict[tuple[int, int], list[SimKernel]] = {}
    for k in kernels:
        if k.act.kind == "kernel" and k.launch_us is not None:
            by_stream.setdefault((k.act.device, k.act.stream), []).append(k)
    gaps: list[float] = []
    for ks in by_stream.values():
        ks.sort(key=_act_start)
        for prev, nxt in pairwise(ks):
            end = prev.act.start_us + prev.act.dur_us
            if nxt.launch_us is not None and nxt.launch_us < end - MIN_LAUNCH_LATENCY_US:
                gaps.append(max(nxt.act.start_us - end, 0.0))
    return _median_gap(gaps)


def calibrate(replay: Replay, target_us: float | None) -> float:
    """Host framework scale at which the replay without a fix takes ``target_us``.

    1.0 when the replay already takes about that long, or when no scale reaches it (a
    GPU-bound window: host speed does not set its time, the difference is run-to-run noise).
    """
    if not target_us:
        return 1.0
    identity = Fix()
    if gpu_bound(replay, target_us):
        # GPU-bound: the GPU alone takes the measured time, so the trace cannot tell how
        # fast the host really is; take the profiler's inflation seen where it can be
        # (a measured host time does better: calibrate_host)
        return GPU_BOUND_HOST_SCALE
    at_one = replay.run(identity, 1.0)
    if abs(at_one - target_us) <= CALIBRATION_TOLERANCE * target_us:
        return 1.0
    lo, hi = (0.02, 1.0) if at_one > target_us else (1.0, 2.0)
    if not replay.run(identity, lo) <= target_us <= replay.run(identity, hi):
        return lo if at_one > target_us else 1.0
    for _ in range(CALIBRATION_STEPS):
        mid = (lo + hi) / 2
        if replay.run(identity, mid) < target_us:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def gpu_bound(replay: Replay, target_us: float) -> bool:
    """Whether the replay with an infinitely fast host already takes ``target_us``: the
    window's time then says nothing of the host's speed."""
    return replay.run(Fix(), 0.0) >= (1 - CALIBRATION_TOLERANCE) * target_us


# A measured host time calibrates the host only where the host's time moves with its scale:
# at least this share of the host time between 0.9 and 1.1 times the scale found (a host that
# mostly waited on the GPU, at syncs or a full launch queue, says nothing of its own speed).
MIN_HOST_SENSITIVITY = 0.05
HOST_SCALE_RANGE = (0.05, 2.0)


def calibrate_host(replays: Sequence[Replay], host_us: float,
                   queue_depth: int | None = None) -> float | None:
    """The host framework scale at which replaying each iteration from an idle GPU makes the
    host finish in ``host_us`` (the hook's un-profiled dispatch probe: a step started on an
    idle GPU, timed on the host), the median over ``replays`` (one per iteration); None
    where no scale in HOST_SCALE_RANGE reaches it or the host's time hardly moves with it.
    ``queue_depth``: the GPU's launch queue as the window showed it (a probe whose launches
    filled it waited for the GPU, as the replay then does)."""
    found = []
    identity = Fix()
    lo0, hi0 = HOST_SCALE_RANGE

    def host(replay: Replay, scale: float) -> float:
        return replay.host_time(identity, scale, queue_depth)

    for replay in replays:
        if not host(replay, lo0) <= host_us <= host(replay, hi0):
            continue
        lo, hi = lo0, hi0
        for _ in range(CALIBRATION_STEPS + 4):  # the range is wider than calibrate's
            mid = (lo + hi) / 2
            if host(replay, mid) < host_us:
                lo = mid
            else:
                hi = mid
        scale = (lo + hi) / 2
        moved = host(replay, 1.1 * scale) - host(replay, 0.9 * scale)
        if moved >= MIN_HOST_SENSITIVITY * host_us:
            found.append(scale)
    if not found:
        return None
    found.sort()
    return found[len(found) // 2]


def predicted_ms(replay: Replay, fix: Fix, measured_ms: float, host_scale: float,
                 before: Fix | None = None) -> float:
    """The iteration time ``fix`` predicts, as a ratio on the measured (un-profiled) time;
    with ``before``: the time after both, when ``fix`` is meant to follow that one."""
    base = replay.run(Fix(), host_scale)
    if base <= 0:
        return measured_ms
    return measured_ms * replay.run(compose(before, fix) if before else fix, host_scale) / base


def compose(first: Fix, then: Fix) -> Fix:
    """Both fixes applied: kernel factors multiply, host rates multiply, syncs as either."""
    return Fix(kernel_factor=lambda k: first.kernel_factor(k) * then.kernel_factor(k),
               framework_rate=first.framework_rate * then.framework_rate,
               outside_rate=first.outside_rate * then.outside_rate,
               data_rate=first.data_rate * then.data_rate,
               copy_call_rate=first.copy_call_rate * then.copy_call_rate,
               syncs_wait=first.syncs_wait and then.syncs_wait,
               by_class=first.by_class and then.by_class,
               branch_rate=first.branch_rate * then.branch_rate,
               backward_rate=first.backward_rate * then.backward_rate)
