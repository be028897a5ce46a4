"""Nsight Systems SQLite export (``nsys export --type sqlite``) -> :class:`Profile`.

Tables and columns follow NVIDIA's documented export schema ("SQLite Export Schema Reference"):
``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` / ``_RUNTIME``, ``NVTX_EVENTS``,
``StringIds`` (names are ids into it), ``TARGET_INFO_GPU`` and ``TARGET_INFO_CUDA_DEVICE``.
Tables are created lazily by nsys and columns changed across versions, so every table and every
column is optional: we ask SQLite what exists and select only that. Times are nanoseconds in
the file and microseconds in the model (same clock, the trace's).
"""

from __future__ import annotations

import os
import re
import sqlite3
import urllib.parse
from operator import attrgetter
from typing import Any

from ..errors import EmptyProfileError, TraceReadError, UnknownFormatError
from ..model import (
    KERNEL,
    MEMCPY,
    MEMSET,
    STEP,
    USER,
    Annotation,
    DeviceInfo,
    GpuActivity,
    Profile,
    RuntimeCall,
)
from .kineto import classify_annotation

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
SQLITE_CACHE_KIB = 8 << 10  # SQLite's page cache for the export (its default is 2 MiB)
ACTIVITY_TABLES = (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, RUNTIME_TABLE, NVTX_TABLE)

NVTX_PUSH_POP_RANGE = 59  # ENUM_NSYS_EVENT_TYPE
NVTX_START_END_RANGE = 60

# ENUM_CUDA_MEMCPY_OPER ids -> Kineto-style direction names ("Memcpy HtoD (Host -> Device)").
MEMCPY_KINDS = {
    0: ("Unknown", "Unknown"), 1: ("HtoD", "Host -> Device"), 2: ("DtoH", "Device -> Host"),
    3: ("HtoA", "Host -> Array"), 4: ("AtoH", "Array -> Host"), 5: ("AtoA", "Array -> Array"),
    6: ("AtoD", "Array -> Device"), 7: ("DtoA", "Device -> Array"),
    8: ("DtoD", "Device -> Device"), 9: ("HtoH", "Host -> Host"), 10: ("PtoP", "Peer -> Peer"),
    11: ("HtoD", "Unified Host -> Device"), 12: ("DtoH", "Unified Device -> Host"),
    13: ("DtoD", "Unified Device -> Device"),
}

# "cudaLaunchKernel_v7000" -> "cudaLaunchKernel": nsys appends the API version to names.
_API_VERSION_SUFFIX = re.compile(r"_v\d+$")
# An NVTX range named for an iteration: "iteration 12", "train_step_7", "Batch#3", "iter=4".
_ITERATION_NAME = re.compile(r"(?i)(?:^|[^a-z])(?:iter(?:ation)?|step|batch)[\s_#:=-]*(\d+)\s*$")


MAX_ROWS = 2_000_000  # rows read by default: their model is about 0.45 GB


