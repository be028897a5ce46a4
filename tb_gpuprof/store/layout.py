"""The one owner of the storage layout: tag names, file and directory names, ``safe_join``.

Everything that writes or reads a gpuprof tag, an events file, a raw-trace directory or a
rank's sub-run builds or parses the name here, so a writer and its reader cannot drift apart
(docs/storage.md). Pure names: no I/O except ``safe_join``'s path resolution. Imports nothing
from tb_gpuprof, so every layer may use it.
"""

from __future__ import annotations

import os
import re

PLUGIN_NAME = "gpuprof"
TAG_PREFIX = f"{PLUGIN_NAME}/"

# Scalars (TensorBoard's Scalars tab shows them too).
ITERATION_TIME_TAG = "gpuprof/iteration_time_ms"  # the true iteration period
HOST_STEP_TIME_TAG = "gpuprof/host_step_time_ms"  # host wall time between step calls
GPU_STEP_TIME_TAG = "gpuprof/gpu_step_time_ms"  # between consecutive end-of-step CUDA events
GPU_TIME_TAG = "gpuprof/gpu_time_ms"  # the step's own GPU span
DATA_WAIT_TAG = "gpuprof/data_wait_ms"
MEMORY_ALLOCATED_PEAK_TAG = "gpuprof/memory_allocated_peak_mb"
MEMORY_RESERVED_PEAK_TAG = "gpuprof/memory_reserved_peak_mb"
MODEL_TFLOPS_TAG = "gpuprof/model_tflops"
MFU_TAG = "gpuprof/mfu_pct"
# JSON blobs (one-element blob sequences, store/schema.py).
REPORT_TAG_PREFIX = "gpuprof/report/"
TOPOLOGY_TAG = "gpuprof/topology"
RUN_SUMMARY_TAG = "gpuprof/run_summary"

# What the dashboard reads by name; served by /runs (plugin), never written out in the frontend.
DASHBOARD_TAGS = {"iteration_time": ITERATION_TIME_TAG, "host_step_time": HOST_STEP_TIME_TAG,
                  "gpu_step_time": GPU_STEP_TIME_TAG, "data_wait": DATA_WAIT_TAG,
                  "model_tflops": MODEL_TFLOPS_TAG, "mfu": MFU_TAG, "topology": TOPOLOGY_TAG}

TRACES_SUBDIR = ("plugins", PLUGIN_NAME, "traces")  # <run>/plugins/gpuprof/traces/
# Re-analysed reports, kept beside the run: <run>/plugins/gpuprof/reports/ (docs/storage.md)
REFRESHED_SUBDIR = ("plugins", PLUGIN_NAME, "reports")
# What the analysis knew beside the raw trace (flags, model facts, un-profiled times, ...),
# in the window's trace directory next to the trace.
CONTEXT_FILE_NAME = "context.json"
# The out-of-memory report the PyTorch hook writes when training fails for want of device
# memory: <run>/plugins/gpuprof/oom_report[.rank<r>].json (docs/pytorch.md#out-of-memory).
OOM_REPORT_NAME = "oom_report"
EVENTS_FILE_MARK = "tfevents"  # what makes TensorBoard read a file as an events file

_REPORT_TAG_RE = re.compile(r"^gpuprof/report/(\d+)(?:/rank(\d+))?$")
_TELEMETRY_RE = re.compile(r"^gpuprof/gpu\d+/")  # gpuprof/gpu<i>/<metric>
_TRACE_DIR_RE = re.compile(r"^step_(\d+)(?:\.rank(\d+))?$")
_RANK_RUN_RE = re.compile(r"^(?:(.+)/)?rank(\d+)$")


# --- tags -------------------------------------------------------------------------------------

def scalar_tag(name: str) -> str:
    """``gpuprof/<name>`` (a name already under the prefix is kept)."""
    return name if name.startswith(TAG_PREFIX) else f"{TAG_PREFIX}{name}"


def scalar_name(tag: str) -> str:
    """Inverse of :func:`scalar_tag`: the name under the prefix."""
    return tag.removeprefix(TAG_PREFIX)


def is_gpuprof_tag(tag: str) -> bool:
    return tag.startswith(TAG_PREFIX)


def report_tag(step: int, rank: int | None = None) -> str:
    """Tag of the report of the window ending at ``step`` (rank 0 / single process: no suffix)."""
    if rank:
        return f"{REPORT_TAG_PREFIX}{step}/rank{rank}"
    return f"{REPORT_TAG_PREFIX}{step}"


def parse_report_tag(tag: str) -> tuple[int, int] | None:
    """(step, rank) of a report tag, or None for any other tag."""
    m = _REPORT_TAG_RE.match(tag)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


def telemetry_tag(gpu: int, metric: str) -> str:
    """NVML scalar of one GPU: ``gpuprof/gpu<i>/<metric>``."""
    return f"{TAG_PREFIX}gpu{gpu}/{metric}"


def is_telemetry_scalar(tag: str) -> bool:
    return bool(_TELEMETRY_RE.match(tag))


# --- files and directories --------------------------------------------------------------------

