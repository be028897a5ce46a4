"""`tb-gpuprof import`: any trace file the readers know becomes a TensorBoard run."""

from __future__ import annotations

import os
import re

from ..errors import GpuProfError
from .layout import ITERATION_TIME_TAG, safe_join
from .reader import event_files
from .writer import EventWriter, save_raw_trace

_TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json",
                   ".json.gz", ".json", ".xplane.pb", ".pb", ".sqlite", ".nsys-rep")


def default_run_name(trace: str) -> str:
    name = os.path.basename(trace)
    for suffix in _TRACE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name) or "run"


def resolve_run_dir(logdir: str, run: str) -> str:
    """``logdir/run``, refusing names that are absolute or climb out of the log directory."""
    parts = run.replace("\\", "/").split("/")
    if not run or os.path.isabs(run) or any(p in ("", ".", "..") for p in parts) or "\0" in run:
        raise GpuProfError(f"invalid run name {run!r}: use a relative name without '..'")
    run_dir = safe_join(logdir, *parts)
    if run_dir is None or run_dir == os.path.realpath(logdir):
        raise GpuProfError(f"invalid run name {run!r}: it leads outside {logdir}")
    return run_dir


def _make_run_dir(logdir: str, run_dir: str) -> None:
    """Create ``run_dir``; a log directory that is a file, lies under a file or is not
    writable is a user error (one line), not a traceback."""
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise GpuProfError(f"cannot use the log directory {logdir}: it is a file, not a "
                           "directory")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise GpuProfError(f"cannot create the log directory {logdir}: "
                           f"{e.strerror or e}") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise GpuProfError(f"cannot write into the log directory {logdir}: permission denied")


def import_trace(trace: str, logdir: str, run: str | None = None, key: str | None = None) -> str:
    """Analyze ``trace`` and write it as run ``run`` of ``logdir``; returns the run directory.

    The run gets one report (at the last analyzed step, or 0), the per-iteration
    ``gpuprof/iteration_time_ms`` scalars and a copy of the raw trace.
    """
    from ..analysis.report import build_report
    from ..readers import load_profile

    trace = os.fspath(trace)
    run_dir = resolve_run_dir(logdir, run if run is not None else default_run_name(trace))
    _make_run_dir(logdir, run_dir)  # before minutes of analysis, not after
    if event_files(run_dir):
        raise GpuProfError(f"{run_dir} already holds event files; pick another --run")
    profile = load_profile(trace)
    report = build_report(profile, key=key)

    items = (report.get("iterations") or {}).get("items") or []
    steps = [it["step"] if isinstance(it.get("step"), int) else i for i, it in enumerate(items)]
    last = (report.get("iterations") or {}).get("range") or [None, None]
    step = last[1] if isinstance(last[1], int) else (max(steps) if steps else 0)

    # An import is one ordinary run whatever the environment says (a shell inside a SLURM job
    # or a torchrun worker has SLURM_PROCID/RANK set): no rank is passed, none is read.
    with EventWriter(run_dir) as writer:
        # Scalars first, in step order: TensorBoard's Python loader purges a tag's samples
        # whose steps come after a smaller step it reads later.
        for s, item in sorted(zip(steps, items, strict=True), key=lambda p: p[0]):
            if item.get("wall_ms") is not None:
                writer.add_scalar(ITERATION_TIME_TAG, item["wall_ms"], s)
        writer.add_report(report, step=step)
        save_raw_trace(run_dir, trace, step)
    return run_dir
