"""The window's analysis in a child process: read the profile, build the report, store the
raw profile in the run. The hooks start it (``python -m tb_gpuprof._window_child``) so the
analysis never competes with training for the training process's GIL, and it lowers its own
CPU priority first thing (``lower_priority``: nice +19; this process only).

Protocol: one JSON job on stdin, one JSON result on stdout (``{"report": ..., "trace_path":
..., "warnings": [...], "timing": {...}}`` or ``{"error": "..."}``); framework-free, like the
analysis.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

# How much lower than the training process the analysis runs, in nice levels (Unix): +19,
# the lowest (scheduler weight 15 against a normal task's 1024). At the former +10 (weight
# 110), on a CPU it shared with a launch-bound training thread, the child took about a tenth
# of that CPU while it ran. SCHED_IDLE (weight 3) was tried: under CPU training on both cores
# of the development machine one window's analysis then took 162 s against 34 s at +19, and
# an unprivileged process cannot leave SCHED_IDLE again (RLIMIT_NICE), while the CPU time the
# child takes from training in all is its own CPU time either way (docs/pytorch.md).
NICE_INCREMENT = 19


def lower_priority() -> int | None:
    """Nice this process by NICE_INCREMENT; its niceness then, None where not allowed."""
    if not hasattr(os, "nice"):
        return None
    try:
        return os.nice(NICE_INCREMENT)
    except OSError:
        return None  # not allowed here: run at the parent's priority


def _store_raw(job: dict[str, Any]) -> str | None:
    """Keep the window's raw profile in the run (gzipped for Kineto JSON); its path."""
    store = job.get("store")
    if not store:
        return None
    from ._hookcore import gzip_copy
    from .store.writer import save_raw_trace

    src = job["trace"]
    if store.get("gzip"):
        src = gzip_copy(src, os.path.join(os.path.dirname(src), store["name"]))
    elif store.get("name") and os.path.basename(src) != store["name"]:
        dest = os.path.join(os.path.dirname(src), store["name"])
        os.replace(src, dest)
        src = dest
    return save_raw_trace(store["run_dir"], src, int(store["step"]), rank=store.get("rank"))


class Phases:
    """Wall and CPU seconds of each of the child's steps (the result's ``timing``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def done(self, step: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.seconds[f"{step}_s"] = round(wall - self._wall, 4)
        self.seconds[f"{step}_cpu_s"] = round(cpu - self._cpu, 4)
        self._wall, self._cpu = wall, cpu


def job_context(job: dict[str, Any]) -> Any:
    """What the analysis knows beside the trace, from the job (stored with the raw trace)."""
    from .analysis.context import AnalysisContext

    return AnalysisContext(key=job.get("key"), env=job.get("env"),
                           telemetry=job.get("telemetry"), peak_tflops=job.get("peak_tflops"),
                           topology=job.get("topology"))


def _store_context(job: dict[str, Any], context: Any) -> None:
    store = job.get("store")
    if store:
        from .store.writer import save_context

        save_context(store["run_dir"], int(store["step"]), context.to_dict(),
                     rank=store.get("rank"))


def run_job(job: dict[str, Any], phases: Phases | None = None) -> dict[str, Any]:
    """Store, then analyze (the raw profile is worth keeping even if the analysis fails)."""
    phases = phases or Phases()
    from .analysis.context import build_report_in_context
    from .readers import load_profile

    phases.done("imports")
    out: dict[str, Any] = {"warnings": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            context = job_context(job)
            out["trace_path"] = _store_raw(job)
            _store_context(job, context)
            phases.done("store")
            # the raw file where it still is (the run got a gzipped copy: reading that back
            # would only decompress it again), else the one moved into the run
            if not os.path.exists(job["trace"]):
                job["trace"] = out["trace_path"] or job["trace"]
            profile = load_profile(job["trace"], python_calls=False)  # a report reads none
            phases.done("read")
            if job.get("gpu_expected") and not profile.gpu:
                out["warnings"].append(job["no_gpu_warning"])
            report = build_report_in_context(profile, context)
            if out["trace_path"]:  # the stored copy, as a path inside the run
                report["source"]["path"] = os.path.relpath(out["trace_path"],
                                                           job["store"]["run_dir"])
            out["report"] = report
            phases.done("report")
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
    out["warnings"].extend(str(w.message) for w in caught)
    return out


def _thread_count() -> int | None:
    """This process's threads now (Linux; None elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def main() -> int:
    niceness = lower_priority()  # before the analysis's imports, which take CPU time too
    job = json.load(sys.stdin)
    phases = Phases()  # from here: reading the job is not part of the imports' time
    result = run_job(job, phases)
    result["niceness"] = niceness
    result["timing"] = {**phases.seconds, "cpu_s": round(time.process_time(), 4),
                        "threads": _thread_count()}
    write_all(sys.stdout.fileno(), json.dumps(result, default=str).encode())
    return 0


def write_all(fd: int, data: bytes) -> None:
    """``data`` to ``fd`` in as few writes as the pipe takes. ``json.dump`` to ``sys.stdout``
    writes each token: under ``PYTHONUNBUFFERED=1`` (common in containers and batch
    scripts) the report of a 12 MB H200 trace went out in about 1,500 writes, and the
    parent's analysis thread woke, took the GIL from training and read once per write."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


if __name__ == "__main__":
    sys.exit(main())
