"""Many ranks at once: one report per rank trace, in parallel processes or on a Dask cluster.

``tb-gpuprof report DIR`` on a directory of rank traces (one Kineto/XPlane/Nsight file per
rank) runs :func:`analyze_trace` for each file and compares the ranks with
:func:`tb_gpuprof.analysis.distributed.cross_rank_summary`. Locally the traces run in worker
processes, as many at a time as there are cores *and* as fit in memory: the first (largest)
trace runs alone and its worker measures the peak memory it took per byte of trace; that
ratio sizes every later admission against the memory the machine has available. With
``dask_address`` the same function runs on an existing ``dask.distributed`` cluster instead
(its workers must see the same paths). Either way the result is the same dictionary.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import errors
from .errors import GpuProfError, TraceReadError

TRACE_SUFFIXES = (".json", ".json.gz", ".xplane.pb", ".pb", ".sqlite", ".sqlite3")
MEMORY_HEADROOM = 0.8  # share of the available memory the workers may plan to use
FIRST_GUESS_BYTES_PER_BYTE = 1.0  # only used when a worker cannot measure itself
DASK_CONNECT_TIMEOUT_S = 10.0


@dataclass(slots=True)
class RankResult:
    """What one worker sends back: the report and what analysing it cost."""

    path: str
    report: dict[str, Any]
    seconds: float
    peak_bytes: int | None  # the worker's peak RSS above its baseline while on this trace


def find_rank_traces(directory: str) -> list[str]:
    """Trace files directly inside ``directory`` (sorted by name; not recursive)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        raise TraceReadError(directory, f"cannot list: {e.strerror or e}") from None
    return [os.path.join(directory, n) for n in names
            if n.endswith(TRACE_SUFFIXES) and not n.endswith(".env.json")
            and os.path.isfile(os.path.join(directory, n))]


# --- the per-rank function (runs in a worker process or on a Dask worker) ------------------


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _reset_peak_rss() -> bool:
    """Start a new peak-RSS measurement for this process (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


_baseline: tuple[int, int | None] | None = None  # (pid, RSS in KiB after the imports)


def _baseline_kib() -> int | None:
    """The least RSS this process has had at the start of an analysis, the first one once
    the analysis is imported.

    A reused worker keeps the memory of its last trace (freed, but not returned to the OS),
    so what a trace costs is measured as the process's peak above this baseline: the
    footprint a worker reaches, which is what admitting one more worker has to allow for.
    Where the process has since given memory back (RSS now below the baseline), the
    baseline follows it down: a peak measured from now is never below it.
    """
    global _baseline
    now = _status_kib("VmRSS:")
    if _baseline is None or _baseline[0] != os.getpid():  # fork copies the parent's
        _baseline = (os.getpid(), now)
    elif now is not None and (_baseline[1] is None or now < _baseline[1]):
        _baseline = (os.getpid(), now)
    return _baseline[1]


def analyze_trace(path: str, iter_start: int | None = None, iter_stop: int | None = None,
                  key: str | None = None) -> RankResult:
    """Read one rank's trace and build its report; measures its own time and peak memory."""
    from .analysis.context import AnalysisContext
    from .pipeline import analyse_trace

    before = _baseline_kib()
    measured = _reset_peak_rss()
    t0 = time.perf_counter()
    report = analyse_trace(path, AnalysisContext(key=key, iter_start=iter_start,
                                                 iter_stop=iter_stop))
    seconds = time.perf_counter() - t0
    peak = _status_kib("VmHWM:")
    growth = (peak - before) * 1024 if measured and peak is not None and before else None
    return RankResult(path, report, seconds, growth)


def _analyze_remote(path: str, **options: Any) -> RankResult | tuple[str, str, str]:
    """:func:`analyze_trace` in a worker: a user error comes back as a value, because
    :class:`TraceReadError` (two-argument constructor) does not survive pickling."""
    try:
        return analyze_trace(path, **options)
    except TraceReadError as e:
        return type(e).__name__, e.path, e.problem
    except GpuProfError as e:
        return "GpuProfError", path, str(e)


def _unwrap(outcome: RankResult | tuple[str, str, str]) -> RankResult:
    if isinstance(outcome, RankResult):
        return outcome
    kind, path, problem = outcome
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, TraceReadError):
        raise cls(path, problem)
    raise GpuProfError(problem)


# --- scheduling ----------------------------------------------------------------------------