def read_nsys(path: str | os.PathLike[str], max_rows: int | None = MAX_ROWS) -> Profile:
    """Read an Nsight Systems SQLite export into the normalized model.

    An export of more than ``max_rows`` activity rows (kernels, copies, API calls, NVTX) is
    read up to a time where about that many rows have started, moved back to the start of
    the last NVTX iteration range before it, so the window holds whole iterations; memory is
    then bounded by ``max_rows``, not by the file. ``metadata["read_window"]`` says so.
    ``max_rows=None`` reads everything.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise TraceReadError(path, "no such file" if not os.path.exists(path)
                             else "is a directory, not a trace file")
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")  # pages in memory, bounded
    except sqlite3.Error as e:
        raise TraceReadError(path, f"cannot open as SQLite: {e}") from None
    try:
        return _read(conn, path, max_rows)
    except sqlite3.DatabaseError as e:
        raise TraceReadError(path, f"not a readable SQLite database: {e}") from None
    finally:
        conn.close()


def _read(conn: sqlite3.Connection, path: str, max_rows: int | None) -> Profile:
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables.intersection(ACTIVITY_TABLES):
        raise UnknownFormatError(
            path, "SQLite database but not an Nsight Systems export (no CUPTI_ACTIVITY_KIND_* "
                  "or NVTX_EVENTS table; export with `nsys export --type sqlite`)")
    reader = _NsysReader(conn, tables)
    profile = Profile(source=path, format="nsys")
    total = reader.row_estimate()
    if max_rows is not None and total > max_rows:
        reader.end_ns = reader.window_end(max_rows / total)
        if reader.end_ns is not None:
            profile.metadata["read_window"] = {"rows_in_export": total, "max_rows": max_rows,
                                               "end_us": reader.end_ns / 1000.0}
    profile.gpu.extend(reader.kernels())
    profile.gpu.extend(reader.memcpys())
    profile.gpu.extend(reader.memsets())
    profile.runtime.extend(reader.runtime_calls())
    profile.annotations.extend(reader.nvtx_ranges())
    by_start = attrgetter("start_us")
    for items in (profile.gpu, profile.runtime, profile.annotations):
        items.sort(key=by_start)
    profile.devices.extend(reader.devices())
    profile.metadata.update(reader.metadata())
    profile.metadata["events"] = (len(profile.gpu) + len(profile.runtime)
                                  + len(profile.annotations))
    if not (profile.gpu or profile.runtime or profile.annotations):
        raise EmptyProfileError(
            path, "Nsight Systems export holds no CUDA kernels, memory operations, CUDA API "
                  "calls or NVTX ranges (was it captured with `nsys profile -t cuda,nvtx`?)")
    return profile


class _NsysReader:
    def __init__(self, conn: sqlite3.Connection, tables: set[str]) -> None:
        self.conn = conn
        self.tables = tables
        self._strings: dict[int, str] | None = None
        self.end_ns: int | None = None  # read only what starts before this (the window)

    def row_estimate(self) -> int:
        """Activity rows in the export, from each table's rowid range (O(log n), no scan)."""
        total = 0
        for table in ACTIVITY_TABLES:
            if table in self.tables:
                lo, hi = self.conn.execute(f'SELECT MIN(rowid), MAX(rowid) FROM "{table}"'
                                           ).fetchone()
                total += (hi - lo + 1) if lo is not None else 0
        return total

    def window_end(self, fraction: float) -> int | None:
        """The time by which about ``fraction`` of the activity has started: exports are
        written nearly in start order, so the kernel (else API call) at that fraction of the
        table's rows tells it. Moved back to the start of the last iteration range before."""
        table = next((t for t in (KERNEL_TABLE, RUNTIME_TABLE) if "start" in self.columns(t)),
                     None)
        if table is None:
            return None
        lo, hi = self.conn.execute(f'SELECT MIN(rowid), MAX(rowid) FROM "{table}"').fetchone()
        if lo is None:
            return None
        row = self.conn.execute(f'SELECT start FROM "{table}" WHERE rowid >= ? ORDER BY rowid '
                                "LIMIT 1", (lo + int(fraction * (hi - lo)),)).fetchone()
        if row is None or row[0] is None:
            return None
        end = int(row[0])
        starts = [int(a.start_us * 1000) for a in self.nvtx_ranges(before_ns=end)
                  if a.kind == STEP or a.step is not None]
        last = max(starts, default=None)
        return last if last is not None and last > min(starts) else end

    def columns(self, table: str) -> set[str]:
        if table not in self.tables:
            return set()
        return {row[1] for row in self.conn.execute(f'PRAGMA table_info("{table}")')}

    def select(self, table: str, wanted: list[str], where: str = "") -> sqlite3.Cursor:
        """Rows of the wanted columns that exist (missing ones read as NULL), streamed.

        No ORDER BY: on a table of millions of rows SQLite would sort the whole table (in temp
        files) before the first row; exports are written nearly in start order, so sorting the
        model's lists afterwards (Timsort, linear on sorted runs) is far cheaper.
        """
        have = self.columns(table)
        exprs = [f'"{c}"' if c in have else "NULL" for c in wanted]
        if self.end_ns is not None and "start" in have and table in ACTIVITY_TABLES:
            # "+": a scan in file order; an index on start would fetch the rows one by one
            where += (" AND" if where else " WHERE") + f' +"start" < {int(self.end_ns)}'
        sql = f'SELECT {", ".join(exprs)} FROM "{table}"{where}'
        return self.conn.execute(sql)

    @property
    def strings(self) -> dict[int, str]:
        if self._strings is None:
            self._strings = (dict(self.conn.execute('SELECT id, value FROM "StringIds"'))
                             if "StringIds" in self.tables else {})
        return self._strings

    def kernels(self) -> list[GpuActivity]:
        if KERNEL_TABLE not in self.tables:
            return []
        rows = self.select(KERNEL_TABLE, [
            "start", "end", "deviceId", "streamId", "correlationId", "demangledName",
            "shortName", "mangledName", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ",
            "registersPerThread", "staticSharedMemory", "dynamicSharedMemory"])
        strings = self.strings
        names: dict[tuple, str] = {}
        shared_values: dict[Any, Any] = {}  # dims tuples and shared-memory sizes, shared
        out = []
        for (start, end, device, stream, corr, demangled, short, mangled, gx, gy, gz, bx, by, bz,
             regs, static_smem, dyn_smem) in rows:
            key = (demangled, short, mangled)
            name = names.get(key)
            if name is None:
                name = names[key] = (strings.get(demangled) or strings.get(short)
                                     or strings.get(mangled) or f"<kernel {demangled}>")
            shared = None
            if static_smem is not None or dyn_smem is not None:
                shared = (static_smem or 0) + (dyn_smem or 0)
                shared = shared_values.setdefault(shared, shared)
            grid, block = _dim3(gx, gy, gz), _dim3(bx, by, bz)
            out.append(GpuActivity(
                KERNEL, name, start / 1000.0, (end - start) / 1000.0, device or 0, stream or 0,
                corr, None, shared_values.setdefault(grid, grid),
                shared_values.setdefault(block, block), regs, shared))
        return out

    def memcpys(self) -> list[GpuActivity]:
        if MEMCPY_TABLE not in self.tables:
            return []
        rows = self.select(MEMCPY_TABLE, [
            "start", "end", "deviceId", "streamId", "correlationId", "bytes", "copyKind"])
        out = []
        names = {kind: f"Memcpy {short} ({label})" for kind, (short, label) in MEMCPY_KINDS.items()}
        for start, end, device, stream, corr, nbytes, kind in rows:
            act = GpuActivity(MEMCPY, names.get(kind, "Memcpy Unknown (Unknown)"), start / 1000.0,
                              (end - start) / 1000.0, device or 0, stream or 0, corr)
            act.bytes = nbytes
            out.append(act)
        return out

    def memsets(self) -> list[GpuActivity]:
        if MEMSET_TABLE not in self.tables:
            return []
        rows = self.select(MEMSET_TABLE, [
            "start", "end", "deviceId", "streamId", "correlationId", "bytes"])
        out = []
        for start, end, device, stream, corr, nbytes in rows:
            act = GpuActivity(MEMSET, "Memset (Device)", start / 1000.0, (end - start) / 1000.0,
                              device or 0, stream or 0, corr)
            act.bytes = nbytes
            out.append(act)
        return out

    def runtime_calls(self) -> list[RuntimeCall]:
        if RUNTIME_TABLE not in self.tables:
            return []
        rows = self.select(RUNTIME_TABLE, [
            "start", "end", "globalTid", "correlationId", "nameId"])
        strings = self.strings
        names: dict[int, str] = {}
        tids: dict[int | None, int] = {}  # one int object per thread, not one per call
        out = []
        for start, end, global_tid, corr, name_id in rows:
            name = names.get(name_id)
            if name is None:
                raw = strings.get(name_id, f"<api {name_id}>")
                name = names[name_id] = _API_VERSION_SUFFIX.sub("", raw)
            tid = tids.get(global_tid)
            if tid is None:
                tid = tids[global_tid] = _thread_id(global_tid)
            out.append(RuntimeCall(name, start / 1000.0, (end - start) / 1000.0, tid, corr))
        return out

    def nvtx_ranges(self, before_ns: int | None = None) -> list[Annotation]:
        if NVTX_TABLE not in self.tables:
            return []
        have = self.columns(NVTX_TABLE)
        if "end" not in have:
            return []
        where = ' WHERE "end" IS NOT NULL AND "end" >= "start"'
        if before_ns is not None:
            where += f' AND +"start" < {int(before_ns)}'
        elif self.end_ns is not None:  # ranges of the window: those that end inside it
            where += f' AND +"end" <= {int(self.end_ns)}'
        if "eventType" in have:
            where += f' AND "eventType" IN ({NVTX_PUSH_POP_RANGE}, {NVTX_START_END_RANGE})'
        rows = self.select(NVTX_TABLE, ["start", "end", "text", "textId"], where)
        strings = self.strings
        out = []
        for start, end, text, text_id in rows:
            name = text if text else strings.get(text_id, "") if text_id is not None else ""
            if not name:
                continue
            kind, step = nvtx_kind(name)
            out.append(Annotation(name, start / 1000.0, (end - start) / 1000.0, kind, step=step))
        return out

    def devices(self) -> list[DeviceInfo]:
        if "TARGET_INFO_GPU" not in self.tables:
            return []
        rows = self.select("TARGET_INFO_GPU", [
            "id", "name", "computeMajor", "computeMinor", "smCount", "totalMemory"])
        gpus = {row[0]: row for row in rows}
        # The kernels' deviceId is the CUDA ordinal; TARGET_INFO_CUDA_DEVICE maps it to the GPU.
        cuda_to_gpu: dict[int, int] = {}
        if "TARGET_INFO_CUDA_DEVICE" in self.tables:
            maps = self.select("TARGET_INFO_CUDA_DEVICE", ["cudaId", "gpuId"])
            for cuda_id, gpu_id in maps:
                if cuda_id is not None and gpu_id in gpus:
                    cuda_to_gpu.setdefault(cuda_id, gpu_id)
        if not cuda_to_gpu:
            cuda_to_gpu = {gpu_id: gpu_id for gpu_id in gpus if gpu_id is not None}
        out = []
        for cuda_id, gpu_id in sorted(cuda_to_gpu.items()):
            _, name, major, minor, sms, memory = gpus[gpu_id]
            out.append(DeviceInfo(cuda_id, name or "", major, minor, sms, memory))
        return out

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        if "META_DATA_EXPORT" in self.tables:
            rows = dict(self.conn.execute('SELECT name, value FROM "META_DATA_EXPORT"'))
            if "EXPORT_PRODUCT_VERSION" in rows:
                meta["nsys_version"] = rows["EXPORT_PRODUCT_VERSION"]
            if "EXPORT_SCHEMA_VERSION" in rows:
                meta["nsys_schema_version"] = rows["EXPORT_SCHEMA_VERSION"]
        if "utcEpochNs" in self.columns("TARGET_INFO_SESSION_START_TIME"):
            row = self.conn.execute(
                'SELECT utcEpochNs FROM "TARGET_INFO_SESSION_START_TIME"').fetchone()
            if row and row[0] is not None:
                meta["session_start_utc_ns"] = row[0]
        return meta


def nvtx_kind(name: str) -> tuple[str, int | None]:
    """Kind and iteration number of an NVTX range: Kineto's markers, else a numbered name."""
    kind, step = classify_annotation(name)
    if kind == USER and step is None:
        m = _ITERATION_NAME.search(name)
        if m:
            step = int(m.group(1))
    return kind, step


def _dim3(x: int | None, y: int | None, z: int | None) -> tuple[int, int, int] | None:
    if x is None and y is None and z is None:
        return None
    return (x or 1, y or 1, z or 1)


def _thread_id(global_tid: int | None) -> int:
    """nsys serializes (pid, tid) into one integer; the thread id is its low 24 bits."""
    return (global_tid or 0) & 0xFFFFFF
