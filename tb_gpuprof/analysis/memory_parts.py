"""The allocator's peak, decomposed: what the bytes live at the peak hold (issue 40, item 1).

Parts, in :data:`PARTS` order, each a share of the allocator's allocated bytes at the peak
(on the CPU, whose allocator counts only what it allocates while profiling, plus the recorded
tensors from before the window: ``uncounted_bytes``):

* ``parameters`` and ``optimizer_state``: the tensors the hook recorded from the model and the
  optimizer at the window's stop (:class:`TensorRecord`, written by
  tb_gpuprof/capture/torch_memory.py), found by their storage's address;
* ``gradients``: the recorded ``.grad`` tensors, and what a backward pass allocated that
  outlived it;
* ``activations``: what was allocated before a backward pass (its forward) and lived into it:
  what the forward saved for the backward;
* ``temporaries``: every other allocation the window saw, live at the peak;
* ``before_window``: what the allocator counts at the peak that the window did not see
  allocated and that is no recorded tensor (a batch already on the device, caches, other
  models), and the allocator's rounding of the recorded tensors allocated before the window.

Beside the parts: the reserve the allocator holds unallocated (fragmentation) and, where NVML
was sampled, the device memory this process uses outside PyTorch's reserve.

Framework-free: the events are :class:`tb_gpuprof.model.MemoryEvents`; the phases come from
the trace's ops (autograd's) and optimizer-step ranges.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

import msgspec
import numpy as np

from ..model import OPTIMIZER, MemoryEvents, Profile
from . import columns
from .intervals import merge
from .linking import is_backward_op

PARAMETERS, GRADIENTS, OPTIMIZER_STATE = "parameters", "gradients", "optimizer_state"
ACTIVATIONS, TEMPORARIES, BEFORE_WINDOW = "activations", "temporaries", "before_window"
PARTS = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, TEMPORARIES, BEFORE_WINDOW)
RECORDED_KINDS = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE)  # the kinds a TensorRecord holds
MAX_PART_HOLDERS = 8
SUM_TOLERANCE = 0.01  # sum_matches_allocated: the parts within 1% of the allocator's total


class AllocatorAtStop(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One CUDA device's caching allocator at the window's stop (torch.cuda.memory_stats and
    the largest free block of torch.cuda.memory_snapshot)."""
    reserved_bytes: int | None = None
    allocated_bytes: int | None = None
    inactive_split_bytes: int | None = None
    largest_free_block_bytes: int | None = None


class TensorRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The hook's record of the model's and the optimizer's tensors at the window's stop, one
    entry per tensor as columns: its kind (a RECORDED_KINDS name), the parameter it belongs
    to, the optimizer-state key (``exp_avg``; None for the others), its device (``cuda:0``),
    its storage's address and size, and its own size (numel * element size)."""
    kind: list[str] = msgspec.field(default_factory=list)
    param: list[str] = msgspec.field(default_factory=list)
    key: list[str | None] = msgspec.field(default_factory=list)
    device: list[str] = msgspec.field(default_factory=list)
    ptr: list[int] = msgspec.field(default_factory=list)
    storage_bytes: list[int] = msgspec.field(default_factory=list)
    tensor_bytes: list[int] = msgspec.field(default_factory=list)
    recorded: list[str] = msgspec.field(default_factory=list)  # the kinds the hook could see
    allocator: dict[str, AllocatorAtStop] = msgspec.field(default_factory=dict)  # per device
    notes: list[str] = msgspec.field(default_factory=list)


def tensor_record(data: dict[str, Any] | None) -> TensorRecord | None:
    """The stored record, checked; None when there is none or it is unusable (the parts are
    then the events' alone)."""
    if not data:
        return None
    try:
        record = msgspec.convert(data, TensorRecord)
    except msgspec.ValidationError:
        return None
    columns_ = (record.kind, record.param, record.key, record.device, record.ptr,
                record.storage_bytes, record.tensor_bytes)
    return record if len({len(c) for c in columns_}) == 1 else None