def trace_dir_name(step: int, rank: int | None = None) -> str:
    """``step_<step>[.rank<r>]``: one window's raw-trace directory (rank 0 / None: no suffix)."""
    return f"step_{step}" + (f".rank{rank}" if rank else "")


def parse_trace_dir_name(name: str) -> tuple[int, int] | None:
    """(step, rank) of a raw-trace directory name, or None."""
    m = _TRACE_DIR_RE.match(name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def traces_root(run_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(run_dir), *TRACES_SUBDIR)


def trace_dir(run_dir: str | os.PathLike[str], step: int, rank: int | None = None) -> str:
    return os.path.join(traces_root(run_dir), trace_dir_name(step, rank))


def stored_trace_name(basename: str) -> str:
    """A raw trace's name in its directory: no "tfevents" (TensorBoard would read it)."""
    return basename.replace(EVENTS_FILE_MARK, "tf_events")


def is_raw_trace_entry(name: str) -> bool:
    """Whether an entry of a window's trace directory is its raw trace (not the context file,
    not a copy in progress)."""
    return name != CONTEXT_FILE_NAME and not name.endswith(".tmp")


def refreshed_report_path(run_dir: str | os.PathLike[str], step: int,
                          rank: int | None = None) -> str:
    """Where the re-analysed report of one window is cached."""
    return os.path.join(os.fspath(run_dir), *REFRESHED_SUBDIR,
                        f"{trace_dir_name(step, rank)}.json.gz")


def oom_report_path(run_dir: str | os.PathLike[str], rank: int | None = None) -> str:
    """Where the out-of-memory report of a run (of one rank) is written; the last failure's."""
    return os.path.join(os.fspath(run_dir), "plugins", PLUGIN_NAME,
                        f"{OOM_REPORT_NAME}{f'.rank{rank}' if rank else ''}.json")


def rank_run_name(rank: int, parent: str = ".") -> str:
    """The sub-run rank r > 0 writes into: ``<parent>/rank<r>`` (``rank<r>`` under ".")."""
    return f"rank{rank}" if parent in (".", "") else f"{parent}/rank{rank}"


def parse_rank_run_name(name: str) -> tuple[str, int] | None:
    """(parent run, rank) of a rank's sub-run name ("ddp/rank1"; "rank1" under run ".")."""
    m = _RANK_RUN_RE.match(name)
    return (m.group(1) or ".", int(m.group(2))) if m else None


def rank_run_dir(logdir: str | os.PathLike[str], rank: int) -> str:
    return os.path.join(os.fspath(logdir), rank_run_name(rank))


def events_file_name(wall_time: float, host: str, pid: int, counter: int,
                     rank: int | None = None, suffix: str = "") -> str:
    """One writer's events file: time, host, pid, per-process counter and rank make it unique."""
    rank_part = f".rank{rank}" if rank is not None else ""
    return (f"events.out.{EVENTS_FILE_MARK}.{int(wall_time)}.{host}.{pid}.{counter}."
            f"{PLUGIN_NAME}{rank_part}{suffix}")


def is_events_file(name: str) -> bool:
    return EVENTS_FILE_MARK in name


# --- paths from outside -----------------------------------------------------------------------

def safe_join(root: str | os.PathLike[str], *parts: str) -> str | None:
    """``root/parts...`` resolved (symlinks followed), or None when it would leave ``root``.

    The one check for every path a request or a command line names (plugin routes, static
    files, ``tb-gpuprof import --run``): a part that is absolute, holds a NUL or is ".." is
    refused before any resolution, and the resolved path must lie inside the resolved root.
    The root itself counts as inside (callers that need a strict child check for it).
    """
    for p in parts:
        if "\0" in p or os.path.isabs(p) or ".." in p.replace("\\", "/").split("/"):
            return None
    real_root = os.path.realpath(os.fspath(root))
    path = os.path.realpath(os.path.join(real_root, *parts))
    if os.path.commonpath([real_root, path]) != real_root:
        return None
    return path


__all__ = [
    "DASHBOARD_TAGS", "DATA_WAIT_TAG", "EVENTS_FILE_MARK", "GPU_STEP_TIME_TAG", "GPU_TIME_TAG",
    "HOST_STEP_TIME_TAG", "ITERATION_TIME_TAG", "MEMORY_ALLOCATED_PEAK_TAG",
    "MEMORY_RESERVED_PEAK_TAG", "MFU_TAG", "MODEL_TFLOPS_TAG", "OOM_REPORT_NAME", "PLUGIN_NAME",
    "REPORT_TAG_PREFIX",
    "RUN_SUMMARY_TAG", "TAG_PREFIX", "TOPOLOGY_TAG", "TRACES_SUBDIR", "events_file_name",
    "is_events_file", "is_gpuprof_tag", "is_telemetry_scalar", "oom_report_path",
    "parse_rank_run_name",
    "parse_report_tag", "parse_trace_dir_name", "rank_run_dir", "rank_run_name", "report_tag",
    "safe_join", "scalar_name", "scalar_tag", "stored_trace_name", "telemetry_tag",
    "trace_dir", "trace_dir_name", "traces_root",
]
