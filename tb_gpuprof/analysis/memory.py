"""The report's ``memory`` section: the allocator over the window, its peak and what held it.

Input: the ``[memory]`` events ``torch.profiler(profile_memory=True)`` records (one per
allocation or free, with the allocator's totals after it; :class:`tb_gpuprof.model.
MemoryEvents`), the analyzed iterations and the NVML window summary. Per device:

* allocated and reserved bytes over the window, down-sampled to at most ``MAX_POINTS``
  points by keeping each time bucket's lowest and highest event (the peak survives);
* the peak (bytes, time, iteration) and the allocations still live at that moment, each
  charged to the CPU op that made it: the innermost op enclosing the event on its thread,
  moving out past allocation primitives (``aten::empty`` under ``aten::ones`` is the
  ``aten::ones``'s memory), grouped by op and source line;
* the peak decomposed into parameters, gradients, optimizer state, activations, temporaries
  and what predates the window, with the reserve's fragmentation (analysis/memory_parts.py);
* per-iteration peaks. The per-iteration peaks of the whole run are the hook's always-on
  scalars (``SCALAR_TAGS``); the view reads them from the run.

A trace without allocator events gets ``recorded: false`` and a note saying how to get them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..model import CpuOp, MemoryEvents, Profile
from ..store.layout import MEMORY_ALLOCATED_PEAK_TAG, MEMORY_RESERVED_PEAK_TAG  # names only
from .iterations import IterationWindow
from .memory_parts import (
    PeakAt,
    TensorRecord,
    TrainingPhases,
    peak_parts,
    tensor_record,
    training_phases,
)

MAX_POINTS = 2000
MAX_HOLDERS = 12
# Ops that only allocate for their caller: an allocation inside one is the caller's.
ALLOCATION_PRIMITIVES = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::resize_", "aten::zeros_like", "aten::empty.memory_format",
})
SCALAR_TAGS = {"allocated_peak_mb": MEMORY_ALLOCATED_PEAK_TAG,
               "reserved_peak_mb": MEMORY_RESERVED_PEAK_TAG}
NOT_RECORDED = ("this trace holds no allocator events. The PyTorch hook records them by default "
                "(GpuProfiler(..., record_memory=True)); with torch.profiler directly, pass "
                "profile_memory=True. XPlane (TensorFlow/JAX) and Nsight Systems traces carry "
                "none")
_CPU, _CUDA = 0, 1  # c10::DeviceType


@dataclass(slots=True)
class _PartsInput:
    """What the peak's decomposition reads beside the events."""
    record: TensorRecord | None
    phases: TrainingPhases
    nvml: dict[str, Any] | None  # the one GPU NVML sampled, else None (which GPU is whose?)


