"""`tb-gpuprof import`'s storage half: run names and directories, and writing the run.

The analysis half (read the trace, build the report) is tb_gpuprof/pipeline.py's
``import_trace``, which calls these: the store imports neither readers nor analysis.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..errors import GpuProfError
from .layout import ITERATION_TIME_TAG, safe_join
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


def make_run_dir(logdir: str, run_dir: str) -> None:
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


def write_imported_run(run_dir: str, trace: str, report: dict[str, Any]) -> int:
    """Write an imported trace's run: the per-iteration ``gpuprof/iteration_time_ms`` scalars,
    its report (at the last analyzed step, or 0) and a copy of the raw trace; the step."""
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
    return step