def available_memory_bytes() -> int | None:
    """MemAvailable (what can be allocated without swapping), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Admission:
    """How many traces may run at once: at most ``cores``, and their estimated peaks (file
    size x the largest measured peak per byte) within ``budget`` bytes of memory."""

    def __init__(self, cores: int, budget: int | None) -> None:
        self.cores = max(1, cores)
        self.budget = budget
        self.bytes_per_byte: float | None = None  # unknown until a trace was measured

    def learn(self, result: RankResult) -> None:
        size = os.path.getsize(result.path)
        if result.peak_bytes is not None and size > 0:
            ratio = result.peak_bytes / size
            self.bytes_per_byte = max(ratio, self.bytes_per_byte or 0.0)

    def estimate(self, path: str) -> float:
        return os.path.getsize(path) * (self.bytes_per_byte or FIRST_GUESS_BYTES_PER_BYTE)

    def admits(self, running: dict[Any, float], path: str) -> bool:
        if not running:
            return True  # one at a time always runs, however large
        if self.bytes_per_byte is None:  # nothing measured yet: the first trace runs alone
            return False
        if len(running) >= self.cores:
            return False
        return self.budget is None or sum(running.values()) + self.estimate(path) <= self.budget


def _pool_context() -> Any:
    # fork is quickest to start and inherits the imports; spawn where there is no fork
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def run_local(paths: Sequence[str], workers: int | None = None,
              on_done: Callable[[RankResult], None] | None = None,
              **options: Any) -> list[RankResult]:
    """Analyse ``paths`` in worker processes; results in the order of ``paths``."""
    cores = min(workers or usable_cores(), len(paths))
    if cores <= 1:  # serial: no pool, same function
        return [_done(analyze_trace(p, **options), on_done) for p in paths]
    budget = available_memory_bytes()
    admission = Admission(cores, int(budget * MEMORY_HEADROOM) if budget else None)
    queue = sorted(paths, key=os.path.getsize, reverse=True)  # largest first: measured first
    results: dict[str, RankResult] = {}
    running: dict[cf.Future[RankResult | tuple[str, str, str]], float] = {}
    with cf.ProcessPoolExecutor(max_workers=cores, mp_context=_pool_context()) as pool:
        while queue or running:
            while queue and admission.admits(running, queue[0]):
                path = queue.pop(0)
                running[pool.submit(_analyze_remote, path, **options)] = admission.estimate(path)
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                del running[fut]
                result = _unwrap(fut.result())  # a worker's TraceReadError re-raises here
                admission.learn(result)
                results[result.path] = _done(result, on_done)
    return [results[p] for p in paths]


def _done(result: RankResult, on_done: Callable[[RankResult], None] | None) -> RankResult:
    if on_done is not None:
        on_done(result)
    return result


def run_dask(paths: Sequence[str], address: str, **options: Any) -> list[RankResult]:
    """Analyse ``paths`` on the Dask cluster at ``address``; results in the order of ``paths``."""
    try:
        from distributed import Client
    except ImportError:
        raise GpuProfError("--dask needs dask.distributed: pip install 'tb_gpuprof[dask]'") \
            from None
    try:
        client = Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as e:
        raise GpuProfError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    with client:
        futures = client.map(_analyze_remote, list(paths), pure=False, **options)
        return [_unwrap(outcome) for outcome in client.gather(futures)]


def analyze_ranks(paths: Sequence[str], dask_address: str | None = None,
                  workers: int | None = None, **options: Any) -> dict[str, Any]:
    """One report per trace plus the cross-rank summary of all of them."""
    from .analysis.distributed import cross_rank_summary

    if not paths:
        raise GpuProfError("no trace files to analyse")
    if dask_address:
        results = run_dask(paths, dask_address, **options)
    else:
        results = run_local(paths, workers=workers, **options)
    reports = [r.report for r in results]
    return {
        "traces": [{"path": r.path, "seconds": round(r.seconds, 3),
                    "peak_mb": round(r.peak_bytes / 1e6, 1) if r.peak_bytes else None}
                   for r in results],
        "summary": cross_rank_summary(reports),
        "reports": reports,
    }


def render_ranks(result: dict[str, Any], fmt: str = "text") -> str:
    """The cross-rank view for the CLI: JSON as is, or a table of ranks and the findings."""
    import json

    if fmt == "json":
        return json.dumps(result, indent=1) + "\n"
    summary = result["summary"]
    lines = [f"{len(result['traces'])} rank traces, world size {summary['world_size']}"]
    if summary["missing_ranks"]:
        lines.append(f"missing ranks: {summary['missing_ranks']}")
    sep = "," if fmt == "csv" else "  "
    lines.append(sep.join(["rank", "iteration_ms", "working_ms", "compute_ms",
                           "exposed_comm_ms", "trace"]))
    for row, trace in zip(summary["ranks"], _traces_by_rank(result), strict=False):
        lines.append(sep.join(str(x) for x in (
            row["rank"], _num(row["iteration_ms"]), _num(row["working_ms"]),
            _num(row["compute_ms"]), _num(row["exposed_ms"]), os.path.basename(trace))))
    s = summary.get("straggler")
    if s:
        what = "straggler" if s["significant"] else "slowest rank (within noise)"
        lines.append(f"{what}: rank {s['rank']}, {s['slower_by_ms']:.2f} ms "
                     f"({s['slower_by_pct']}%) more work per iteration than the others' median")
    if summary.get("load_imbalance") is not None:
        lines.append(f"load imbalance (max/mean compute): {summary['load_imbalance']}")
    for rec in summary["recommendations"]:
        lines.append(f"[{rec['severity']}] {rec['title']}")
    return "\n".join(lines) + "\n"


def _traces_by_rank(result: dict[str, Any]) -> list[str]:
    """Trace paths in the order of the summary's rows (by rank, as cross_rank_summary sorts)."""
    rows = []
    for i, (report, trace) in enumerate(zip(result["reports"], result["traces"], strict=True)):
        rank = ((report.get("system") or {}).get("distributed") or {}).get("rank")
        rows.append((rank if isinstance(rank, int) else i, trace["path"]))
    return [path for _, path in sorted(rows, key=lambda x: x[0])]


def _num(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
