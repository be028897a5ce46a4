"""Time intervals: merged unions, intersection, difference, and fast overlap queries.

Shared by the report (busy time, idle attribution) and the distributed analysis (overlap of
communication with compute). Intervals are (start, end) tuples in microseconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

Intervals = list[tuple[float, float]]


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


def length(iv: Intervals, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    return sum(max(min(e, hi) - max(s, lo), 0.0) for s, e in iv)


class Coverage:
    """Merged intervals with prefix sums: overlap with any [a, b) in O(log n)."""

    def __init__(self, intervals: list[tuple[float, float]]) -> None:
        self.iv = merge(intervals)
        self.starts = [s for s, _ in self.iv]
        self.prefix = [0.0]
        for s, e in self.iv:
            self.prefix.append(self.prefix[-1] + (e - s))

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

    def iv_between(self, a: float, b: float) -> Intervals:
        """The merged intervals that overlap [a, b), unclipped."""
        lo = max(bisect.bisect_right(self.starts, a) - 1, 0)
        hi = bisect.bisect_left(self.starts, b)
        return [iv for iv in self.iv[lo:hi] if iv[1] > a]

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