@dataclass(slots=True)
class Storage:
    """One recorded storage (tensors sharing one are counted once)."""
    kind: str
    storage_bytes: int
    tensor_bytes: int = 0
    module: str = ""


def module_of(param: str) -> str:
    """The module a parameter belongs to, by its name: ``layer1.0.conv1.weight`` ->
    ``layer1.0.conv1``; a parameter of the root module -> ``(model)``."""
    owner = param.rpartition(".")[0]
    return owner or "(model)"


def recorded_storages(record: TensorRecord | None, device: str) -> dict[int, Storage]:
    """The recorded storages on ``device`` by address; a storage recorded as two kinds (a
    state tensor aliasing its parameter) is the first of RECORDED_KINDS."""
    out: dict[int, Storage] = {}
    if record is None:
        return out
    rank = {k: i for i, k in enumerate(RECORDED_KINDS)}
    for kind, param, dev, ptr, nbytes, tbytes in zip(
            record.kind, record.param, record.device, record.ptr, record.storage_bytes,
            record.tensor_bytes, strict=True):
        if dev != device or kind not in rank or ptr == 0:
            continue
        s = out.get(ptr)
        if s is None or rank[kind] < rank[s.kind]:
            s = out[ptr] = Storage(kind, nbytes, module=module_of(param))
        if s.kind == kind:
            s.tensor_bytes += tbytes
    return out


@dataclass(slots=True)
class TrainingPhases:
    """The trace's backward passes and optimizer steps, host times (µs), each in time order."""
    backward: list[tuple[float, float]] = field(default_factory=list)
    optimizer: list[tuple[float, float]] = field(default_factory=list)
    _backward_starts: list[float] = field(init=False)
    _optimizer_starts: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self._backward_starts = [s for s, _ in self.backward]
        self._optimizer_starts = [s for s, _ in self.optimizer]

    def part_of(self, t_alloc: float, t_free: float | None) -> str:
        """The part of an allocation made at ``t_alloc`` and freed at ``t_free`` (None: not
        freed in the trace) that is none of the recorded tensors."""
        starts = self._backward_starts
        k = bisect.bisect_right(starts, t_alloc) - 1
        if k >= 0 and t_alloc <= self.backward[k][1]:  # made by backward pass k
            outlived = t_free is None or t_free > self.backward[k][1]
            return GRADIENTS if outlived else TEMPORARIES
        if k + 1 < len(starts) and (t_free is None or t_free >= starts[k + 1]) and \
                self._same_step(t_alloc, starts[k + 1]):
            return ACTIVATIONS  # made before the next backward pass, lived into it
        return TEMPORARIES

    def _same_step(self, t: float, u: float) -> bool:
        """No optimizer step begins or ends between ``t`` and ``u``: both in the same forward
        (a closure's forward and backward both run inside its optimizer step)."""
        starts = self._optimizer_starts
        j, k = bisect.bisect_right(starts, t) - 1, bisect.bisect_right(starts, u) - 1
        if j != k:
            return False
        return j < 0 or (t <= self.optimizer[j][1]) == (u <= self.optimizer[j][1])


def training_phases(profile: Profile) -> TrainingPhases:
    """Backward passes from autograd's ops; optimizer steps from ``Optimizer.step`` ranges."""
    steps = sorted((a.start_us, a.start_us + a.dur_us) for a in profile.annotations
                   if a.kind == OPTIMIZER and not a.on_gpu)
    ops = profile.cpu_ops
    backward_names = {n for n in columns.distinct(ops, "name") if is_backward_op(n)}
    if not backward_names:
        return TrainingPhases([], steps)
    names = columns.values(ops, "name")
    is_bwd = np.fromiter((n in backward_names for n in names), bool, len(ops))
    start = columns.floats(ops, "start_us")
    end = start + columns.floats(ops, "dur_us")
    pieces = merge(zip(start[is_bwd].tolist(), end[is_bwd].tolist(), strict=True))
    return TrainingPhases(_join_passes(pieces, _splitting_starts(ops, start, is_bwd, pieces)),
                          steps)


