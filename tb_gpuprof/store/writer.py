"""A TensorBoard event-file writer that needs no TensorFlow.

It writes TensorBoard's own protos (``tensorboard.compat.proto``) in TensorBoard's record
format (``records.frame``). ``event_file_writer`` is not used because it imports
``tensorboard.compat.tf``, which loads TensorFlow when it is installed, nor its
``RecordWriter``, whose CRC is pure Python (see records.py).
"""

from __future__ import annotations

import atexit
import gzip
import itertools
import json
import os
import shutil
import socket
import threading
import time
import weakref
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from ..errors import TraceReadError
from . import layout, schema
from .records import frame

# Scalars are flushed at most this often while a run is going (reports flush at once), so a
# live TensorBoard sees progress without a syscall per scalar.
FLUSH_SECS = 2.0

_file_counter = itertools.count()
_open_writers: weakref.WeakSet[EventWriter] = weakref.WeakSet()
_open_writers_lock = threading.Lock()


def _close_all_at_exit() -> None:
    with _open_writers_lock:
        writers = list(_open_writers)
    for w in writers:
        try:
            w.close()
        except Exception:  # interpreter shutdown: never turn a clean exit into a traceback
            pass


atexit.register(_close_all_at_exit)


def _safe_host() -> str:
    host = socket.gethostname() or "localhost"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in host)


class EventWriter:
    """Appends scalars and gpuprof blobs to one new events file in ``run_dir``.

    One file per writer (per process in practice): the name holds the time, host, pid, a
    per-process counter and the rank, and the file is created exclusively, so processes and
    ranks sharing a run directory never write into each other's file. Thread-safe.

    ``rank``: the process's rank in a distributed job, as the framework adapter decided it
    (the writer never reads it from the environment: an import or a tool run under a
    launcher's ``RANK``/``SLURM_PROCID`` is still an ordinary single-process run). ``None``:
    not part of a distributed job.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, rank: int | None = None,
                 filename_suffix: str = "") -> None:
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)
                                 or rank < 0):
            raise ValueError(f"rank must be a non-negative int or None, got {rank!r}")
        self.run_dir = os.fspath(run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        self.rank = rank
        now = time.time()
        name = layout.events_file_name(now, _safe_host(), os.getpid(), next(_file_counter),
                                       self.rank, filename_suffix)
        self.path = os.path.join(self.run_dir, name)
        self._file = open(self.path, "xb")
        self._lock = threading.Lock()
        self._closed = False
        self._last_flush = now
        self._write(event_pb2.Event(wall_time=now, file_version="brain.Event:2"), flush=True)
        with _open_writers_lock:
            _open_writers.add(self)

    # -- public API ---------------------------------------------------------------------------

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self.add_scalars({tag: value}, step, wall_time)

    def add_scalars(self, values: dict[str, float], step: int,
                    wall_time: float | None = None) -> None:
        """Several scalars at one step, as one event (they show in TensorBoard's Scalars tab)."""
        summary = summary_pb2.Summary()
        for tag, value in values.items():
            summary.value.add(tag=_check_tag(tag), simple_value=float(value))
        self._write(self._event(summary, step, wall_time), flush=False)

    def add_report(self, report: dict[str, Any], step: int, wall_time: float | None = None) -> None:
        """Store a report (docs/report-schema.md) as the window ending at ``step``."""
        blob, stored = schema.encode_report(report)
        content = schema.plugin_content("report", stored["schema_version"])
        tag = layout.report_tag(_check_step(step), self.rank)
        self._write(self._event(_blob_summary(tag, blob, content), step, wall_time), flush=True)

    def add_json(self, tag: str, obj: Any, step: int, wall_time: float | None = None) -> None:
        """Another gpuprof JSON blob (e.g. "gpuprof/topology"); its latest step is current."""
        if layout.parse_report_tag(tag) is not None:
            raise ValueError(f"{tag!r} is a report tag; use add_report")
        blob = schema.encode_json(obj)
        content = schema.plugin_content("json")
        summary = _blob_summary(_check_tag(tag), blob, content)
        self._write(self._event(summary, step, wall_time), flush=True)

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._flush_locked()
            finally:
                self._file.close()
        with _open_writers_lock:
            _open_writers.discard(self)

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _event(summary: summary_pb2.Summary, step: int, wall_time: float | None) -> event_pb2.Event:
        return event_pb2.Event(wall_time=time.time() if wall_time is None else float(wall_time),
                               step=_check_step(step), summary=summary)

    def _write(self, event: event_pb2.Event, *, flush: bool) -> None:
        data = event.SerializeToString()
        with self._lock:
            if self._closed:
                raise ValueError(f"EventWriter for {self.run_dir} is closed")
            self._file.write(frame(data))
            if flush or time.time() - self._last_flush >= FLUSH_SECS:
                self._flush_locked()

    def _flush_locked(self) -> None:
        self._file.flush()
        self._last_flush = time.time()


def _check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"tag must be a non-empty string, got {tag!r}")
    return tag


