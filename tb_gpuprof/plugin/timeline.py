"""The window's timeline at a requested level of detail (the /timeline route).

A trace holds up to millions of events; the browser never gets them all. The index built once
per trace file keeps, per lane (a CPU thread's nesting depth or a GPU stream), the events'
start/end times as sorted numpy arrays. A request names a time range and a pixel width: the
events of the range are merged wherever the gap between them is under one pixel, so the answer
holds at most about ``width`` bars per lane whatever the zoom. A bar of one event carries its id
(``event()`` gives its op, stack, shapes and FLOPs); a merged bar carries its count and the name
of its longest event. A lane therefore answers at most width + 1 bars: each new bar follows a
gap of at least a pixel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model import KERNEL, CpuOp, GpuActivity, Profile, PythonCalls, RuntimeCall

MAX_WIDTH = 8192
MAX_DEPTH = 12  # CPU nesting levels drawn; deeper ops fold into the last lane
MAX_PYTHON_DEPTH = 16  # Python call levels drawn per thread (stacks run deep)
# Long lanes keep copies pre-merged at 1/65536 of the window (and 16x coarser); a request
# merges the coarsest copy no coarser than its own pixel (same bars, far fewer entries).
COARSE_PIXELS = 65536
COARSE_MIN_EVENTS = 20000
_NCCL = re.compile(r"nccl", re.IGNORECASE)

# Bar categories (the frontend colours them).
CAT_OP, CAT_RUNTIME, CAT_KERNEL, CAT_MEMCPY, CAT_MEMSET, CAT_NCCL, CAT_PYTHON = range(7)
CATEGORIES = ["op", "runtime", "kernel", "memcpy", "memset", "nccl", "python"]
# Columns of the answer's "bars" (one list each): row, lane (CPU nesting depth), start/end
# (µs from the window start), count of merged events, category, index into "names", and the
# event id of a single-event bar (-1 for a merged one).
BAR_FIELDS = ("row", "lane", "start", "end", "count", "cat", "name", "id")


class TimelineError(ValueError):
    """A request the timeline cannot answer (bad range or width)."""


@dataclass(slots=True)
class _Level:
    """A lane's events, or (coarse level) its events pre-merged at ``px_us`` per pixel."""

    start: np.ndarray  # µs from the window start, sorted
    end: np.ndarray  # running maximum of the stops: a bisectable bound for range queries
    stop: np.ndarray  # each entry's own end
    dur: np.ndarray  # of the entry's longest event
    ids: np.ndarray  # the longest event (index into TimelineIndex.events)
    count: np.ndarray | None  # events per entry (None: one each)
    px_us: float = 0.0


@dataclass(slots=True)
class _Lane:
    row: int
    depth: int
    levels: list[_Level]  # the events first, then coarser pre-merged copies


@dataclass(slots=True)
class _Merged:
    first: np.ndarray  # index of each bar's first entry
    longest: np.ndarray  # index of each bar's longest entry
    count: np.ndarray
    stop: np.ndarray


def _merge_level(lv: _Level, i0: int, i1: int, px: float) -> _Merged:
    """Entries [i0, i1) merged wherever the gap after everything before one is under ``px``.
    Vectorised and O(n): a 1M-event lane is a few numpy passes. Merging by gap is transitive,
    so merging a copy pre-merged at a finer pixel gives the same bars as merging every event."""
    s, d = lv.start[i0:i1], lv.dur[i0:i1]
    # every entry before i0 ended before lo, so lv.end over the slice is its own running max
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.greater_equal(s[1:] - lv.end[i0:i1][:-1], px, out=new[1:])
    first = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    if lv.count is None:
        count = np.diff(np.append(first, len(s)))
    else:
        count = np.add.reduceat(lv.count[i0:i1], first)
    stop = np.maximum.reduceat(lv.stop[i0:i1], first)
    # the first of each bar's longest entries names it (no sort)
    cand = np.flatnonzero(d == np.maximum.reduceat(d, first)[group])
    cg = group[cand]
    longest = cand[np.flatnonzero(np.r_[True, cg[1:] != cg[:-1]])]
    return _Merged(first, longest, count, stop)


