"""Analyse and store: the one module that runs readers -> analysis -> store together.

The layers below it never import each other across the flow (tests/test_layering.py): a
reader knows nothing of the analysis, the analysis nothing of event files, the store nothing
of traces' contents. What needs all three (the CLI's ``report FILE`` and ``import``, the
hooks' window child, the per-rank workers) comes here.
"""

from __future__ import annotations

import os
from typing import Any

from .analysis.report import build_report
from .errors import GpuProfError
from .readers import load_profile
from .store.importer import default_run_name, make_run_dir, resolve_run_dir, write_imported_run
from .store.reader import event_files


def analyse_trace(path: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    """The report of one trace file (``options``: build_report's keywords)."""
    return build_report(load_profile(os.fspath(path), python_calls=False), **options)


def import_trace(trace: str, logdir: str, run: str | None = None, key: str | None = None) -> str:
    """Analyze ``trace`` and write it as run ``run`` of ``logdir``; returns the run directory.

    The run gets one report (at the last analyzed step, or 0), the per-iteration
    ``gpuprof/iteration_time_ms`` scalars and a copy of the raw trace.
    """
    trace = os.fspath(trace)
    run_dir = resolve_run_dir(logdir, run if run is not None else default_run_name(trace))
    make_run_dir(logdir, run_dir)  # before minutes of analysis, not after
    if event_files(run_dir):
        raise GpuProfError(f"{run_dir} already holds event files; pick another --run")
    report = analyse_trace(trace, key=key)
    write_imported_run(run_dir, trace, report)
    return run_dir


__all__ = ["analyse_trace", "import_trace"]
