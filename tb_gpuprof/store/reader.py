"""Read stored reports straight from event files (for `tb-gpuprof report <run or logdir>`).

TensorBoard's own readers go through ``tensorboard.compat.tf`` (and so import TensorFlow when
it is installed); this reads the record format directly. Like TensorBoard, a truncated or
corrupt tail of an events file ends that file's data instead of failing the whole run.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2

from ..errors import GpuProfError, RunNotFoundError
from . import layout, schema
from .layout import is_events_file
from .records import HEADER as _HEADER
from .records import masked_crc32c

# A length this large is a corrupt header, not a record (stored reports are a few MiB).
_MAX_RECORD_BYTES = 512 * 1024 * 1024


def iter_records(path: str) -> Iterator[bytes]:
    """Records of one events file; stops quietly at a truncated or corrupt record.

    The length's CRC is checked (a torn write shows there first); payload integrity of
    reports is covered by zlib's own checksum when they are decoded.
    """
    with open(path, "rb") as f:
        while True:
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return
            length, length_crc = _HEADER.unpack(header)
            if masked_crc32c(header[:8]) != length_crc or length > _MAX_RECORD_BYTES:
                return
            data = f.read(length)
            if len(data) < length or len(f.read(4)) < 4:
                return
            yield data


def iter_events(path: str) -> Iterator[event_pb2.Event]:
    for data in iter_records(path):
        try:
            yield event_pb2.Event.FromString(data)
        except DecodeError:
            return


@dataclass(frozen=True, slots=True)
class StoredReport:
    step: int
    rank: int
    wall_time: float
    blob: bytes
    content: bytes
    file: str


def event_files(run_dir: str) -> list[str]:
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return []
    return [os.path.join(run_dir, n) for n in names
            if is_events_file(n) and os.path.isfile(os.path.join(run_dir, n))]


def stored_reports(run_dir: str) -> list[StoredReport]:
    """Every report record in the run's events files (not its sub-runs), in file order."""
    found = []
    for path in event_files(run_dir):
        for event in iter_events(path):
            for value in event.summary.value:
                parsed = layout.parse_report_tag(value.tag)
                if parsed is None or len(value.tensor.string_val) != 1:
                    continue
                found.append(StoredReport(parsed[0], parsed[1], event.wall_time,
                                          value.tensor.string_val[0],
                                          value.metadata.plugin_data.content, path))
    return found


def find_runs(logdir: str) -> dict[str, str]:
    """Run name (as TensorBoard names it: path relative to the logdir, "." for itself) -> dir."""
    runs = {}
    for dirpath, dirnames, filenames in os.walk(logdir):
        dirnames.sort()
        if any(is_events_file(n) for n in filenames):
            rel = os.path.relpath(dirpath, logdir)
            runs[rel.replace(os.sep, "/")] = dirpath
    return runs


def oom_reports(path: str, run: str | None = None) -> list[str]:
    """The out-of-memory reports of the runs under ``path``, or of run ``run``: the hook
    writes one when a CUDA out-of-memory error ends the loop, window or not."""
    runs = find_runs(path) if os.path.isdir(path) else {}
    if run is not None:
        key = run.strip("/").replace(os.sep, "/") or "."
        runs = {key: runs[key]} if key in runs else {}
    return [p for _, run_dir in sorted(runs.items()) for p in oom_reports_in(run_dir)]


def oom_reports_in(run_dir: str) -> list[str]:
    """A run directory's out-of-memory reports (store/layout.oom_report_path), any rank's:
    regular files only, rank 0's first."""
    first = layout.oom_report_path(run_dir)
    folder, name = os.path.dirname(first), os.path.basename(first).removesuffix(".json")
    if not os.path.isdir(folder):
        return []
    found = sorted(f for f in os.listdir(folder) if f == f"{name}.json"
                   or (f.startswith(f"{name}.rank") and f.endswith(".json")))
    paths = [os.path.join(folder, f) for f in found]
    return [p for p in paths if os.path.isfile(p) and not os.path.islink(p)]


def _pick(reports: list[StoredReport], step: int | None, where: str) -> StoredReport:
    if step is None:
        step = max(r.step for r in reports)
    at_step = [r for r in reports if r.step == step]
    if not at_step:
        steps = ", ".join(str(s) for s in sorted({r.step for r in reports}))
        raise RunNotFoundError(f"{where}: no report at step {step} (steps: {steps})")
    # Rank 0 first; for a rewritten window, the latest write wins.
    return min(at_step, key=lambda r: (r.rank, -r.wall_time))


@dataclass(frozen=True, slots=True)
class LocatedReport:
    """A stored report found in a run: the run's directory, a name for messages, the record."""
    run_dir: str
    where: str
    stored: StoredReport

    def decode(self) -> dict[str, Any]:
        return schema.decode_report(self.stored.blob, self.stored.content,
                                    f"{self.where} step {self.stored.step}")

    @property
    def identity(self) -> str:
        return stored_identity(self.stored.wall_time, self.stored.blob)


