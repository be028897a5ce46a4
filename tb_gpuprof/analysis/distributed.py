"""Distributed training: communication vs compute in one rank's window, and across ranks.

Framework-free. One rank: :func:`communication_section` measures collective communication
(NCCL kernels on the GPU; on CPU-only traces the host ranges gloo/NCCL/c10d record), the
compute it overlaps with, and what is left exposed per iteration; it becomes the report's
``distributed`` section (docs/report-schema.md). All ranks of a window:
:func:`cross_rank_summary` compares their reports: per-rank iteration times, the straggler,
load imbalance and the distributed recommendations (docs/recommendations.md).
"""

from __future__ import annotations

import statistics
from typing import Any

from ..model import KERNEL, Profile
from . import columns
from .classify import classify_kernel
from .intervals import Intervals, intersect, length, merge, subtract
from .rules import recommend_across_ranks
from .rules.distributed import STRAGGLER_MIN_MS, STRAGGLER_MIN_PCT

# Host-side names of collectives: the ranges gloo/NCCL/MPI/UCC backends record per collective
# (``gloo:all_reduce`` on gloo's worker threads) and the c10d operators that launch them.
COMM_RANGE_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:")
COMM_OP_PREFIXES = ("c10d::", "record_param_comms", "c10d_functional::", "_c10d_functional::")
NON_COMPUTE_CATEGORIES = {"communication", "memcpy", "memset"}
TOP_COLLECTIVES = 10



# -- one rank -------------------------------------------------------------------------------

def is_communication_name(name: str) -> bool:
    """A host range or operator of a collective (CPU traces: gloo has no GPU kernels)."""
    return name.startswith(COMM_RANGE_PREFIXES) or name.startswith(COMM_OP_PREFIXES)


def _gpu_intervals(profile: Profile) -> tuple[Intervals, Intervals, dict[str, list[float]]]:
    """(communication, compute-overlapping-communication, per-collective durations) on GPUs.

    Overlap is counted per device: a collective on GPU 0 is hidden only by compute on GPU 0.
    """
    comm_by_dev: dict[int, list[tuple[float, float]]] = {}
    compute_by_dev: dict[int, list[tuple[float, float]]] = {}
    names: dict[str, list[float]] = {}
    for a in profile.gpu:
        if a.kind != KERNEL:
            continue
        iv = (a.start_us, a.start_us + a.dur_us)
        if classify_kernel(a.name, a.kind).category == "communication":
            comm_by_dev.setdefault(a.device, []).append(iv)
            names.setdefault(a.name, []).append(a.dur_us)
        else:
            compute_by_dev.setdefault(a.device, []).append(iv)
    comm: list[tuple[float, float]] = []
    overlap: list[tuple[float, float]] = []
    for dev, ivs in comm_by_dev.items():
        c = merge(ivs)
        comm.extend(c)
        overlap.extend(intersect(c, merge(compute_by_dev.get(dev, []))))
    return merge(comm), merge(overlap), names


def _gpu_compute(profile: Profile) -> Intervals:
    return merge((a.start_us, a.start_us + a.dur_us) for a in profile.gpu if a.kind == KERNEL
                 and classify_kernel(a.name, a.kind).category not in NON_COMPUTE_CATEGORIES)