def _splitting_starts(ops: Sequence[Any], start: np.ndarray, is_bwd: np.ndarray,
                      pieces: list[tuple[float, float]]) -> np.ndarray:
    """Starts of the ops that end a backward pass where they fall between two backward ops:
    the ops outside the backward of the threads that run backward ops or the most ops
    outside it (the training loop's; on a GPU the backward runs on autograd's own thread,
    which runs the most ops in all). A pin-memory or logging thread's ops split nothing."""
    piece_start = np.array([p[0] for p in pieces])
    piece_end = np.array([p[1] for p in pieces])
    k = np.searchsorted(piece_start, start, "right") - 1
    outside = ~is_bwd & ((k < 0) | (start > piece_end[np.maximum(k, 0)]))
    if not outside.any():
        return np.empty(0)
    tids = columns.values(ops, "tid")
    threads = {t for t, b in zip(tids, is_bwd.tolist(), strict=True) if b}
    threads.add(Counter(compress(tids, outside.tolist())).most_common(1)[0][0])
    on_threads = np.fromiter((t in threads for t in tids), bool, len(tids))
    return np.sort(start[on_threads & outside])


def _join_passes(pieces: list[tuple[float, float]], splitters: np.ndarray
                 ) -> list[tuple[float, float]]:
    """Backward pieces joined into passes where no splitting op starts between them
    (gradient accumulation's forward between two backward passes splits them)."""
    passes: list[tuple[float, float]] = []
    for s, e in pieces:
        if passes:
            gap_ops = (np.searchsorted(splitters, s, "left")
                       - np.searchsorted(splitters, passes[-1][1], "right"))
            if gap_ops == 0:
                passes[-1] = (passes[-1][0], e)
                continue
        passes.append((s, e))
    return passes


@dataclass(slots=True)
class PeakAt:
    """One device's events and its peak: ``idx`` its events' indices in time order, ``pos``
    the peak's position in ``idx``, ``live`` the allocations live at the peak (address ->
    event index), ``counts_earlier`` whether the allocator's total counts what it allocated
    before the profiler started (CUDA's does; the CPU allocator counts only what it allocates
    while profiling), ``reserved`` its reserve at the peak (None: no reserve)."""
    mem: MemoryEvents
    idx: list[int]
    pos: int
    live: dict[int, int]
    device: str
    counts_earlier: bool
    reserved: int | None = None
    max_reserved: int | None = None  # the highest reserve in the window

    @property
    def allocated(self) -> int:
        return self.mem.allocated[self.idx[self.pos]]


Grouper = Callable[[Iterable[int]], list[dict[str, Any]]]


def peak_parts(at: PeakAt, record: TensorRecord | None, phases: TrainingPhases,
               group: Grouper, nvml: dict[str, Any] | None = None) -> dict[str, Any]:
    """The device's ``peak_parts`` (docs/report-schema.md#memory). ``group``: the memory
    section's holders of a list of allocation events (by op and source line); ``nvml``: the
    NVML use of this device over the window (memory.py's ``nvml`` entry), or None."""
    storages = recorded_storages(record, at.device)
    split = _split_live(at, storages, phases)
    untracked = {ptr: s for ptr, s in storages.items() if ptr not in split.last_alloc}
    known = sum(s.storage_bytes for s in untracked.values())
    tracked = sum(at.mem.nbytes[i] for i in at.live.values())
    unseen = at.allocated - tracked  # counted by the allocator, not allocated in the trace
    before, uncounted = (max(unseen - known, 0), 0) if at.counts_earlier else \
        (max(unseen, 0), known)
    recorded = set(record.recorded if record is not None else ()) & set(RECORDED_KINDS)
    parts = [_part(kind, split, untracked, kind in recorded, at.mem, group)
             for kind in RECORDED_KINDS]
    parts += [_event_part(kind, split.events[kind], at.mem, group)
              for kind in (ACTIVATIONS, TEMPORARIES)]
    parts.append(_plain_part(BEFORE_WINDOW, before, None))
    total = sum(p["bytes"] or 0 for p in parts)
    allocator = record.allocator.get(at.device) if record is not None else None
    return {"allocated_bytes": at.allocated, "parts": parts, "uncounted_bytes": uncounted,
            "sum_matches_allocated": abs(total - uncounted - at.allocated)
            <= SUM_TOLERANCE * at.allocated,
            "tensors_recorded": sorted(recorded, key=RECORDED_KINDS.index),
            "backward_passes": len(phases.backward),
            "fragmentation": _fragmentation(at, allocator),
            "outside_pytorch": _outside_pytorch(at, nvml)}


