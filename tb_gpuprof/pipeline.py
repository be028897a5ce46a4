"""Analyse and store: the one module that runs readers -> analysis -> store together.

The layers below it never import each other across the flow (tests/test_layering.py): a
reader knows nothing of the analysis, the analysis nothing of event files, the store nothing
of traces' contents. What needs all three (the CLI's ``report`` and ``import``, ``compare``,
the plugin's refreshed reports, the hooks' window child, the per-rank workers) comes here.

One answer per run: a stored report made by another analysis than the installed one (its
``analysis_id`` differs, analysis/identity.py) is rebuilt from the run's stored raw trace and
the context stored beside it, and the result is cached beside the run
(``plugins/gpuprof/reports/``). ``report RUN``, ``report RUN --reanalyze``, ``compare`` and
the plugin all go through :func:`current_report`, so they give the same answer.
"""

from __future__ import annotations

import os
from typing import Any

from .analysis.context import (
    AnalysisContext,
    build_report_in_context,
    context_from_dict,
    recover_context,
)
from .analysis.identity import analysis_id
from .errors import GpuProfError
from .readers import load_profile
from .store import layout, schema
from .store.importer import default_run_name, make_run_dir, resolve_run_dir, write_imported_run
from .store.reader import (
    event_files,
    latest_json_blob,
    load_refreshed_report,
    locate_run_report,
    read_context_beside,
    stored_reports,
    window_files,
)
from .store.writer import replace_stored_report, save_context, save_refreshed_report


def analyse_trace(path: str | os.PathLike[str],
                  context: AnalysisContext | None = None) -> dict[str, Any]:
    """The report of one trace file, with what ``context`` knows beside it."""
    profile = load_profile(os.fspath(path), python_calls=False)  # a report reads none
    return build_report_in_context(profile, context or AnalysisContext())


def trace_context(path: str | os.PathLike[str]) -> AnalysisContext:
    """The context stored beside a trace file (a window's trace inside a run), or an empty
    one: ``report TRACE`` on a run's stored trace then knows what the hook knew."""
    path = os.fspath(path)
    stored = read_context_beside(path)
    return context_from_dict(stored, path) if stored is not None else AnalysisContext()


def import_trace(trace: str, logdir: str, run: str | None = None, key: str | None = None) -> str:
    """Analyze ``trace`` and write it as run ``run`` of ``logdir``; returns the run directory.

    The run gets one report (at the last analyzed step, or 0), the per-iteration
    ``gpuprof/iteration_time_ms`` scalars, a copy of the raw trace and its context.
    """
    trace = os.fspath(trace)
    run_dir = resolve_run_dir(logdir, run if run is not None else default_run_name(trace))
    make_run_dir(logdir, run_dir)  # before minutes of analysis, not after
    if event_files(run_dir):
        raise GpuProfError(f"{run_dir} already holds event files; pick another --run")
    context = AnalysisContext(key=key)
    report = analyse_trace(trace, context)
    step = write_imported_run(run_dir, trace, report)
    save_context(run_dir, step, context.to_dict())
    return run_dir


# What this module adds to a rebuilt report (the ``refreshed`` mark, the source path): a
# change to it re-makes the cached rebuilds, which the analysis id alone would not.
REFRESH_FORMAT = 2


def is_current(report: dict[str, Any]) -> bool:
    """Whether the installed analysis made ``report``."""
    return report.get("analysis_id") == analysis_id()


def current_report(run_dir: str, stored: dict[str, Any], step: int, rank: int | None,
                   identity: str, *, reanalyze: bool = False) -> dict[str, Any]:
    """The installed analysis's report of one stored window.

    ``stored``: the report as stored; ``identity`` tells this write of the window from
    another (the cache's key, with the analysis id). A current report is returned as it is;
    a stale one is rebuilt from the window's raw trace and context and cached beside the
    run; ``reanalyze`` rebuilds in any case. A stale report whose raw trace is not in the run
    is returned with a warning saying so.
    """
    stale = not is_current(stored)
    if not stale and not reanalyze:
        return stored
    trace, stored_context = window_files(run_dir, step, rank)
    if trace is None:
        if reanalyze:
            raise GpuProfError(f"{run_dir}: no raw trace of step {step} is stored in the run, "
                               "so it cannot be re-analysed")
        return _with_warning(stored, _NO_TRACE_WARNING.format(gen=stored.get("generator")))
    cache_key = {"analysis_id": analysis_id(), "stored": identity, "format": REFRESH_FORMAT}
    if not reanalyze:
        cached = load_refreshed_report(run_dir, step, rank)
        if cached is not None and cached.get("key") == cache_key:
            return cached["report"]
    try:
        report = _reanalyse(run_dir, trace, stored, stored_context, stale)
    except GpuProfError as e:
        if reanalyze:
            raise
        return _with_warning(stored, f"this report was made by an older analysis "
                                     f"({stored.get('generator')}) and rebuilding it from the "
                                     f"run's raw trace failed: {e}")
    if stale:  # a current report is read as stored: nothing to cache
        save_refreshed_report(run_dir, step, rank, {"key": cache_key, "report": report})
    return report