def _cpu_intervals(profile: Profile) -> tuple[Intervals, Intervals, dict[str, list[float]]]:
    """(communication ranges, compute, per-collective durations) from host events.

    Compute is the union of framework operators per thread minus the communication operators
    of the same thread, so a collective called inside another operator does not count as
    compute overlapping itself.
    """
    comm: list[tuple[float, float]] = []
    names: dict[str, list[float]] = {}
    ops_by_tid: dict[int, list[tuple[float, float]]] = {}
    comm_by_tid: dict[int, list[tuple[float, float]]] = {}
    for ann in profile.annotations:
        if not ann.on_gpu and ann.name.startswith(COMM_RANGE_PREFIXES):
            comm.append((ann.start_us, ann.start_us + ann.dur_us))
            names.setdefault(ann.name, []).append(ann.dur_us)
    for op in profile.cpu_ops:
        iv = (op.start_us, op.start_us + op.dur_us)
        if is_communication_name(op.name):
            comm.append(iv)
            comm_by_tid.setdefault(op.tid, []).append(iv)
            if op.name.startswith(COMM_RANGE_PREFIXES):
                names.setdefault(op.name, []).append(op.dur_us)
        else:
            ops_by_tid.setdefault(op.tid, []).append(iv)
    compute: list[tuple[float, float]] = []
    for tid, ivs in ops_by_tid.items():
        compute.extend(subtract(merge(ivs), merge(comm_by_tid.get(tid, []))))
    if not names:  # no backend ranges recorded: name the launching operators
        for op in profile.cpu_ops:
            if is_communication_name(op.name):
                names.setdefault(op.name, []).append(op.dur_us)
    return merge(comm), merge(compute), names


def _has_communication(profile: Profile) -> bool:
    gpu = profile.gpu  # each distinct kernel name judged once (the report's name columns)
    kernel_names = {name for name, kind in zip(columns.values(gpu, "name"),
                                               columns.values(gpu, "kind"), strict=True)
                    if kind == KERNEL}
    return (any(classify_kernel(name, KERNEL).category == "communication"
                for name in kernel_names)
            or any(name.startswith(COMM_RANGE_PREFIXES)
                   for name in {a.name for a in profile.annotations if not a.on_gpu})
            # a trace has few distinct op names: judge each once
            or any(map(is_communication_name, columns.distinct(profile.cpu_ops, "name"))))


def communication_section(profile: Profile, report: dict[str, Any]) -> dict[str, Any] | None:
    """The report's ``distributed`` section; None for a single process without collectives.

    ``report`` must already hold ``system`` and ``iterations`` (their items' ``start_us`` and
    ``wall_ms`` bound the per-iteration figures).
    """
    dist = (report.get("system") or {}).get("distributed") or {}
    world = dist.get("world_size")
    if not (isinstance(world, int) and world > 1) and not _has_communication(profile):
        return None  # the common single-process case costs one scan of names
    comm, overlap, names = _gpu_intervals(profile)
    comm_source: str | None = "gpu_kernels"
    if comm:
        compute = _gpu_compute(profile)
    else:
        comm, cpu_compute, names = _cpu_intervals(profile)
        comm_source = "cpu_ranges" if comm else None
        has_kernels = any(a.kind == KERNEL for a in profile.gpu)
        compute = _gpu_compute(profile) if has_kernels else cpu_compute
        overlap = intersect(comm, compute)
    compute_source = "gpu_kernels" if any(a.kind == KERNEL for a in profile.gpu) else "cpu_ops"

    rows = []
    for item in (report.get("iterations") or {}).get("items") or []:
        lo = float(item["start_us"])
        hi = lo + float(item["wall_ms"]) * 1e3
        c, o = length(comm, lo, hi), length(overlap, lo, hi)
        rows.append({"step": item.get("step"), "wall_ms": item["wall_ms"],
                     "compute_ms": _ms(length(compute, lo, hi)), "communication_ms": _ms(c),
                     "overlap_ms": _ms(o), "exposed_ms": _ms(c - o)})
    n = max(len(rows), 1)
    total = {k: sum(r[k] for r in rows) for k in
             ("wall_ms", "compute_ms", "communication_ms", "overlap_ms", "exposed_ms")}
    collectives: list[dict[str, Any]] = sorted(
        ({"name": name, "count": len(d), "total_us": round(sum(d), 3)}
         for name, d in names.items()), key=lambda c: -c["total_us"])
    return {
        "rank": dist.get("rank"), "world_size": world, "backend": dist.get("backend"),
        "communication_source": comm_source, "compute_source": compute_source,
        "communication_us": round(total["communication_ms"] * 1e3, 3),
        "compute_us": round(total["compute_ms"] * 1e3, 3),
        "overlap_us": round(total["overlap_ms"] * 1e3, 3),
        "exposed_us": round(total["exposed_ms"] * 1e3, 3),
        "overlap_pct": _pct(total["overlap_ms"], total["communication_ms"])
        if total["communication_ms"] > 0 else None,
        "communication_pct": _pct(total["communication_ms"], total["wall_ms"]),
        "exposed_pct": _pct(total["exposed_ms"], total["wall_ms"]),
        "mean_ms": {k: round(v / n, 4) for k, v in total.items()},
        "per_iteration": rows,
        "collectives": collectives[:TOP_COLLECTIVES],
    }


