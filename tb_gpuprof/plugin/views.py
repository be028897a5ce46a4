"""Pure functions behind /kernels and /compare: filtering, sorting, paging, run diffs."""

from __future__ import annotations

from typing import Any

MAX_KERNEL_PAGE = 1000
TOP_KERNELS = 10
COMPARE_MAX_KERNELS = 500
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
    # None sorts last whatever the order; mixed types fall back to their text.
    def key(kernel: dict[str, Any]) -> tuple[int, Any]:
        value = kernel.get(field)
        if value is None:
            return (1, 0)
        if isinstance(value, bool):
            return (0, int(value))
        if isinstance(value, (int, float, str)):
            return (0, value)
        return (0, str(value))

    return key


def _matches_text(kernel: dict[str, Any], needle: str) -> bool:
    hay = [kernel.get("name"), kernel.get("demangled"), kernel.get("source"),
           *(kernel.get("ops") or [])]
    return any(isinstance(h, str) and needle in h.lower() for h in hay)


def filter_kernels(kernels: list[dict[str, Any]], params: dict[str, str | None]) -> dict[str, Any]:
    """The /kernels answer for one report's kernel list and the request's parameters."""
    sort = params.get("sort") or "total_us"
    order = (params.get("order") or "desc").lower()
    if order not in ("asc", "desc"):
        raise BadParam(f"order must be asc or desc, got {order!r}")
    known_fields = set().union(*(k.keys() for k in kernels[:50])) if kernels else {"total_us"}
    if sort not in known_fields:
        raise BadParam(f"sort must be a kernel field ({', '.join(sorted(known_fields))}), "
                       f"got {sort!r}")
    offset = parse_int(params.get("offset"), "offset", 0)
    limit = parse_int(params.get("limit"), "limit", 50, lo=1, hi=MAX_KERNEL_PAGE)
    tc = parse_bool(params.get("tc"), "tc")
    q = (params.get("q") or "").strip().lower()
    category = params.get("category") or None
    precision = params.get("precision") or None

    selected = [
        k for k in kernels
        if (tc is None or bool(k.get("uses_tensor_cores")) == tc)
        and (category is None or k.get("category") == category)
        and (precision is None or k.get("precision") == precision)
        and (not q or _matches_text(k, q))
    ]
    key = _sort_key(sort)
    if order == "desc":
        # Reverse on the value only, keeping None last.
        present = [k for k in selected if k.get(sort) is not None]
        missing = [k for k in selected if k.get(sort) is None]
        selected = sorted(present, key=key, reverse=True) + missing
    else:
        selected = sorted(selected, key=key)
    assert offset is not None and limit is not None
    return {"total": len(selected), "offset": offset, "limit": limit,
            "kernels": selected[offset:offset + limit]}


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
