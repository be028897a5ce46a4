"""The window's analysis in a child process: read the profile, build the report, store the
raw profile in the run. The hooks start it (``python -m tb_gpuprof._window_child``) so the
analysis never competes with training for the training process's GIL, and it lowers its own
CPU priority first thing (``lower_priority``; this process only).

Protocol: one JSON job on stdin, one JSON result on stdout (``{"report": ..., "trace_path":
..., "warnings": [...]}`` or ``{"error": "..."}``); framework-free, like the analysis.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

# Where SCHED_IDLE is missing or refused: how much lower than the training process the
# analysis runs, in nice levels (Unix).
NICE_INCREMENT = 19


def lower_priority() -> str:
    """Run this process only on CPU time that nothing else wants: ``SCHED_IDLE`` on Linux
    (scheduler weight 3 against a normal task's 1024, and preempted as soon as one wakes),
    else nice +19 (weight 15). At the former nice +10 (weight 110), on a CPU it shared with
    a launch-bound training thread, the child took about a tenth of that CPU while it ran
    (docs/performance.md, "Sixth run"). Where every CPU is busy with work of normal priority
    (data-loader workers, say) the report waits for a free moment rather than slow them.
    Returns the policy in force: "idle", "nice" or "normal"."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return "idle"
        except OSError:
            pass
    if hasattr(os, "nice"):
        try:
            os.nice(NICE_INCREMENT)
            return "nice"
        except OSError:
            pass  # not allowed here: run at the parent's priority
    return "normal"


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


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Store, then analyze (the raw profile is worth keeping even if the analysis fails)."""
    from .analysis.report import build_report
    from .readers import load_profile

    out: dict[str, Any] = {"warnings": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["trace_path"] = _store_raw(job)
            job["trace"] = out["trace_path"] or job["trace"]
            profile = load_profile(job["trace"], python_calls=False)  # a report reads none
            if job.get("gpu_expected") and not profile.gpu:
                out["warnings"].append(job["no_gpu_warning"])
            out["report"] = build_report(profile, key=job.get("key"), env=job.get("env"),
                                         telemetry=job.get("telemetry"),
                                         peak_tflops=job.get("peak_tflops"),
                                         topology=job.get("topology"))
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
    out["warnings"].extend(str(w.message) for w in caught)
    return out


def main() -> int:
    policy = lower_priority()  # before the analysis's imports, which take CPU time too
    job = json.load(sys.stdin)
    result = run_job(job)
    result["priority"] = policy
    json.dump(result, sys.stdout, default=str)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