_NO_TRACE_WARNING = ("this report was made by an older analysis ({gen}) and the run holds no "
                     "raw trace to rebuild it from: its figures and advice may be out of date")


def _with_warning(report: dict[str, Any], warning: str) -> dict[str, Any]:
    return {**report, "warnings": [*(report.get("warnings") or []), warning]}


def _reanalyse(run_dir: str, trace: str, stored: dict[str, Any],
               stored_context: dict[str, Any] | None, stale: bool) -> dict[str, Any]:
    if stored_context is not None:
        context, how = context_from_dict(stored_context, trace), "stored"
    else:
        topology = latest_json_blob(run_dir, layout.TOPOLOGY_TAG)
        context, how = recover_context(stored, topology), "recovered"
    report = analyse_trace(trace, context)
    report["source"]["path"] = (stored.get("source") or {}).get("path",
                                                              report["source"]["path"])
    if stale:
        basis = ("its stored context" if how == "stored"
                 else "the context recovered from the stored report")
        report["refreshed"] = {
            "from_generator": str(stored.get("generator")),
            "from_analysis_id": stored.get("analysis_id"),
            "context": how,
            "reason": (f"The stored report was made by another analysis "
                       f"({stored.get('generator')}, analysis "
                       f"{stored.get('analysis_id') or 'before analysis ids'}); this one was "
                       f"rebuilt from the run's raw trace and {basis} by the installed "
                       f"analysis ({analysis_id()})."),
        }
    return report


def rebuilt_report(run_dir: str, stored: dict[str, Any], step: int, rank: int | None
                   ) -> dict[str, Any]:
    """What the installed analysis makes of one stored window (its raw trace and stored
    context), as the hook would store it today: no cache, no ``refreshed`` mark."""
    trace, context = window_files(run_dir, step, rank)
    if trace is None:
        raise GpuProfError(f"{run_dir}: no raw trace of step {step} is stored in the run")
    if context is None:
        raise GpuProfError(f"{run_dir}: no analysis context of step {step} is stored in the run")
    return _reanalyse(run_dir, trace, stored, context, stale=False)


def rebuild_stored_reports(run_dir: str) -> list[int]:
    """Rewrite every report stored in ``run_dir``'s own events files with the installed
    analysis's (:func:`rebuilt_report`); a window without a stored context first gets the one
    recovered from its report, stored beside its trace. The steps rewritten. For shipped runs
    (tools/rebuild_samples.py), never for a user's run."""
    steps = []
    for stored in stored_reports(run_dir):
        report = schema.decode_report(stored.blob, stored.content, f"{run_dir} {stored.step}")
        if window_files(run_dir, stored.step, stored.rank)[1] is None:
            recovered = recover_context(report, latest_json_blob(run_dir, layout.TOPOLOGY_TAG))
            save_context(run_dir, stored.step, recovered.to_dict(), rank=stored.rank or None)
        fresh = rebuilt_report(run_dir, report, stored.step, stored.rank)
        replace_stored_report(stored.file, stored.step, fresh)
        steps.append(stored.step)
    return steps


def run_report(path: str, run: str | None = None, step: int | None = None, *,
               reanalyze: bool = False) -> dict[str, Any]:
    """The current report of a stored run (``tb-gpuprof report RUN``, ``compare``)."""
    located = locate_run_report(path, run, step)
    return current_report(located.run_dir, located.decode(), located.stored.step,
                          located.stored.rank, located.identity, reanalyze=reanalyze)


__all__ = ["analyse_trace", "current_report", "import_trace", "is_current",
           "rebuild_stored_reports", "rebuilt_report", "run_report", "trace_context"]
