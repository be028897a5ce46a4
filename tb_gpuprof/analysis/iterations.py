"""Iteration boundaries: ProfilerStep markers, a key range, optimizer steps, or the whole trace.

The order follows DLProf: explicit step markers win, then the user's key range (DLProf's
``--key_node``), then one ``Optimizer.step`` per iteration, else the whole trace is one window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..model import OPTIMIZER, STEP, Annotation, Profile
from . import columns

_TRAILING_NUMBER = re.compile(r"^(.*?)[#\s_:-]*(\d+)\s*$")


@dataclass(slots=True)
class IterationWindow:
    index: int
    step: int | None
    start_us: float
    end_us: float

    @property
    def wall_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(slots=True)
class IterationPlan:
    method: str  # profiler_step | key_range | optimizer_step | whole_trace
    key: str | None
    windows: list[IterationWindow]


def _host_ranges(profile: Profile) -> list[Annotation]:
    return [a for a in profile.annotations if not a.on_gpu]


def _trace_extent(profile: Profile) -> tuple[float, float]:
    # columns (shared with the later stages): this runs over every event of the trace
    seqs = [seq for seq in (profile.gpu, profile.cpu_ops, profile.runtime,
                            profile.annotations) if seq]
    if not seqs:
        return 0.0, 0.0
    lo = min(float(columns.floats(seq, "start_us").min()) for seq in seqs)
    hi = max(float(columns.ends(seq).max()) for seq in seqs)
    return lo, hi


def _windows_from_ranges(ranges: list[Annotation]) -> list[IterationWindow]:
    """Consecutive ranges; each iteration ends where the next begins (or at its own end)."""
    ranges = sorted(ranges, key=lambda a: a.start_us)
    out: list[IterationWindow] = []
    for i, a in enumerate(ranges):
        end = a.start_us + a.dur_us
        if i + 1 < len(ranges):
            nxt = ranges[i + 1].start_us
            # A step ends where the next starts when they touch; keep gaps between iterations out.
            end = max(end, nxt) if nxt - end < 0.05 * max(a.dur_us, 1.0) else end
        step = a.step
        if step is None:
            m = _TRAILING_NUMBER.match(a.name)
            step = int(m.group(2)) if m else None
        out.append(IterationWindow(i, step, a.start_us, end))
    return out


def _dedupe_nested(ranges: list[Annotation]) -> list[Annotation]:
    """Drop ranges that lie inside another one of the same set (nested re-entries)."""
    ranges = sorted(ranges, key=lambda a: (a.start_us, -a.dur_us))
    kept: list[Annotation] = []
    last_end = float("-inf")
    for a in ranges:
        if a.start_us >= last_end:
            kept.append(a)
            last_end = a.start_us + a.dur_us
    return kept


def _name_prefix(name: str) -> str:
    m = _TRAILING_NUMBER.match(name)
    return m.group(1) if m else name


def plan_iterations(profile: Profile, key: str | None = None) -> IterationPlan:
    host = _host_ranges(profile)
    steps = [a for a in host if a.kind == STEP]
    if not steps:
        # Some profiles mark steps only on the GPU timeline (XPlane "Steps" lines).
        steps = [a for a in profile.annotations if a.on_gpu and a.kind == STEP]
    if steps:
        return IterationPlan("profiler_step", _name_prefix(steps[0].name),
                             _windows_from_ranges(_dedupe_nested(steps)))
    if key:
        keyed = [a for a in host if a.name == key or a.name.startswith(key)]
        if not keyed:
            keyed = [a for a in host if key in a.name]
        if keyed:
            return IterationPlan("key_range", key, _windows_from_ranges(_dedupe_nested(keyed)))
    # Numbered user ranges (NVTX "iteration 17", "step_3") behave like step markers.
    numbered: dict[str, list[Annotation]] = {}
    for a in host:
        if a.step is not None and a.kind != OPTIMIZER:
            numbered.setdefault(_name_prefix(a.name), []).append(a)
    if numbered:
        prefix, ranges = max(numbered.items(), key=lambda kv: len(kv[1]))
        if len(ranges) >= 2:
            return IterationPlan("key_range", prefix, _windows_from_ranges(_dedupe_nested(ranges)))
    lo, hi = _trace_extent(profile)
    opt = _dedupe_nested([a for a in host if a.kind == OPTIMIZER])
    if len(opt) >= 2:
        # Iteration i runs from the end of optimizer step i-1 to the end of optimizer step i.
        windows = []
        prev_end = lo
        for i, a in enumerate(opt):
            end = a.start_us + a.dur_us
            windows.append(IterationWindow(i, None, prev_end, end))
            prev_end = end
        return IterationPlan("optimizer_step", _name_prefix(opt[0].name), windows)
    return IterationPlan("whole_trace", None, [IterationWindow(0, None, lo, hi)])


def select_windows(plan: IterationPlan, iter_start: int | None,
                   iter_stop: int | None) -> list[IterationWindow]:
    """[iter_start, iter_stop) by step number when the markers carry numbers, else by index."""
    if iter_start is None and iter_stop is None:
        return plan.windows
    numbered = all(w.step is not None for w in plan.windows)
    lo = iter_start if iter_start is not None else -1
    hi = iter_stop if iter_stop is not None else float("inf")
    return [w for w in plan.windows
            if lo <= (w.step if numbered and w.step is not None else w.index) < hi]