def _ms(us: float) -> float:
    return round(us / 1e3, 4)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole > 0 else 0.0


# -- across ranks ---------------------------------------------------------------------------

def _rank_row(report: dict[str, Any], index: int) -> dict[str, Any]:
    system = report.get("system") or {}
    dist = system.get("distributed") or {}
    it = report.get("iterations") or {}
    section = report.get("distributed") or {}
    mean = section.get("mean_ms") or {}
    wall = it.get("mean_ms") or 0.0
    if mean:
        compute, exposed = mean.get("compute_ms"), mean.get("exposed_ms") or 0.0
    else:  # no communication measured: GPU busy time (or nothing) is the compute
        compute, exposed = it.get("gpu_busy_mean_ms"), 0.0
    rank = dist.get("rank")
    return {
        "rank": rank if isinstance(rank, int) else index,
        "iterations": it.get("count"),
        "iteration_ms": wall, "iteration_median_ms": it.get("median_ms"),
        "iteration_times_ms": [i.get("wall_ms") for i in it.get("items") or []],
        "compute_ms": compute, "communication_ms": mean.get("communication_ms"),
        "overlap_ms": mean.get("overlap_ms"), "exposed_ms": exposed,
        "overlap_pct": section.get("overlap_pct"), "exposed_pct": section.get("exposed_pct"),
        # time not spent blocked in collectives: in synchronous training every rank's
        # iteration takes as long as the slowest one's, and the others wait in communication
        "working_ms": round(max(wall - exposed, 0.0), 4),
        "backend": dist.get("backend"), "gpu_name": system.get("gpu_name"),
    }


def _straggler(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    if len(rows) < 2:
        return None
    slow = max(rows, key=lambda r: r["working_ms"])
    others = statistics.median(r["working_ms"] for r in rows if r is not slow)
    by = slow["working_ms"] - others
    pct = _pct(by, others) if others > 0 else 0.0
    return {"rank": slow["rank"], "working_ms": slow["working_ms"],
            "others_median_ms": round(others, 4), "slower_by_ms": round(by, 4),
            "slower_by_pct": pct,
            "significant": pct >= STRAGGLER_MIN_PCT and by >= STRAGGLER_MIN_MS}


def cross_rank_summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Compare the reports of every rank of one window (any order, one report per rank)."""
    rows = sorted((_rank_row(r, i) for i, r in enumerate(reports)), key=lambda r: r["rank"])
    declared = [((r.get("system") or {}).get("distributed") or {}).get("world_size")
                for r in reports]
    world = max([w for w in declared if isinstance(w, int)] + [len(rows)], default=0)
    seen = {r["rank"] for r in rows}
    computes = [r["compute_ms"] for r in rows if r["compute_ms"] is not None]
    mean_compute = statistics.fmean(computes) if computes else 0.0
    iters = [r["iteration_ms"] for r in rows]
    summary: dict[str, Any] = {
        "world_size": world,
        "ranks": rows,
        "missing_ranks": [r for r in range(world) if r not in seen],
        "iteration_ms": {"min": min(iters), "max": max(iters),
                         "median": statistics.median(iters)} if iters else None,
        "straggler": _straggler(rows),
        # max/mean of per-rank compute per iteration: 1.0 is perfectly balanced
        "load_imbalance": round(max(computes) / mean_compute, 3)
        if len(computes) > 1 and mean_compute > 0 else None,
        "recommendations": [],
    }
    summary["recommendations"] = recommend_across_ranks(summary, reports)
    return summary
