"""Rebuild the sample runs that ship with the package (tb_gpuprof/samples/h200) with the
installed analysis: each run's stored report is replaced by what the current analysis makes
of the run's raw trace and stored context. tests/test_demo.py fails when a shipped report
differs from that, so run this after any change to the readers or the analysis:

    python tools/rebuild_samples.py

A sample recorded before contexts were stored first gets its context from what the hook
recorded in the run: the run summary's environment (flags, GPU, framework) and the
un-profiled iteration time, the median of the always-on GPU step times outside the window
(iteration 0 and the profiler's warm-up excluded), as the hook measures it today.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tb_gpuprof.analysis.context import AnalysisContext
from tb_gpuprof.demo import sample_runs
from tb_gpuprof.pipeline import rebuild_stored_reports
from tb_gpuprof.store import layout
from tb_gpuprof.store.reader import (
    event_files,
    iter_events,
    latest_json_blob,
    stored_reports,
    window_files,
)
from tb_gpuprof.store.writer import save_context

PROFILER_WARMUP_STEPS = 1  # the hook's torch.profiler schedule warms up one step before


def _scalar(run: Path, tag: str) -> dict[int, float]:
    return {e.step: v.simple_value for f in event_files(str(run)) for e in iter_events(f)
            for v in e.summary.value if v.tag == tag}


def recorded_context(run: Path) -> AnalysisContext:
    """The context the hook had, from what it recorded in the run."""
    summary = latest_json_blob(str(run), layout.RUN_SUMMARY_TAG) or {}
    env = dict(summary.get("env") or {})
    start, stop = summary.get("window") or (None, None)
    if start is not None and "unprofiled" not in env:
        # the period between end-of-step events; runs of the first version kept each step's
        # own GPU span, the same on a GPU-bound loop
        gpu_periods = (_scalar(run, layout.GPU_STEP_TIME_TAG)
                       or _scalar(run, layout.GPU_TIME_TAG))
        periods = {step: ms for step, ms in gpu_periods.items()
                   if step != 0 and not start - PROFILER_WARMUP_STEPS <= step <= stop}
        if periods:
            env["unprofiled"] = {"median_ms": round(statistics.median(periods.values()), 4),
                                 "count": len(periods), "source": "gpu_events"}
    stored = stored_reports(str(run))
    telemetry = None
    if stored:
        from tb_gpuprof.store.schema import decode_report

        telemetry = decode_report(stored[-1].blob, stored[-1].content, str(run)).get("telemetry")
    return AnalysisContext(env=env or None, telemetry=telemetry,
                           topology=latest_json_blob(str(run), layout.TOPOLOGY_TAG))


def main() -> int:
    for run in sample_runs():
        for stored in stored_reports(str(run)):
            trace, context = window_files(str(run), stored.step, stored.rank)
            if trace is not None and context is None:
                save_context(str(run), stored.step, recorded_context(run).to_dict(),
                             rank=stored.rank or None)
        steps = rebuild_stored_reports(str(run))
        print(f"{run.name}: rebuilt the report of step {', '.join(map(str, steps))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
