"""Pure functions behind /kernels and /compare: filtering, sorting, paging, run diffs."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

MAX_KERNEL_PAGE = 1000
TOP_KERNELS = 10
COMPARE_MAX_KERNELS = 500
SELECTION_CACHE_SIZE = 32
CHANGED_FRACTION = 0.10  # a kernel whose total time moved by more than this is "changed"


class BadParam(ValueError):
    """A request parameter that cannot be honoured (HTTP 400)."""


def parse_int(value: str | None, name: str, default: int | None, *, lo: int = 0,
              hi: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise BadParam(f"{name} must be an integer, got {value!r}") from None
    if n < lo or (hi is not None and n > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise BadParam(f"{name} must be {bound}, got {n}")
    return n


def parse_bool(value: str | None, name: str) -> bool | None:
    if value is None or value == "":
        return None
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise BadParam(f"{name} must be true or false, got {value!r}")


def _sort_key(field: str):
    # Numbers before text before anything else (lists: by their text), so a field holding
    # mixed types still sorts instead of raising. None values are set aside by the caller.
    def key(kernel: dict[str, Any]) -> tuple[int, Any]:
        value = kernel.get(field)
        if isinstance(value, (int, float)):
            return (0, float(value))
        if isinstance(value, str):
            return (1, value.lower())
        return (2, json.dumps(value))

    return key


class KernelIndex:
    """One report's kernel list prepared for repeated /kernels queries.

    Lower-cased search text per kernel and each requested sort order are computed once, so a
    page costs a scan of precomputed data rather than a sort plus string work per kernel.
    """

    def __init__(self, kernels: list[dict[str, Any]]) -> None:
        self.kernels = kernels
        self.search_text = [
            "\0".join(h.lower() for h in (k.get("name"), k.get("demangled"), k.get("source"),
                                           *(k.get("ops") or [])) if isinstance(h, str))
            for k in kernels
        ]
        self.fields = set().union(*(k.keys() for k in kernels)) if kernels else {"total_us"}
        self._orders: dict[tuple[str, str], list[int]] = {}
        # Recent filter results: paging through one query re-uses its selection.
        self._selections: OrderedDict[tuple, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def select(self, sort: str, order: str, tc: bool | None, category: str | None,
               precision: str | None, q: str) -> list[int]:
        key = (sort, order, tc, category, precision, q)
        with self._lock:
            hit = self._selections.get(key)
            if hit is not None:
                self._selections.move_to_end(key)
                return hit
        ks, text = self.kernels, self.search_text
        selected = [
            i for i in self.order(sort, order)
            if (tc is None or bool(ks[i].get("uses_tensor_cores")) == tc)
            and (category is None or ks[i].get("category") == category)
            and (precision is None or ks[i].get("precision") == precision)
            and (not q or q in text[i])
        ]
        with self._lock:
            self._selections[key] = selected
            while len(self._selections) > SELECTION_CACHE_SIZE:
                self._selections.popitem(last=False)
        return selected

    def order(self, field: str, direction: str) -> list[int]:
        key = (field, direction)
        cached = self._orders.get(key)
        if cached is None:
            ks = self.kernels
            sort_key = _sort_key(field)
            present = [i for i in range(len(ks)) if ks[i].get(field) is not None]
            missing = [i for i in range(len(ks)) if ks[i].get(field) is None]
            # None sorts last in both directions; ties keep the stored (time) order.
            present.sort(key=lambda i: sort_key(ks[i]), reverse=direction == "desc")
            cached = self._orders[key] = present + missing
        return cached


def filter_kernels(index: KernelIndex, params: dict[str, str | None]) -> dict[str, Any]:
    """The /kernels answer for one report's kernels and the request's parameters."""
    sort = params.get("sort") or "total_us"
    order = (params.get("order") or "desc").lower()
    if order not in ("asc", "desc"):
        raise BadParam(f"order must be asc or desc, got {order!r}")
    if sort not in index.fields:
        raise BadParam(f"sort must be a kernel field ({', '.join(sorted(index.fields))}), "
                       f"got {sort!r}")
    offset = parse_int(params.get("offset"), "offset", 0)
    limit = parse_int(params.get("limit"), "limit", 50, lo=1, hi=MAX_KERNEL_PAGE)
    assert offset is not None and limit is not None
    tc = parse_bool(params.get("tc"), "tc")
    q = (params.get("q") or "").strip().lower()
    category = params.get("category") or None
    precision = params.get("precision") or None

    selected = index.select(sort, order, tc, category, precision, q)
    return {"total": len(selected), "offset": offset, "limit": limit,
            "kernels": [index.kernels[i] for i in selected[offset:offset + limit]]}


def _kernel_entry(kernel: dict[str, Any]) -> dict[str, Any]:
    return {"total_us": kernel.get("total_us"), "pct": kernel.get("pct"),
            "count": kernel.get("count")}


def _status(first: dict[str, Any] | None, others: list[dict[str, Any] | None]) -> str:
    if first is None:
        return "appeared"
    if others and all(o is None for o in others):
        return "vanished"
    base = first.get("total_us") or 0.0
    for other in others:
        if other is None:
            return "changed"
        moved = abs((other.get("total_us") or 0.0) - base)
        if moved > CHANGED_FRACTION * max(base, 1e-9):
            return "changed"
    return "same"


def compare_reports(entries: list[tuple[str, int, dict[str, Any]]]) -> dict[str, Any]:
    """Side-by-side view of several runs' reports; ``entries`` = (run, step, report).

    Each kernel's status compares the first run with the others: ``appeared`` (not in the
    first run), ``vanished`` (only in the first run), ``changed`` (total time moved by more
    than 10% in some run, or missing from some), ``same``.
    """
    runs_out = []
    by_run: dict[str, dict[str, dict[str, Any]]] = {}
    for run, step, report in entries:
        kernels = report.get("kernels") or []
        iterations = report.get("iterations") or {}
        runs_out.append({
            "run": run, "step": step,
            "iterations": {k: iterations.get(k) for k in ("mean_ms", "median_ms", "count")},
            "gpu_time_us": report.get("gpu_time_us"),
            "tensor_cores": report.get("tensor_cores"),
            "top_kernels": kernels[:TOP_KERNELS],
        })
        by_run[run] = {k["name"]: k for k in kernels if isinstance(k.get("name"), str)}

    names = {n for kernels in by_run.values() for n in kernels}

    def weight(name: str) -> float:
        return max((by_run[r][name].get("total_us") or 0.0) for r in by_run if name in by_run[r])

    ordered = sorted(names, key=lambda n: (-weight(n), n))
    run_names = [run for run, _, _ in entries]
    diff = []
    for name in ordered[:COMPARE_MAX_KERNELS]:
        per_run = {r: (_kernel_entry(by_run[r][name]) if name in by_run[r] else None)
                   for r in run_names}
        first = by_run[run_names[0]].get(name)
        others = [by_run[r].get(name) for r in run_names[1:]]
        diff.append({"name": name, "per_run": per_run, "status": _status(first, others)})
    return {"runs": runs_out, "kernels": diff, "kernels_total": len(names)}