def _coarser(lv: _Level, px: float) -> _Level:
    m = _merge_level(lv, 0, len(lv.start), px)
    return _Level(lv.start[m.first], np.maximum.accumulate(m.stop), m.stop, lv.dur[m.longest],
                  lv.ids[m.longest], m.count.astype(np.int64), px)


def _gpu_category(a: GpuActivity) -> int:
    if a.kind == KERNEL:
        return CAT_NCCL if _NCCL.search(a.name) else CAT_KERNEL
    return CAT_MEMCPY if a.kind == "memcpy" else CAT_MEMSET


def _depths(starts: np.ndarray, ends: np.ndarray, max_depth: int = MAX_DEPTH) -> np.ndarray:
    """Nesting level of each event of one thread (sorted by start, longer first on ties)."""
    depth = np.zeros(len(starts), dtype=np.int32)
    stack: list[float] = []
    for i in range(len(starts)):
        s = starts[i]
        while stack and stack[-1] <= s:
            stack.pop()
        depth[i] = min(len(stack), max_depth - 1)
        stack.append(ends[i])
    return depth


class TimelineIndex:
    """Rows (CPU threads, GPU streams) of one profiled window, ready for range queries."""

    def __init__(self, profile: Profile, report: dict[str, Any] | None = None) -> None:
        host: list[CpuOp | RuntimeCall] = [*profile.cpu_ops, *profile.runtime]
        self.events: list[Any] = [*host, *profile.gpu]
        cats = [CAT_OP] * len(profile.cpu_ops) + [CAT_RUNTIME] * len(profile.runtime)
        self.categories = np.array(cats + [_gpu_category(a) for a in profile.gpu], dtype=np.int8)
        times = [e.start_us for e in self.events]
        self.t0 = min(times) if times else 0.0
        self.t1 = max((e.start_us + e.dur_us for e in self.events), default=self.t0)
        self.rows: list[dict[str, Any]] = []
        self.lanes: list[_Lane] = []
        self._by_external: dict[int, CpuOp] = {op.external_id: op for op in profile.cpu_ops
                                               if op.external_id is not None}
        self.python = profile.python
        self.memory = profile.memory  # the allocator's events: /memory's zoomed series
        self._python_rows = self._python_threads(profile.python, len(self.events))
        self._add_host_rows(host)
        self._add_gpu_rows(profile.gpu, len(host))
        self.iterations = iteration_marks(report or {}, self.t0)

    def _name(self, event_id: int) -> str:
        n = len(self.events)
        if event_id < n or self.python is None:
            return self.events[event_id].name
        return self.python.name[event_id - n]

    def _add_lanes(self, row: int, ids: np.ndarray, depth: np.ndarray | None,
                   times: tuple[np.ndarray, np.ndarray] | None = None,
                   max_depth: int = MAX_DEPTH) -> None:
        if times is None:
            starts = np.array([self.events[i].start_us for i in ids], dtype=np.float64) - self.t0
            durs = np.array([max(self.events[i].dur_us, 0.0) for i in ids], dtype=np.float64)
        else:
            starts, durs = times
        order = np.lexsort((-durs, starts))
        ids, starts, durs = ids[order], starts[order], durs[order]
        if depth is None:
            depth = _depths(starts, starts + durs, max_depth)
        for d in np.unique(depth):
            sel = depth == d
            s, du = starts[sel], durs[sel]
            raw = _Level(s, np.maximum.accumulate(s + du), s + du, du, ids[sel], None)
            self.lanes.append(_Lane(row, int(d), self._levels(raw)))
        self.rows[row]["lanes"] = int(depth.max()) + 1 if len(depth) else 1

    def _levels(self, raw: _Level) -> list[_Level]:
        """The events plus, for a long lane, copies pre-merged at 1/COARSE_PIXELS of the
        window and 16x coarser: a zoomed-out request merges those instead of every event."""
        levels = [raw]
        px = (self.t1 - self.t0) / COARSE_PIXELS
        while px > 0 and len(levels[-1].start) > COARSE_MIN_EVENTS and len(levels) < 3:
            coarse = _coarser(levels[-1], px)
            if len(coarse.start) > 0.5 * len(levels[-1].start):
                break  # sparse lane: merging buys little
            levels.append(coarse)
            px *= 16
        return levels

    def _add_host_rows(self, host: list[CpuOp | RuntimeCall]) -> None:
        by_tid: dict[int, list[int]] = {}
        for i, e in enumerate(host):
            by_tid.setdefault(e.tid, []).append(i)
        for tid in sorted(by_tid):
            self.rows.append({"id": len(self.rows), "kind": "cpu", "label": f"CPU thread {tid}",
                              "events": len(by_tid[tid])})
            self._add_lanes(len(self.rows) - 1, np.array(by_tid[tid], dtype=np.int64), None)
            if tid in self._python_rows:  # a thread's Python calls right under its ops
                self._add_python_row(tid)
        for tid in sorted(set(self._python_rows) - set(by_tid)):
            self._add_python_row(tid)

    def _add_gpu_rows(self, gpu: list[GpuActivity], offset: int) -> None:
        by_stream: dict[tuple[int, int], list[int]] = {}
        for i, a in enumerate(gpu):
            by_stream.setdefault((a.device, a.stream), []).append(offset + i)
        for device, stream in sorted(by_stream):
            ids = np.array(by_stream[(device, stream)], dtype=np.int64)
            self.rows.append({"id": len(self.rows), "kind": "gpu",
                              "label": f"GPU {device} stream {stream}", "events": len(ids)})
            # a stream runs one thing at a time: one lane (overlaps, if any, merge)
            self._add_lanes(len(self.rows) - 1, ids, np.zeros(len(ids), dtype=np.int32))

    def _python_threads(self, calls: PythonCalls | None, offset: int
                        ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per thread, the Python calls (``with_stack``) that overlap the window: ids (from
        ``offset``), start and duration, cut to the window (``<module>`` and the training
        loop reach outside it)."""
        if calls is None or not len(calls):
            return {}
        start = np.frombuffer(calls.start, dtype=np.float64)
        stop = start + np.maximum(np.frombuffer(calls.dur, dtype=np.float64), 0.0)
        tid = np.frombuffer(calls.tid, dtype=np.int64)
        inside = np.flatnonzero((stop >= self.t0) & (start <= self.t1))
        cut_start = np.maximum(start[inside], self.t0) - self.t0
        cut_dur = np.minimum(stop[inside], self.t1) - self.t0 - cut_start
        self.categories = np.concatenate(
            [self.categories, np.full(len(calls), CAT_PYTHON, dtype=np.int8)])
        threads = {}
        for t in np.unique(tid[inside]).tolist():
            sel = tid[inside] == t
            threads[t] = (inside[sel] + offset, cut_start[sel], cut_dur[sel])
        return threads

    def _add_python_row(self, tid: int) -> None:
        ids, start, dur = self._python_rows[tid]
        self.rows.append({"id": len(self.rows), "kind": "python",
                          "label": f"Python thread {tid}", "events": len(ids)})
        self._add_lanes(len(self.rows) - 1, ids, None, (start, dur), MAX_PYTHON_DEPTH)

    def total_events(self) -> int:
        """Events drawn: host and GPU events, and the Python calls overlapping the window."""
        return len(self.events) + sum(len(v[0]) for v in self._python_rows.values())

    def window(self, start_us: float | None, end_us: float | None, width: int) -> dict[str, Any]:
        """Bars of [start_us, end_us] (µs from the window start) merged to ``width`` pixels."""
        span = self.t1 - self.t0
        lo = 0.0 if start_us is None else float(start_us)
        hi = span if end_us is None else float(end_us)
        if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo:
            raise TimelineError("end_us must be greater than start_us")
        if not 1 <= width <= MAX_WIDTH:
            raise TimelineError(f"width must be between 1 and {MAX_WIDTH} pixels")
        px = (hi - lo) / width
        names: dict[str, int] = {}
        out: dict[str, list] = {k: [] for k in BAR_FIELDS}
        for lane in self.lanes:
            self._merge(lane, lo, hi, px, names, out)
        return {"t0_us": self.t0, "span_us": span, "start_us": lo, "end_us": hi, "width": width,
                "px_us": px, "rows": self.rows, "categories": CATEGORIES, "names": list(names),
                "bars": out, "events": self.total_events(), "iterations": self.iterations}

    def _merge(self, lane: _Lane, lo: float, hi: float, px: float, names: dict[str, int],
               out: dict[str, list]) -> None:
        lv = lane.levels[0]
        for coarse in lane.levels[1:]:
            if coarse.px_us <= px:
                lv = coarse
        i0 = int(np.searchsorted(lv.end, lo, side="left"))
        i1 = int(np.searchsorted(lv.start, hi, side="right"))
        if i1 <= i0:
            return
        m = _merge_level(lv, i0, i1, px)
        ids = lv.ids[i0:i1][m.longest]
        name_of = self._name
        for j in ids.tolist():
            out["name"].append(names.setdefault(name_of(j), len(names)))
        out["row"].extend([lane.row] * len(m.first))
        out["lane"].extend([lane.depth] * len(m.first))
        out["start"].extend(np.round(lv.start[i0:i1][m.first], 3).tolist())
        out["end"].extend(np.round(m.stop, 3).tolist())
        out["count"].extend(m.count.tolist())
        out["cat"].extend(self.categories[ids].tolist())
        out["id"].extend(np.where(m.count == 1, ids, -1).tolist())

    def event(self, event_id: int) -> dict[str, Any]:
        """One event's details: for a GPU activity, also the op that launched it."""
        if not 0 <= event_id < len(self.events) + (len(self.python) if self.python else 0):
            raise TimelineError(f"no event {event_id} in this window")
        if event_id >= len(self.events):
            return self._python_event(event_id)
        ev = self.events[event_id]
        out: dict[str, Any] = {"id": event_id, "name": ev.name,
                               "category": CATEGORIES[int(self.categories[event_id])],
                               "start_us": round(ev.start_us - self.t0, 3), "dur_us": ev.dur_us}
        op = ev if isinstance(ev, CpuOp) else None
        if isinstance(ev, GpuActivity):
            out.update(device=ev.device, stream=ev.stream, grid=ev.grid, block=ev.block,
                       registers=ev.registers, shared_mem=ev.shared_mem, bytes=ev.bytes)
            op = self._by_external.get(ev.external_id) if ev.external_id is not None else None
            out["op"] = op.name if op else ev.op
        elif isinstance(ev, RuntimeCall):
            out["tid"] = ev.tid
            op = self._by_external.get(ev.external_id) if ev.external_id is not None else None
            out["op"] = op.name if op else None
        if op is not None:
            out.update(tid=op.tid, op=op.name, input_shapes=op.input_shapes,
                       input_types=op.input_types, flops=op.flops, stack=op.stack)
        return out


    def _python_event(self, event_id: int) -> dict[str, Any]:
        assert self.python is not None
        j = event_id - len(self.events)
        py = self.python
        return {"id": event_id, "name": py.name[j], "category": "python",
                "start_us": round(py.start[j] - self.t0, 3), "dur_us": py.dur[j],
                "tid": py.tid[j]}


def iteration_marks(report: dict[str, Any], t0: float) -> list[dict[str, Any]]:
    """The report's iterations (µs from the window start) with each one's bottleneck shares."""
    items = (report.get("iterations") or {}).get("items") or []
    bn = report.get("bottleneck") or {}
    per = bn.get("items") or []
    marks = []
    for i, it in enumerate(items):
        start, wall = it.get("start_us"), it.get("wall_ms")
        if start is None or wall is None:
            continue
        shares = per[i] if i < len(per) and per[i].get("step") == it.get("step") else None
        ms = {k: v for k, v in (shares or {}).items()
              if k != "step" and isinstance(v, (int, float))}
        marks.append({"step": it.get("step"), "start_us": round(start - t0, 3),
                      "end_us": round(start - t0 + 1000.0 * wall, 3),
                      "bound": max(ms, key=ms.__getitem__) if ms else None, "bottleneck_ms": ms})
    return marks