@dataclass(slots=True)
class _LiveSplit:
    """The live allocations at the peak by part: recorded storages (address -> its storage
    and the allocator's bytes for it) and the others' event indices."""
    last_alloc: dict[int, int]  # recorded address -> its last allocation event in the trace
    recorded: dict[str, list[tuple[Storage, int]]]
    events: dict[str, list[int]]


def _split_live(at: PeakAt, storages: dict[int, Storage], phases: TrainingPhases) -> _LiveSplit:
    mem = at.mem
    last_alloc = _last_allocations(mem, at.idx, storages)
    freed_at = _first_frees(mem, at.idx[at.pos + 1:], at.live)
    split = _LiveSplit(last_alloc, {k: [] for k in RECORDED_KINDS},
                       {k: [] for k in (GRADIENTS, ACTIVATIONS, TEMPORARIES)})
    for addr, i in at.live.items():
        s = storages.get(addr)
        # a recorded tensor is live at the stop: its allocation is the last at its address
        if s is not None and last_alloc.get(addr) == i:
            split.recorded[s.kind].append((s, mem.nbytes[i]))
        else:
            split.events[phases.part_of(mem.ts[i], freed_at.get(addr))].append(i)
    return split


def _last_allocations(mem: MemoryEvents, idx: list[int], storages: dict[int, Storage]
                      ) -> dict[int, int]:
    """Recorded address -> the event index of its last allocation on this device."""
    if not storages:
        return {}
    ix = np.asarray(idx, np.int64)
    addr = np.frombuffer(mem.addr, np.int64)[ix]
    alloc = np.frombuffer(mem.nbytes, np.int64)[ix] > 0
    hit = alloc & np.isin(addr, np.fromiter(storages, np.int64, len(storages)))
    return dict(zip(addr[hit].tolist(), ix[hit].tolist(), strict=True))  # later wins


def _first_frees(mem: MemoryEvents, after: list[int], live: dict[int, int]) -> dict[int, float]:
    """Live address -> the time of its first free after the peak (its allocation's free)."""
    if not after or not live:
        return {}
    ix = np.asarray(after, np.int64)
    frees = ix[np.frombuffer(mem.nbytes, np.int64)[ix] < 0]
    addr = np.frombuffer(mem.addr, np.int64)[frees]
    first_addr, first = np.unique(addr, return_index=True)
    ts = np.frombuffer(mem.ts, np.float64)[frees[first]]
    return {a: t for a, t in zip(first_addr.tolist(), ts.tolist(), strict=True) if a in live}


def _part(kind: str, split: _LiveSplit, untracked: dict[int, Storage], recorded: bool,
          mem: MemoryEvents, group: Grouper) -> dict[str, Any]:
    """A recorded kind: its storages live at the peak (the allocator's bytes where the trace
    saw the allocation, the storage's size where it came before) and, for gradients, what the
    backward passes left; ``bytes`` null where the hook could not record the kind."""
    if not recorded and kind != GRADIENTS:
        return _plain_part(kind, None, None)
    held = split.recorded[kind] + [(s, s.storage_bytes) for s in untracked.values()
                                   if s.kind == kind]
    events = split.events.get(kind, [])
    modules: dict[str, dict[str, Any]] = {}
    for s, nbytes in held:
        m = modules.setdefault(s.module, _holder(s.module, None, None))
        m["bytes"] += nbytes
        m["allocations"] += 1
    part = _plain_part(kind, sum(n for _, n in held) + sum(mem.nbytes[i] for i in events),
                       None if kind == GRADIENTS else sum(s.tensor_bytes for s, _ in held))
    return _with_holders(part, list(modules.values()) + _op_holders(events, group),
                         len(held) + len(events))


