"""Columns of a profile's event lists (one attribute of every event), extracted once per report.

Reading one attribute of every event costs 50-80 ns an event (the objects lie scattered in
memory): 10-13 ms per column of a 164k-op trace, and :func:`build_report`'s stages need the
same columns (ops' and runtime calls' start, duration, thread, name) in iteration planning,
linking, the bottleneck and idle attribution. Inside :func:`column_scope` each is read once;
outside it every call reads it afresh, so a stage used on its own behaves the same.

The cache holds the list it was read from (compared by identity and length: a list changed
in between is read again) and lives in a context variable, so threads and nested reports do
not share one. Columns are read-only numpy arrays (names: tuples). The distinct values of a
column (:func:`distinct`: a trace has a few hundred op names) outlive :func:`forget`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from operator import attrgetter
from typing import Any

import numpy as np

# (id of the list, what) -> (the list, its length then, the column)
_SCOPE: ContextVar[dict[tuple[int, str], tuple[Sequence[Any], int, Any]] | None] = ContextVar(
    "tb_gpuprof_columns", default=None)
_DISTINCT = "distinct:"


@contextmanager
def column_scope() -> Iterator[None]:
    """Columns read inside are kept until the scope ends."""
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


def forget(items: Sequence[Any]) -> None:
    """Drop the columns of ``items`` (their last reader is done: at 2 GB the ops' columns
    alone are about 110 MB); their distinct values stay."""
    cache = _SCOPE.get()
    if cache is not None:
        for key in [k for k in cache if k[0] == id(items) and not k[1].startswith(_DISTINCT)]:
            del cache[key]


def _cached(items: Sequence[Any], attr: str, read: Any) -> Any:
    cache = _SCOPE.get()
    if cache is None:
        return read()
    key = (id(items), attr)
    hit = cache.get(key)
    if hit is not None and hit[0] is items and hit[1] == len(items):
        return hit[2]
    value = read()
    cache[key] = (items, len(items), value)
    return value


# The float columns the stages read, each read by its own list comprehension: there the
# attribute load specialises to the event struct's slot, about 1.3x as fast a read as
# map(attrgetter(...)) (Python 3.11, a 164k-op trace).
_READERS: dict[str, Callable[[Sequence[Any]], list[Any]]] = {
    "start_us": lambda items: [e.start_us for e in items],
    "dur_us": lambda items: [e.dur_us for e in items],
}


def _read(items: Sequence[Any], attr: str) -> list[Any]:
    reader = _READERS.get(attr)
    return reader(items) if reader is not None else list(map(attrgetter(attr), items))


def floats(items: Sequence[Any], attr: str) -> np.ndarray:
    """``attr`` of every item as float64 (start_us, dur_us)."""
    def read() -> np.ndarray:
        col = np.fromiter(_read(items, attr), np.float64, len(items))
        col.flags.writeable = False
        return col
    return _cached(items, attr, read)


def values(items: Sequence[Any], attr: str) -> tuple[Any, ...]:
    """``attr`` of every item as a tuple of the objects themselves (name, correlation)."""
    # straight into the tuple: read through a list it would hold both at once (at 2 GB,
    # 20 MB more at the report's peak)
    return _cached(items, "obj:" + attr, lambda: tuple(map(attrgetter(attr), items)))


def distinct(items: Sequence[Any], attr: str) -> tuple[Any, ...]:
    """The distinct values of ``attr`` (hashable: names), in order of first appearance."""
    return _cached(items, _DISTINCT + attr, lambda: tuple(dict.fromkeys(values(items, attr))))


def present(items: Sequence[Any], attr: str) -> np.ndarray:
    """Whether ``attr`` of each item is not None (correlation), as a bool column."""
    def read() -> np.ndarray:
        col = np.fromiter([v is not None for v in values(items, attr)], bool, len(items))
        col.flags.writeable = False
        return col
    return _cached(items, "present:" + attr, read)


def ends(items: Sequence[Any]) -> np.ndarray:
    """start_us + dur_us of every item."""
    def read() -> np.ndarray:
        col = floats(items, "start_us") + floats(items, "dur_us")
        col.flags.writeable = False
        return col
    return _cached(items, "end", read)