def stored_identity(wall_time: float, blob: bytes) -> str:
    """What tells one stored report from another write of the same window (the key of its
    refreshed copy, with the analysis id): the CLI's and the plugin's readers both use it."""
    return f"{wall_time!r}:{len(blob)}"


def locate_run_report(path: str, run: str | None = None,
                      step: int | None = None) -> LocatedReport:
    """The stored report of a run directory, or of one run of a log directory.

    With a log directory, ``run`` picks the run; without it, the only run holding a report, or
    the directory itself when it holds one (rank 0 of a run whose other ranks are sub-runs).
    Default step: the latest window.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise RunNotFoundError(f"{path}: no such directory")
    runs = find_runs(path)
    if run is not None:
        run_key = run.strip("/").replace(os.sep, "/") or "."
        if run_key not in runs:
            names = ", ".join(sorted(runs)) or "none"
            raise RunNotFoundError(f"{path}: no run named {run!r} (runs: {names})")
        candidates = {run_key: runs[run_key]}
    else:
        candidates = runs
    with_reports = {name: reps for name, d in candidates.items() if (reps := stored_reports(d))}
    if not with_reports:
        what = f"run {run!r} of {path}" if run is not None else path
        if not runs:
            raise RunNotFoundError(f"{what}: no TensorBoard event files found")
        raise RunNotFoundError(f"{what}: no tb_gpuprof report stored (only scalars or other data)")
    if len(with_reports) > 1 and run is None and "." in with_reports:
        # A run directory whose ranks > 0 write sub-runs (<run>/rank1, ...): the directory
        # itself (rank 0) is the run the user named.
        with_reports = {".": with_reports["."]}
    if len(with_reports) > 1:
        names = ", ".join(sorted(with_reports))
        raise RunNotFoundError(f"{path}: {len(with_reports)} runs hold reports ({names}); "
                               "pick one with --run")
    ((name, reports),) = with_reports.items()
    where = os.path.join(path, name) if name != "." else path
    return LocatedReport(runs[name], where, _pick(reports, step, where))


def load_run_report(path: str, run: str | None = None, step: int | None = None) -> dict[str, Any]:
    """The report as stored (:func:`locate_run_report`), decoded; pipeline.run_report gives
    the current analysis's answer for the same run."""
    return locate_run_report(path, run, step).decode()


def window_files(run_dir: str, step: int, rank: int | None = None
                 ) -> tuple[str | None, dict[str, Any] | None]:
    """(the window's stored raw trace, its stored analysis context) where the run has them.

    The rank's own directory first (``step_<s>.rank<r>``), then the plain one: a rank's
    sub-run stores its window without the suffix when its report tag has none."""
    for r in dict.fromkeys((rank or None, None)):
        window_dir = layout.trace_dir(run_dir, step, r)
        try:
            names = sorted(os.listdir(window_dir))
        except OSError:
            continue
        traces = [os.path.join(window_dir, n) for n in names if layout.is_raw_trace_entry(n)
                  and os.path.isfile(os.path.join(window_dir, n))
                  and not os.path.islink(os.path.join(window_dir, n))]
        if traces:
            return traces[0], _read_json(os.path.join(window_dir, layout.CONTEXT_FILE_NAME))
    return None, None


def read_context_beside(trace_path: str) -> dict[str, Any] | None:
    """The analysis context stored next to a window's raw trace, or None."""
    return _read_json(os.path.join(os.path.dirname(os.path.abspath(trace_path)),
                                   layout.CONTEXT_FILE_NAME))


def _read_json(path: str) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing or unreadable (an unreadable context or
    cache is re-made, not an error)."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            value = json.loads(f.read())
    except (OSError, ValueError, EOFError):
        return None
    return value if isinstance(value, dict) else None


def load_refreshed_report(run_dir: str, step: int, rank: int | None = None
                          ) -> dict[str, Any] | None:
    """The cached re-analysis of one window (store/writer.save_refreshed_report), or None."""
    return _read_json(layout.refreshed_report_path(run_dir, step, rank))


def latest_json_blob(run_dir: str, tag: str) -> Any:
    """The last JSON object stored under ``tag`` in the run's events files (topology, run
    summary), or None when there is none or it cannot be read."""
    latest: tuple[float, bytes] | None = None
    for path in event_files(run_dir):
        for event in iter_events(path):
            for value in event.summary.value:
                if (value.tag == tag and len(value.tensor.string_val) == 1
                        and (latest is None or event.wall_time >= latest[0])):
                    latest = (event.wall_time, value.tensor.string_val[0])
    if latest is None:
        return None
    try:
        return schema.decode_json(latest[1], f"{run_dir} {tag}")
    except GpuProfError:
        return None