def _event_part(kind: str, events: list[int], mem: MemoryEvents, group: Grouper
                ) -> dict[str, Any]:
    part = _plain_part(kind, sum(mem.nbytes[i] for i in events), None)
    return _with_holders(part, _op_holders(events, group), len(events))


def _op_holders(events: list[int], group: Grouper) -> list[dict[str, Any]]:
    return [_holder(None, g["op"], g["source"], g["bytes"], g["allocations"])
            for g in group(events)] if events else []


def _holder(module: str | None, op: str | None, source: str | None, nbytes: int = 0,
            allocations: int = 0) -> dict[str, Any]:
    return {"module": module, "op": op, "source": source, "bytes": nbytes,
            "allocations": allocations}


def _plain_part(kind: str, nbytes: int | None, tensor_bytes: int | None) -> dict[str, Any]:
    return {"part": kind, "bytes": nbytes, "tensor_bytes": tensor_bytes, "allocations": 0,
            "holders": [], "holders_total": 0}


def _with_holders(part: dict[str, Any], holders: list[dict[str, Any]], allocations: int
                  ) -> dict[str, Any]:
    holders.sort(key=lambda h: (-h["bytes"], h["module"] or "", h["op"] or ""))
    part.update(allocations=allocations, holders=holders[:MAX_PART_HOLDERS],
                holders_total=len(holders))
    return part


def _fragmentation(at: PeakAt, allocator: AllocatorAtStop | None) -> dict[str, Any] | None:
    """Reserved but unallocated at the peak; the allocator's own figures at the stop."""
    if at.reserved is None:
        return None
    return {"bytes": max(at.reserved - at.allocated, 0),
            "at_stop": msgspec.to_builtins(allocator) if allocator is not None else None}


def _outside_pytorch(at: PeakAt, nvml: dict[str, Any] | None) -> dict[str, Any] | None:
    """NVML's used memory (this process's where NVML tells it, else the device's) minus the
    allocator's reserve, both at their highest in the window: the CUDA context, libraries'
    own allocations (NCCL, cuDNN/cuBLAS workspaces outside the caching allocator)."""
    if nvml is None or at.reserved is None:
        return None
    process, device = nvml.get("process_mib_max"), nvml.get("used_mib_max")
    used_mib, scope = (process, "process") if process is not None else (device, "device")
    if used_mib is None:
        return None
    used, reserved = int(used_mib * 2**20), at.max_reserved if at.max_reserved is not None \
        else at.reserved
    return {"bytes": used - reserved, "nvml_used_bytes": used, "reserved_bytes": reserved,
            "scope": scope}


def batch_headroom(device: dict[str, Any], total_bytes: int | None) -> float | None:
    """How many times the current batch would fit on the device, from the peak's parts
    (``device``: a ``memory.devices`` entry): activations and temporaries grow with the batch,
    parameters, gradients, optimizer state and what predates the window do not. The device's
    memory outside PyTorch stays taken, and the allocator keeps its share of reserved but
    unallocated memory (fragmentation) at the larger batch too. None without the parts, a
    backward pass or the device's capacity."""
    parts = device.get("peak_parts")
    if not parts or not total_bytes or not parts.get("backward_passes"):
        return None
    by = {p["part"]: p["bytes"] or 0 for p in parts["parts"]}
    growing = by.get(ACTIVATIONS, 0) + by.get(TEMPORARIES, 0)
    if growing <= 0:
        return None
    fixed = sum(by.values()) - growing
    outside = (parts.get("outside_pytorch") or {}).get("bytes") or 0
    reserved = (device.get("peak") or {}).get("reserved_bytes")
    allocated = parts["allocated_bytes"]
    kept = allocated / reserved if reserved and allocated and reserved >= allocated else 1.0
    usable = (total_bytes - outside) * kept  # allocatable, at the allocator's present packing
    return max((usable - fixed) / growing, 0.0)