def memory_section(profile: Profile, windows: Sequence[IterationWindow],
                   telemetry: dict[str, Any] | None,
                   memory_record: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``memory`` section (docs/report-schema.md#memory); ``windows``: the analyzed
    iterations' host-side bounds (an allocation happens on the host, when the op runs);
    ``memory_record``: the hook's record of the model's and optimizer's tensors
    (memory_parts.TensorRecord)."""
    t0 = windows[0].start_us
    section: dict[str, Any] = {"recorded": False, "note": NOT_RECORDED, "t0_us": round(t0, 3),
                               "devices": [], "nvml": _nvml(telemetry),
                               "scalar_tags": dict(SCALAR_TAGS)}
    mem = profile.memory
    if mem is None or not len(mem):
        return section
    by_device: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(mem.device_type, mem.device_id, strict=True)):
        by_device.setdefault(key, []).append(i)
    # GPUs first: on a GPU run the host allocations are the smaller story
    order = sorted(by_device, key=lambda k: (k[0] != _CUDA, k[1], k[0]))
    ops = _OpFinder(profile.cpu_ops)
    nvml = section["nvml"]
    parts = _PartsInput(tensor_record(memory_record), training_phases(profile),
                        nvml[0] if nvml is not None and len(nvml) == 1 else None)
    devices = [_device(mem, by_device[k], k, windows, ops, parts) for k in order]
    section["devices"] = [d for d in devices if d is not None]
    if section["devices"]:
        section["recorded"], section["note"] = True, None
    return section


def gpu_devices(section: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The ``memory`` section's devices that are not the host's (on a GPU run the host's
    allocations are the smaller story)."""
    return [d for d in (section or {}).get("devices") or []
            if not str(d.get("device", "")).startswith("cpu")]


def _device_name(device_type: int, device_id: int) -> str:
    if device_type == _CUDA:
        return f"cuda:{device_id}"
    return "cpu" if device_type == 0 else f"device type {device_type}:{device_id}"


def _device(mem: MemoryEvents, idx: list[int], key: tuple[int, int],
            windows: Sequence[IterationWindow], ops: _OpFinder,
            parts: _PartsInput) -> dict[str, Any] | None:
    lo, hi = windows[0].start_us, windows[-1].end_us
    ts = [mem.ts[i] for i in idx]
    a, b = bisect.bisect_left(ts, lo), bisect.bisect_right(ts, hi)
    if b <= a:
        return None  # this device's events all lie outside the analyzed iterations
    inside = idx[a:b]
    peak_i = max(inside, key=mem.allocated.__getitem__)  # the first of equal maxima
    peak_t = mem.ts[peak_i]
    reserved = [mem.reserved[i] for i in inside]
    # the CPU allocator reports a reserve of 0 throughout: no reserve to show
    has_reserved = any(r > 0 for r in reserved) or (key[0] == _CUDA and min(reserved) >= 0)
    pos = idx.index(peak_i)
    live = live_allocations(mem, idx[: pos + 1])
    holders = group_by_op(mem, live.values(), ops)
    tracked = sum(mem.nbytes[i] for i in live.values())
    allocated_at_peak = mem.allocated[peak_i]
    at = PeakAt(mem, idx, pos, live, _device_name(*key), counts_earlier=key[0] != _CPU,
                reserved=mem.reserved[peak_i] if has_reserved else None,
                max_reserved=max(reserved) if has_reserved else None)
    return {
        "device": at.device,
        "events": len(inside),
        "series": _series(mem, inside, lo, hi, has_reserved),
        "peak": {"allocated_bytes": allocated_at_peak,
                 "reserved_bytes": at.reserved,
                 "t_ms": round((peak_t - lo) / 1e3, 4),
                 "step": next((w.step for w in windows if w.start_us <= peak_t <= w.end_us),
                              None)},
        "max_reserved_bytes": at.max_reserved,
        "holders": holders[:MAX_HOLDERS],
        "holders_total": len(holders),
        # live at the peak but allocated before the profiler recorded (weights, optimizer
        # state, the data already on the device)
        "held_before_window_bytes": max(allocated_at_peak - tracked, 0),
        "peak_parts": peak_parts(at, parts.record, parts.phases,
                                 lambda events: group_by_op(mem, events, ops),
                                 parts.nvml if key[0] == _CUDA else None),
        "iterations": _per_iteration(mem, idx, ts, windows, has_reserved),
    }


def memory_range(mem: MemoryEvents | None, device: str, t0_us: float, start_ms: float,
                 end_ms: float) -> dict[str, Any] | None:
    """One device's allocator series over [start_ms, end_ms] of the window (ms from the
    section's ``t0_us``), down-sampled again to at most MAX_POINTS for that range: what a
    zoomed view draws where the whole window's series kept only each slice's extremes. None
    for a device the events do not hold."""
    if mem is None:
        return None
    idx = [i for i, key in enumerate(zip(mem.device_type, mem.device_id, strict=True))
           if _device_name(*key) == device]
    if not idx:
        return None
    lo, hi = t0_us + start_ms * 1e3, t0_us + end_ms * 1e3
    ts = [mem.ts[i] for i in idx]
    inside = idx[bisect.bisect_left(ts, lo):bisect.bisect_right(ts, hi)]
    has_reserved = mem.device_type[idx[0]] == _CUDA or any(mem.reserved[i] > 0 for i in idx)
    return _series(mem, inside, lo, hi, has_reserved, origin=t0_us)


def _series(mem: MemoryEvents, inside: list[int], lo: float, hi: float,
            has_reserved: bool, origin: float | None = None) -> dict[str, Any]:
    """At most MAX_POINTS points: each time bucket of [lo, hi]'s lowest and highest allocated
    value, in time order, so the peak and the troughs survive down-sampling; times in ms from
    ``origin`` (default ``lo``)."""
    keep = inside
    if len(inside) > MAX_POINTS:
        buckets = MAX_POINTS // 2
        width = (hi - lo) / buckets or 1.0
        chosen: dict[int, tuple[int, int]] = {}
        allocated = mem.allocated
        for i in inside:
            k = min(int((mem.ts[i] - lo) / width), buckets - 1)
            cur = chosen.get(k)
            if cur is None:
                chosen[k] = (i, i)
                continue
            low, high = cur
            if allocated[i] < allocated[low]:
                low = i
            if allocated[i] > allocated[high]:
                high = i
            chosen[k] = (low, high)
        keep = sorted({i for pair in chosen.values() for i in pair})
    t0 = lo if origin is None else origin
    return {"t_ms": [round((mem.ts[i] - t0) / 1e3, 4) for i in keep],
            "allocated_bytes": [mem.allocated[i] for i in keep],
            "reserved_bytes": [mem.reserved[i] for i in keep] if has_reserved else None,
            "downsampled_from": len(inside)}


def live_allocations(mem: MemoryEvents, upto: Iterable[int]) -> dict[int, int]:
    """The allocations live after the events ``upto`` (in time order): address -> the event
    index of its allocation."""
    live: dict[int, int] = {}
    for i in upto:
        if mem.nbytes[i] > 0:
            live[mem.addr[i]] = i
        elif mem.nbytes[i] < 0:
            live.pop(mem.addr[i], None)
    return live


def group_by_op(mem: MemoryEvents, allocations: Iterable[int],
                ops: _OpFinder) -> list[dict[str, Any]]:
    """Allocation events grouped by the op (and source line) that made them, largest
    first."""
    groups: dict[tuple[str, str | None], dict[str, Any]] = {}
    for i in allocations:
        op = ops.owner(mem.tid[i], mem.ts[i])
        name = op.name if op is not None else "(outside any operator)"
        stack = op.stack if op is not None else None
        key = (name, stack[0] if stack else None)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"op": name, "source": key[1], "stack": stack, "bytes": 0,
                               "allocations": 0}
        g["bytes"] += mem.nbytes[i]
        g["allocations"] += 1
    return sorted(groups.values(), key=lambda g: (-g["bytes"], g["op"]))


def _per_iteration(mem: MemoryEvents, idx: list[int], ts: list[float],
                   windows: Sequence[IterationWindow], has_reserved: bool
                   ) -> list[dict[str, Any]]:
    """Each iteration's highest allocated (and reserved) bytes; an iteration without events
    holds what the allocator held when it began."""
    out = []
    for w in windows:
        a, b = bisect.bisect_left(ts, w.start_us), bisect.bisect_right(ts, w.end_us)
        if b > a:
            sel = idx[a:b]
        elif a > 0:
            sel = [idx[a - 1]]
        else:
            continue
        out.append({"step": w.step,
                    "allocated_bytes": max(mem.allocated[i] for i in sel),
                    "reserved_bytes": max(mem.reserved[i] for i in sel) if has_reserved
                    else None})
    return out


def _nvml(telemetry: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """NVML framebuffer use over the window, per GPU (all processes, and this one's)."""
    gpus = (telemetry or {}).get("gpus") or []
    out = []
    for g in gpus:
        mean, peak = g.get("mean") or {}, g.get("max") or {}
        if "fb_used_mib" not in mean:
            continue
        out.append({"gpu": g.get("gpu"), "name": g.get("name"),
                    "used_mib_mean": mean.get("fb_used_mib"),
                    "used_mib_max": peak.get("fb_used_mib"),
                    "total_mib": mean.get("fb_total_mib"),
                    "process_mib_max": peak.get("process_mem_mib")})
    return out or None


class _OpFinder:
    """The op an allocation belongs to: per thread, ops in start order with each one's
    parent, so the innermost op enclosing a time is a bisect and a short walk up."""

    def __init__(self, cpu_ops: list[CpuOp]) -> None:
        self._ops = cpu_ops
        self._threads: dict[int, tuple[list[float], list[CpuOp], list[int]]] | None = None

    def _index(self) -> dict[int, tuple[list[float], list[CpuOp], list[int]]]:
        by_tid: dict[int, list[CpuOp]] = {}
        for op in self._ops:  # sorted by start (the readers sort them)
            by_tid.setdefault(op.tid, []).append(op)
        threads = {}
        for tid, ops in by_tid.items():
            ops.sort(key=lambda o: (o.start_us, -o.dur_us))  # parents first at equal starts
            parent = [-1] * len(ops)
            stack: list[int] = []
            for j, op in enumerate(ops):
                while stack and ops[stack[-1]].start_us + ops[stack[-1]].dur_us < op.start_us:
                    stack.pop()
                parent[j] = stack[-1] if stack else -1
                stack.append(j)
            threads[tid] = ([o.start_us for o in ops], ops, parent)
        return threads

    def owner(self, tid: int, t: float) -> CpuOp | None:
        if self._threads is None:
            self._threads = self._index()
        entry = self._threads.get(tid)
        if entry is None:
            return None
        starts, ops, parent = entry
        j = bisect.bisect_right(starts, t) - 1
        while j >= 0 and ops[j].start_us + ops[j].dur_us < t:
            j = parent[j]  # every op enclosing t is an ancestor of the last one started
        while j >= 0 and ops[j].name in ALLOCATION_PRIMITIVES and parent[j] >= 0:
            j = parent[j]
        return ops[j] if j >= 0 else None
