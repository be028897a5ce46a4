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
    """:func:`subtract` in numpy, for sorted, disjoint ``a`` and ``b`` (else None)."""
    a_arr, b_arr = np.array(a, np.float64), np.array(b, np.float64)
    cut = subtract_columns(a_arr[:, 0], a_arr[:, 1], b_arr[:, 0], b_arr[:, 1])
    if cut is None:
        return None
    return list(zip(cut[0].tolist(), cut[1].tolist(), strict=True))


def subtract_columns(s: np.ndarray, e: np.ndarray, bs: np.ndarray, be: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`subtract` of (starts, ends) columns, for sorted, disjoint [s, e) and [bs, be)
    (else None): what is left of each interval of ``a`` is its overlap with the gaps of
    ``b``; each piece's ends are picked, as the loop picks them (no arithmetic), so the
    floats are the same."""
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
    return ps[keep], pe[keep]


def length(iv: Intervals, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    if lo == float("-inf") and hi == float("inf"):  # the common case, without the clipping
        return sum(max(e - s, 0.0) for s, e in iv)
    return sum(max(min(e, hi) - max(s, lo), 0.0) for s, e in iv)


def segment_sums(values: np.ndarray, segment: np.ndarray, n: int) -> np.ndarray:
    """Per segment (``segment`` in 0..n-1), the sum of its values added left to right from
    0.0: the floats a Python ``total += v`` loop per segment gives (numpy's own reductions
    add pairwise, so they may differ in the last digit). ``np.add.at`` adds unbuffered, one
    value after the other in index order, so each segment's sum is that loop's."""
    out = np.zeros(n)
    np.add.at(out, segment, values)
    return out


_NUMPY_MIN = 256  # below this many intervals the plain merge is faster than numpy's


def merged_runs(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The merged runs' (starts, ends) of the non-empty [start, end), as merge() makes them.

    Within a run of overlapping intervals the running maximum of the ends is the run's end; a
    run starts where a start passes the maximum so far. (No copy when nothing is empty, and
    each column dropped once used: at 2 GB the host's spans are 3 million, 24 MB a column.)"""
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    del keep
    order = np.argsort(starts, kind="stable")
    ends = ends[order]
    starts = starts[order]
    del order
    if not len(ends):
        return starts, ends
    reach = np.maximum.accumulate(ends, out=ends)  # ends is this function's copy
    first = np.empty(len(starts), dtype=bool)
    first[0] = True
    np.greater(starts[1:], reach[:-1], out=first[1:])
    at = np.flatnonzero(first)
    del first
    run_starts = starts[at]
    at[:-1] = at[1:] - 1
    at[-1] = len(starts) - 1
    return run_starts, reach[at]


class Coverage:
    """Merged intervals with prefix sums: overlap with any [a, b) in O(log n).

    Below ``_NUMPY_MIN`` intervals it keeps Python lists (``iv``, ``starts``, ``prefix``: the
    scalar queries are fastest on those); above, only its numpy columns (a 2 GB trace's
    coverages hold millions of intervals: as lists of tuples they cost about 150 bytes an
    interval, as columns 24). The scalar queries then read the columns, converting each value
    they use back to a Python float, so the arithmetic and the results are the same.
    """

    def __init__(self, intervals: list[tuple[float, float]]) -> None:
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._iv: Intervals | None = None
        self._starts: list[float] | None = None
        self._prefix: list[float] | None = None
        if len(intervals) < _NUMPY_MIN:
            self._iv = merge(intervals)
            self._starts = [s for s, _ in self._iv]
            prefix = [0.0]
            for s, e in self._iv:
                prefix.append(prefix[-1] + (e - s))
            self._prefix = prefix
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
        cov._iv = cov._starts = cov._prefix = None
        cov._from_arrays(np.asarray(starts, np.float64), np.asarray(ends, np.float64))
        return cov

    def _from_arrays(self, starts: np.ndarray, ends: np.ndarray) -> None:
        run_starts, run_ends = merged_runs(starts, ends)
        # cumsum adds left to right, as the loop above does: the same prefix sums
        prefix = np.concatenate(([0.0], np.cumsum(run_ends - run_starts)))
        self._arrays = (run_starts, run_ends, prefix)

    @classmethod
    def union(cls, spans: Sequence[tuple[np.ndarray, np.ndarray]]) -> Coverage:
        """``of_arrays`` of the spans' columns concatenated, merging each part first: the
        same runs (a run's start is its earliest start, the first of ties in the parts'
        order; its end the largest end), without the copies of the whole (at 2 GB the host's
        spans are 3.3 million: their union was the report's peak)."""
        runs = [merged_runs(np.asarray(s, np.float64), np.asarray(e, np.float64))
                for s, e in spans]
        return cls.of_arrays(np.concatenate([s for s, _ in runs]),
                             np.concatenate([e for _, e in runs]))

    def __len__(self) -> int:
        """The number of merged intervals."""
        return len(self._iv) if self._iv is not None else len(self.arrays()[0])

    def total(self) -> float:
        """The covered time: ``sum(e - s for s, e in iv)`` added left to right."""
        return self._prefix[-1] if self._prefix is not None else float(self.arrays()[2][-1])

    @property
    def iv(self) -> Intervals:
        """The merged intervals as (start, end) tuples (built afresh for a columnar one)."""
        if self._iv is not None:
            return self._iv
        starts, ends, _ = self.arrays()
        return list(zip(starts.tolist(), ends.tolist(), strict=True))

    @property
    def starts(self) -> list[float]:
        return self._starts if self._starts is not None else self.arrays()[0].tolist()

    @property
    def prefix(self) -> list[float]:
        return self._prefix if self._prefix is not None else self.arrays()[2].tolist()

    def _slice(self, lo: int, hi: int) -> Intervals:
        """``iv[lo:hi]``, from the columns when there are no lists."""
        if self._iv is not None:
            return self._iv[lo:hi]
        starts, ends, _ = self.arrays()
        return list(zip(starts[lo:hi].tolist(), ends[lo:hi].tolist(), strict=True))

    def _at(self, i: int) -> tuple[float, float]:
        if self._iv is not None:
            return self._iv[i]
        starts, ends, _ = self.arrays()
        return float(starts[i]), float(ends[i])

    def _bisect(self, x: float, right: bool, lo: int = 0) -> int:
        """bisect_right / bisect_left of ``x`` in the starts (from ``lo``), on either form."""
        if self._starts is not None:
            find = bisect.bisect_right if right else bisect.bisect_left
            return find(self._starts, x, lo)
        at = int(np.searchsorted(self.arrays()[0], x, "right" if right else "left"))
        return at if at > lo else lo

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, prefix sums) of the merged intervals as numpy columns (made once)."""
        if self._arrays is None:
            iv = self._iv or []
            self._arrays = (np.array([s for s, _ in iv], np.float64),
                            np.array([e for _, e in iv], np.float64),
                            np.array(self._prefix or [0.0], np.float64))
        return self._arrays

    def overlaps(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """:meth:`overlap` of every [a[i], b[i]) at once, with the same arithmetic."""
        if not len(self):
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
        if not len(self):
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
        if b <= a or not len(self):
            return 0.0
        lo = self._bisect(a, True) - 1
        if lo < 0:
            lo = 0
        hi = self._bisect(b, False, lo)
        if hi <= lo:
            return 0.0
        if self._prefix is not None:
            total = self._prefix[hi] - self._prefix[lo]
        else:
            prefix = self.arrays()[2]
            total = float(prefix[hi]) - float(prefix[lo])
        s, e = self._at(lo)
        if a > s:  # the part of the first interval before a
            total -= a - s if a < e else e - s
        s, e = self._at(hi - 1)
        if e > b:  # the part of the last interval after b
            total -= e - b if b > s else e - s
        return total if total > 0.0 else 0.0

    def clip(self, a: float, b: float) -> Intervals:
        """The merged intervals inside [a, b), cut at a and b."""
        if not len(self) or b <= self._first_start():
            return []
        lo = self._bisect(a, True) - 1
        if lo < 0:
            lo = 0
        hi = self._bisect(b, False, lo)
        if hi - lo == 1:  # the usual case: one interval
            s, e = self._at(lo)
            return [(s if s > a else a, e if e < b else b)] if e > a else []
        if self._iv is not None:
            return [(s if s > a else a, e if e < b else b) for s, e in self._iv[lo:hi] if e > a]
        starts, ends, _ = self.arrays()  # the same picks, in numpy
        ps, pe = starts[lo:hi], ends[lo:hi]
        ps, pe = ps[pe > a], pe[pe > a]
        return list(zip(np.where(ps > a, ps, a).tolist(), np.where(pe < b, pe, b).tolist(),
                        strict=True))

    def _first_start(self) -> float:
        return self._starts[0] if self._starts is not None else float(self.arrays()[0][0])

    def gap_columns(self, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`gaps` as (starts, ends) columns. The intervals are disjoint and ascending,
        so the time covered so far before interval k is max(a, end of k - 1), and only the
        first one can end before a (it is then skipped, as in the loop)."""
        i = max(self._bisect(a, True) - 1, 0)
        j = max(self._bisect(b, False), i)
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
        i = max(self._bisect(a, True) - 1, 0)
        # intervals from the first starting at or after b on end the loop: never read them
        for s, e in self._slice(i, max(self._bisect(b, False), i)):
            if e <= cur:
                continue
            if s > cur:
                out.append((cur, min(s, b)))
            cur = max(cur, e)
        if cur < b:
            out.append((cur, b))
        return out