def _check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return step


def _blob_summary(tag: str, blob: bytes, content: bytes) -> summary_pb2.Summary:
    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=layout.PLUGIN_NAME, content=content),
        # Without a data class, both TensorBoard loaders silently drop plugin summaries.
        data_class=summary_pb2.DATA_CLASS_BLOB_SEQUENCE,
    )
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]),
        string_val=[blob],
    )
    summary = summary_pb2.Summary()
    summary.value.add(tag=tag, metadata=metadata, tensor=tensor)
    return summary


def traces_dir(run_dir: str | os.PathLike[str], step: int, rank: int | None = None) -> str:
    return layout.trace_dir(run_dir, _check_step(step), rank)


def save_raw_trace(run_dir: str | os.PathLike[str], trace_path: str | os.PathLike[str], step: int,
                   *, rank: int | None = None) -> str:
    """Copy a window's raw trace to ``<run>/plugins/gpuprof/traces/step_<step>[.rank<r>]/``.

    Returns the copy's path. The copy is written under a temporary name and renamed, so a
    reader never sees half a file. ``rank``: as the caller decided it (None and 0: no suffix).
    """
    trace_path = os.fspath(trace_path)
    if not os.path.isfile(trace_path):
        raise TraceReadError(trace_path, "no such file")
    dest_dir = traces_dir(run_dir, step, rank)
    os.makedirs(dest_dir, exist_ok=True)
    name = layout.stored_trace_name(os.path.basename(trace_path))
    dest = os.path.join(dest_dir, name)
    tmp = f"{dest}.{os.getpid()}.tmp"
    try:
        shutil.copyfile(trace_path, tmp)
        os.replace(tmp, dest)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        problem = f"cannot copy into {dest_dir}: {e.strerror or e}"
        raise TraceReadError(trace_path, problem) from None
    return dest


def _write_atomically(dest: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_context(run_dir: str | os.PathLike[str], step: int, context: dict[str, Any], *,
                 rank: int | None = None) -> str:
    """Write what the window's analysis knew beside its raw trace (``context.json``), so the
    run can be re-analysed later with all of it (tb_gpuprof/pipeline.py); its path."""
    dest = os.path.join(traces_dir(run_dir, step, rank), layout.CONTEXT_FILE_NAME)
    try:
        # in the order it was recorded: a re-analysis then rebuilds the report byte for byte
        _write_atomically(dest, json.dumps(context, default=str).encode())
    except OSError as e:
        raise TraceReadError(dest, f"cannot write the analysis context: {e.strerror or e}") \
            from None
    return dest


def save_oom_report(run_dir: str | os.PathLike[str], report: dict[str, Any], *,
                    rank: int | None = None) -> str:
    """Write the out-of-memory report (tb_gpuprof/analysis/oom.py) into the run, atomically;
    its path."""
    dest = layout.oom_report_path(run_dir, rank)
    _write_atomically(dest, json.dumps(report, indent=1, default=str).encode())
    return dest


def save_refreshed_report(run_dir: str | os.PathLike[str], step: int, rank: int | None,
                          entry: dict[str, Any]) -> bool:
    """Cache a re-analysed report beside the run; False when the run is not writable (the
    caller keeps it in memory: a read-only log directory is no error)."""
    dest = layout.refreshed_report_path(run_dir, _check_step(step), rank)
    try:
        _write_atomically(dest, gzip.compress(json.dumps(entry).encode(), 6, mtime=0))
    except OSError:
        return False
    return True


def replace_stored_report(events_path: str, step: int, report: dict[str, Any]) -> None:
    """Rewrite one events file with the report of window ``step`` replaced by ``report``
    (every other record, and the report's wall time and tag, as they were). For maintainers'
    rebuilds of shipped runs (tools/rebuild_samples.py); the hooks only ever append."""
    from .reader import iter_records  # the reader's framing; no cycle at import time

    blob, stored = schema.encode_report(report)
    content = schema.plugin_content("report", stored["schema_version"])
    out, replaced = [], 0
    for data in iter_records(events_path):
        event = event_pb2.Event.FromString(data)
        for value in event.summary.value:
            parsed = layout.parse_report_tag(value.tag)
            if parsed is not None and parsed[0] == step:
                value.tensor.string_val[0] = blob
                value.metadata.plugin_data.content = content
                replaced += 1
        out.append(frame(event.SerializeToString()))
    if replaced != 1:
        raise ValueError(f"{events_path}: {replaced} reports at step {step}, expected one")
    _write_atomically(events_path, b"".join(out))


def gzip_copy(src: str, dest: str) -> str:
    """``dest``: a fast-compressed copy of ``src`` (raw traces are large, and stored once)."""
    with open(src, "rb") as fin, gzip.open(dest, "wb", compresslevel=1) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    return dest
