"""Time intervals: merged unions, intersection, difference, and fast overlap queries.

Shared by the report (busy time, idle attribution) and the distributed analysis (overlap of
communication with compute). Intervals are (start, end) tuples in microseconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from . import columns

Intervals = list[tuple[float, float]]
_START, _DUR = attrgetter("start_us"), attrgetter("dur_us")


def merge(intervals: Iterable[tuple[float, float]]) -> Intervals:
    out: Intervals = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two merged interval lists (merged)."""
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` minus ``b`` (both merged)."""
    if not b:  # the loop below would keep every non-empty interval of a
        return [iv for iv in a if iv[0] < iv[1]]
    if a and len(a) + len(b) >= _NUMPY_MIN:
        cut = _subtract_columns(a, b)
        if cut is not None:
            return cut
    out: Intervals = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _subtract_columns(a: Intervals, b: Intervals) -> Intervals | None:
    """:func:`subtract` in numpy, for sorted, disjoint ``a`` and ``b`` (else None): what is
    left of each interval of ``a`` is its overlap with the gaps of ``b``; each piece's ends
    are picked, as the loop picks them (no arithmetic), so the floats are the same."""
    a_arr, b_arr = np.array(a, np.float64), np.array(b, np.float64)
    s, e, bs, be = a_arr[:, 0], a_arr[:, 1], b_arr[:, 0], b_arr[:, 1]
    if not ((s[1:] >= e[:-1]).all() and (bs[1:] >= be[:-1]).all() and (be >= bs).all()
            and (e >= s).all()):
        return None
    gap_s, gap_e = np.r_[-np.inf, be], np.r_[bs, np.inf]  # the gaps of b, ascending
    lo = np.searchsorted(gap_e, s, "right")  # the first gap ending after the interval starts
    counts = np.maximum(np.searchsorted(gap_s, e, "left") - lo, 0)
    owner = np.repeat(np.arange(len(s)), counts)
    first = np.cumsum(counts) - counts
    gap = np.repeat(lo - first, counts) + np.arange(len(owner))
    ps, pe = s[owner], e[owner]
    ps = np.where(gap_s[gap] > ps, gap_s[gap], ps)  # max(cur, b's end), as the loop
    pe = np.where(gap_e[gap] < pe, gap_e[gap], pe)
    keep = pe > ps
    return list(zip(ps[keep].tolist(), pe[keep].tolist(), strict=True))


def length(iv: Intervals, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    if lo == float("-inf") and hi == float("inf"):  # the common case, without the clipping
        return sum(max(e - s, 0.0) for s, e in iv)
    return sum(max(min(e, hi) - max(s, lo), 0.0) for s, e in iv)


def segment_sums(values: np.ndarray, segment: np.ndarray, n: int) -> np.ndarray:
    """Per segment (``segment`` ascending, in 0..n-1), the sum of its values added left to
    right from 0.0: the floats a Python ``total += v`` loop per segment gives (numpy's own
    reductions add pairwise, so they may differ in the last digit). One vectorized addition
    per position within a segment, so it suits many short segments."""
    out = np.zeros(n)
    if not len(values):
        return out
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
    pos = np.arange(len(values)) - np.repeat(starts, np.diff(np.r_[starts, len(values)]))
    order = np.argsort(pos, kind="stable")
    bounds = np.searchsorted(pos[order], np.arange(int(pos.max()) + 2))
    for d in range(len(bounds) - 1):
        at = order[bounds[d]:bounds[d + 1]]  # each segment's d-th value: no segment twice
        out[segment[at]] += values[at]
    return out


_NUMPY_MIN = 256  # below this many intervals the plain merge is faster than numpy's


class Coverage:
    """Merged intervals with prefix sums: overlap with any [a, b) in O(log n)."""

    def __init__(self, intervals: list[tuple[float, float]]) -> None:
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if len(intervals) < _NUMPY_MIN:
            self.iv = merge(intervals)
            self.starts = [s for s, _ in self.iv]
            self.prefix = [0.0]
            for s, e in self.iv:
                self.prefix.append(self.prefix[-1] + (e - s))
            return
        flat = np.fromiter(chain.from_iterable(intervals), np.float64, 2 * len(intervals))
        self._from_arrays(flat[0::2], flat[1::2])

    @classmethod
    def of_columns(cls, starts: np.ndarray, ends: np.ndarray) -> Coverage:
        """``Coverage(list(zip(starts, ends)))`` without the tuples: the same small-input path
        below ``_NUMPY_MIN`` intervals, the same arrays above it."""
        if len(starts) < _NUMPY_MIN:
            return cls(list(zip(starts.tolist(), ends.tolist(), strict=True)))
        return cls.of_arrays(starts, ends)

    @classmethod
    def of_spans(cls, items: Sequence[Any]) -> Coverage:
        """The union of model events' [start_us, start_us + dur_us) (GpuActivity, CpuOp, ...)."""
        return cls.of_arrays(columns.floats(items, "start_us"), columns.ends(items))

    @classmethod
    def of_arrays(cls, starts: np.ndarray, ends: np.ndarray) -> Coverage:
        cov = cls.__new__(cls)
        cov._from_arrays(np.asarray(starts, np.float64), np.asarray(ends, np.float64))
        return cov

    def _from_arrays(self, starts: np.ndarray, ends: np.ndarray) -> None:
        # The same union as merge(): within a run of overlapping intervals the running maximum
        # of the ends is the run's end; a run starts where a start passes the maximum so far.
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        reach = np.maximum.accumulate(ends) if len(ends) else ends
        first = np.ones(len(starts), dtype=bool)
        first[1:] = starts[1:] > reach[:-1]
        at = np.flatnonzero(first)
        run_starts = starts[at]
        run_ends = reach[np.append(at[1:] - 1, len(starts) - 1)] if len(at) else reach[:0]
        self.starts = run_starts.tolist()
        self.iv = list(zip(self.starts, run_ends.tolist(), strict=True))
        # cumsum adds left to right, as the loop above does: the same prefix sums
        prefix = np.concatenate(([0.0], np.cumsum(run_ends - run_starts)))
        self.prefix = prefix.tolist()
        self._arrays = (run_starts, run_ends, prefix)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, prefix sums) of the merged intervals as numpy columns (made once)."""
        if self._arrays is None:
            self._arrays = (np.array(self.starts, np.float64),
                            np.array([e for _, e in self.iv], np.float64),
                            np.array(self.prefix, np.float64))
        return self._arrays

    def overlaps(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """:meth:`overlap` of every [a[i], b[i]) at once, with the same arithmetic."""
        if not self.iv:
            return np.zeros(len(a))
        starts, ends, prefix = self.arrays()
        lo = np.maximum(np.searchsorted(starts, a, "right") - 1, 0)
        hi = np.maximum(np.searchsorted(starts, b, "left"), lo)
        total = prefix[hi] - prefix[lo]
        s, e = starts[lo], ends[lo]
        total = np.where(a > s, total - np.where(a < e, a - s, e - s), total)
        last = np.maximum(hi - 1, 0)
        s, e = starts[last], ends[last]
        total = np.where(e > b, total - np.where(b > s, e - b, e - s), total)
        return np.where((b > a) & (hi > lo) & (total > 0.0), total, 0.0)

    def clip_columns(self, a: np.ndarray, b: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`clip` of every [a[i], b[i]) at once: (query index, piece start, piece end),
        the pieces of each query in order, queries in order."""
        if not self.iv:
            return np.empty(0, np.int64), np.empty(0), np.empty(0)
        starts, ends, _ = self.arrays()
        lo = np.maximum(np.searchsorted(starts, a, "right") - 1, 0)
        hi = np.maximum(np.searchsorted(starts, b, "left"), lo)
        counts = hi - lo
        query = np.repeat(np.arange(len(a)), counts)
        first = np.cumsum(counts) - counts  # where each query's candidates begin
        idx = np.repeat(lo - first, counts) + np.arange(len(query))
        qa, qb, s, e = a[query], b[query], starts[idx], ends[idx]
        keep = e > qa  # only a query's first candidate can end before it starts
        query, qa, qb, s, e = query[keep], qa[keep], qb[keep], s[keep], e[keep]
        return query, np.where(s > qa, s, qa), np.where(e < qb, e, qb)

    def overlap(self, a: float, b: float) -> float:
        """Covered time inside [a, b): prefix sums, then trim the two boundary intervals."""
        iv = self.iv
        if b <= a or not iv:
            return 0.0
        starts = self.starts
        lo = bisect.bisect_right(starts, a) - 1
        if lo < 0:
            lo = 0
        hi = bisect.bisect_left(starts, b, lo)
        if hi <= lo:
            return 0.0
        total = self.prefix[hi] - self.prefix[lo]
        s, e = iv[lo]
        if a > s:  # the part of the first interval before a
            total -= a - s if a < e else e - s
        s, e = iv[hi - 1]
        if e > b:  # the part of the last interval after b
            total -= e - b if b > s else e - s
        return total if total > 0.0 else 0.0

    def clip(self, a: float, b: float) -> Intervals:
        """The merged intervals inside [a, b), cut at a and b."""
        starts = self.starts
        if not starts or b <= starts[0]:
            return []
        lo = bisect.bisect_right(starts, a) - 1
        if lo < 0:
            lo = 0
        hi = bisect.bisect_left(starts, b, lo)
        if hi - lo == 1:  # the usual case: one interval
            s, e = self.iv[lo]
            return [(s if s > a else a, e if e < b else b)] if e > a else []
        return [(s if s > a else a, e if e < b else b) for s, e in self.iv[lo:hi] if e > a]

    def iv_between(self, a: float, b: float) -> Intervals:
        """The merged intervals that overlap [a, b), unclipped."""
        lo = max(bisect.bisect_right(self.starts, a) - 1, 0)
        hi = bisect.bisect_left(self.starts, b)
        return [iv for iv in self.iv[lo:hi] if iv[1] > a]

    def gap_columns(self, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`gaps` as (starts, ends) columns. The intervals are disjoint and ascending,
        so the time covered so far before interval k is max(a, end of k - 1), and only the
        first one can end before a (it is then skipped, as in the loop)."""
        i = max(bisect.bisect_right(self.starts, a) - 1, 0)
        j = max(bisect.bisect_left(self.starts, b), i)
        if j == i:
            return (np.array([a]), np.array([b])) if a < b else (np.empty(0), np.empty(0))
        starts, ends, _ = self.arrays()
        s = starts[i:j]
        cur = np.empty(j - i)
        cur[0] = a
        np.maximum(a, ends[i:j - 1], out=cur[1:])
        opens = s > cur
        gs, ge = cur[opens], s[opens]
        last = max(a, float(ends[j - 1]))
        if last < b:
            gs, ge = np.append(gs, last), np.append(ge, b)
        return gs, ge

    def gaps(self, a: float, b: float) -> list[tuple[float, float]]:
        out = []
        cur = a
        i = max(bisect.bisect_right(self.starts, a) - 1, 0)
        for s, e in self.iv[i:]:
            if s >= b:
                break
            if e <= cur:
                continue
            if s > cur:
                out.append((cur, min(s, b)))
            cur = max(cur, e)
        if cur < b:
            out.append((cur, b))
        return out
