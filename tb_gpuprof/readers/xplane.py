"""XPlane (``*.xplane.pb``) reader: TensorFlow, Keras (TF and JAX backends) and JAX profiles.

Decodes the XSpace protobuf (tsl/profiler/protobuf/xplane.proto) with :mod:`.protowire`, never
TensorFlow or generated code. Only the planes we use are decoded; lines we do not use are skipped
by length. What comes out:

* ``/device:GPU:N`` planes -> device N. ``Stream #S(...)`` lines -> kernels, memcpy, memset on
  stream S with ``kernel_details`` (or separate grid/block stats), ``memcpy_details`` /
  ``Memset_details`` bytes, ``correlation_id`` and op names from ``hlo_op`` / ``tf_op`` / JAX's
  ``name`` stat. Derived lines ("XLA Ops", "TensorFlow Ops", ...) are never counted as activity;
  op lines name kernels that carry no op stat, a "Steps" line gives on-GPU step ranges.
* ``/host:CPU`` lines (one per thread) -> STEP annotations (a ``step_num`` stat, as written by
  ``tf.profiler.experimental.Trace(..., step_num=)``, Keras' "Profiled batch", JAX's
  ``StepTraceAnnotation``; names like ``ProfilerStep#N``; else ``train_function``-style step
  functions), TF ops (``name:Type`` events) as CpuOp named ``name:Type``, CUDA API events and
  events with a ``correlation_id`` as RuntimeCall, other TraceMe ranges as USER annotations.
  ``/host:CUPTI`` lines (older TF) -> RuntimeCall. Python-tracer frames (``$file:line fn``)
  and zero-length instants are dropped.
* A CPU-only TensorFlow profile (no GPU planes) gives a Profile with no GPU activity and no
  devices, but host data: STEP annotations, CpuOps for the executed TF ops, USER ranges.
* Metadata: ``hostnames``, XSpace errors/warnings, ``/host:metadata`` stats (JAX writes its
  version and CUDA versions there: ``framework``, ``framework_version``, ``cuda_runtime``,
  ``cuda_driver``), ``time_origin_ns`` / ``profile_duration_us`` from "Task Environment".
* Times: ``line.timestamp_ns + event.offset_ps``; every plane shares one base (the profiler
  normalizes to the profile start), so microseconds here are one clock for the whole profile.
"""

from __future__ import annotations

import bisect
import operator
import os
import re
from typing import Any

from ..errors import EmptyProfileError, TraceReadError, UnknownFormatError
from ..model import (
    KERNEL,
    MEMCPY,
    MEMSET,
    STEP,
    USER,
    Annotation,
    CpuOp,
    DeviceInfo,
    GpuActivity,
    Profile,
    RuntimeCall,
)
from .protowire import (
    LEN,
    VARINT,
    ProtoDecodeError,
    TruncatedError,
    WireTypeError,
    decode_str,
    expect_wire,
    iter_fields,
    read_double,
    read_length,
    read_tag,
    read_varint,
    skip_value,
    to_int64,
)

GPU_PLANE_PREFIX = "/device:GPU:"
HOST_PLANE = "/host:CPU"
CUPTI_PLANE = "/host:CUPTI"
METADATA_PLANE = "/host:metadata"
TASK_ENV_PLANE = "Task Environment"
OP_LINES = ("XLA Ops", "TensorFlow Ops", "Framework Ops")
STEP_LINE = "Steps"
# Step functions used as iteration markers only when no explicit step marker exists; the
# first name present wins so nested ones (train_function > one_step_on_iterator) never double.
# Host events that only TensorFlow writes: "name:Type" events count as TF ops only next to them.
TF_HOST_MARKERS = frozenset({"EagerExecute", "EagerKernelExecute", "ExecutorState::Process",
                             "FunctionRun", "SessionRun", "TFE_Py_FastPathExecute_C"})
WEAK_STEP_NAMES = ("train_function", "train_step", "StepMarker", "TraceContext",
                   "one_step_on_iterator", "multi_step_on_iterator")

_STREAM_LINE = re.compile(r"^Stream #(\d+)")
_STEP_NAME = re.compile(r"^(?:ProfilerStep#|Profiled batch\s*)(\d+)$")
_STEP_IN_NAME = re.compile(r"#step_num=(\d+)")  # an un-parsed TraceMe "name#step_num=3#"
_TF_OP = re.compile(r"^[^\s:]+:([A-Za-z_][\w]*)$")  # "model/conv2d/Conv2D:Conv2D"
_CUDA_API = re.compile(r"^cu(?:da)?[A-Z]\w*$")  # cudaLaunchKernel, cuLaunchKernel_ptsz, ...
_INFERENCE_FN = re.compile(r"^__inference_(\w+?)_\d+$")
_DETAIL_INT = re.compile(r"(?:num_bytes|size|bytes):(\d+)")
_HLO_OPCODE = re.compile(r"=\s*\S+\s+([\w-]+)\(")  # "%x = f32[2]{0} convolution(...)"
_HLO_SUFFIX = re.compile(r"[._]\d+$")
_DIM = re.compile(r"^(\d+),(\d+),(\d+)$")
_U64 = 1 << 64
_I64_SIGN = 1 << 63
# stats the reader looks at; all others are skipped by length
GPU_STATS = frozenset({
    "correlation_id", "kernel_details", "memcpy_details", "Memset_details", "memset_details",
    "memalloc_details", "MemFree_details", "memfree_details", "MemoryResidency_details",
    "tf_op", "hlo_op", "hlo_category", "long_name", "name", "theoretical_occupancy_pct",
    "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "grid_dim_x",
    "grid_dim_y", "grid_dim_z", "block_dim_x", "block_dim_y", "block_dim_z",
    "registers_per_thread", "regs", "static_shared_memory_usage", "static_shared",
    "dynamic_shared_memory_usage", "dynamic_shared", "occ_pct",
})
HOST_STATS = frozenset({"step_num", "correlation_id"})
_NOT_GPU_WORK = frozenset({"memalloc_details", "MemFree_details", "memfree_details",
                           "MemoryResidency_details"})
_MEMCPY_PREFIXES = ("Memcpy", "memcpy")
_MEMSET_PREFIXES = ("Memset", "memset")
_NO_MD = ("", "", 0, 0)

# host event categories (cached per event-metadata id)
_SKIP, _USER, _CPU_OP, _RUNTIME, _STEP_NAMED, _WEAK = range(6)


def _truncated(path: str, e: ProtoDecodeError) -> TraceReadError:
    return TraceReadError(path, f"truncated or corrupt XPlane protobuf ({e})")


def _not_xspace(path: str, detail: str) -> UnknownFormatError:
    return UnknownFormatError(path, f"not an XPlane (XSpace) protobuf: {detail}")


class _Plane:
    __slots__ = ("event_md", "id", "lines", "name", "stat_md", "stats")

    def __init__(self) -> None:
        self.id = 0
        self.name = ""
        self.lines: list[tuple[int, int]] = []
        self.event_md: list[tuple[int, int]] = []
        self.stat_md: list[tuple[int, int]] = []
        self.stats: list[tuple[int, int]] = []


def _scan_plane(buf: bytes, start: int, end: int) -> _Plane:
    p = _Plane()
    for field, wire, a, b in iter_fields(buf, start, end):
        if field == 1:
            expect_wire(field, wire, VARINT, "XPlane")
            p.id = to_int64(a)
        elif field == 2:
            expect_wire(field, wire, LEN, "XPlane")
            p.name = decode_str(buf, a, b)
        elif 3 <= field <= 6:
            expect_wire(field, wire, LEN, "XPlane")
            (p.lines, p.event_md, p.stat_md, p.stats)[field - 3].append((a, b))
    return p


def _map_entries(buf: bytes, entries: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """map<int64, Msg> entries -> (key, value_start, value_end)."""
    out = []
    for start, end in entries:
        key, vs, ve = 0, start, start
        for field, wire, a, b in iter_fields(buf, start, end):
            if field == 1 and wire == VARINT:
                key = to_int64(a)
            elif field == 2 and wire == LEN:
                vs, ve = a, b
        out.append((key, vs, ve))
    return out


def _stat_names(buf: bytes, plane: _Plane) -> dict[int, str]:
    names: dict[int, str] = {}
    for key, vs, ve in _map_entries(buf, plane.stat_md):
        for field, wire, a, b in iter_fields(buf, vs, ve):
            if field == 2 and wire == LEN:
                names[key] = decode_str(buf, a, b)
    return names


def _event_metadata(buf: bytes, plane: _Plane) -> dict[int, tuple[str, str, int, int]]:
    """id -> (name, display_name, start, end of the XEventMetadata message for its stats)."""
    md: dict[int, tuple[str, str, int, int]] = {}
    for key, vs, ve in _map_entries(buf, plane.event_md):
        name = display = ""
        for field, wire, a, b in iter_fields(buf, vs, ve):
            if field == 2 and wire == LEN:
                name = decode_str(buf, a, b)
            elif field == 4 and wire == LEN:
                display = decode_str(buf, a, b)
        md[key] = (name, display, vs, ve)
    return md


def _stat_value(buf: bytes, q: int, e: int, names: dict[int, str]) -> Any:
    """The value of an XStat whose fields from ``q`` to ``e`` follow its metadata_id."""
    val: Any = None
    while q < e:
        k = buf[q]
        q += 1
        if k == 0x38:  # ref_value: the name of another stat metadata entry
            v, q = read_varint(buf, q, e)
            val = names.get(v, "")
        elif k == 0x18:  # uint64_value
            val, q = read_varint(buf, q, e)
        elif k == 0x20:  # int64_value
            v, q = read_varint(buf, q, e)
            val = v - _U64 if v >= _I64_SIGN else v
        elif k == 0x11:  # double_value
            val, q = read_double(buf, q, e)
        elif k == 0x2A:  # str_value
            a, q = read_length(buf, q, e)
            val = decode_str(buf, a, q)
        elif k == 0x32:  # bytes_value
            a, q = read_length(buf, q, e)
            val = bytes(buf[a:q])
        else:
            _f, wire, q = read_tag(buf, q - 1, e)
            q = skip_value(buf, wire, q, e)
    return val


def _decode_stat(buf: bytes, s: int, e: int, names: dict[int, str]) -> tuple[str, Any]:
    """One XStat -> (stat name, value); ref values resolve to the referenced name."""
    mid = 0
    val: Any = None
    q = s
    while q < e:  # metadata_id may come anywhere; every other field is the value
        if buf[q] == 0x08:
            mid, q = read_varint(buf, q + 1, e)
            continue
        _f, wire, nq = read_tag(buf, q, e)
        nq = skip_value(buf, wire, nq, e)
        val = _stat_value(buf, q, nq, names)
        q = nq
    return names.get(mid, f"#{mid}"), val


def _decode_stats(buf: bytes, s: int, e: int, stats_field: int, names: dict[int, str],
                  wanted: dict[int, str] | None = None) -> dict[str, Any]:
    """XStat sub-messages (field ``stats_field``) of the message in [s, e) -> {name: value}.

    With ``wanted`` (metadata id -> name), only those stats are decoded: the others are
    skipped by length after reading their id. Ref values (the common case for strings such
    as kernel_details or hlo_op) are decoded inline.
    """
    out: dict[str, Any] = {}
    tag = (stats_field << 3) | LEN
    p = s
    while p < e:
        if buf[p] != tag:
            _f, wire, p = read_tag(buf, p, e)
            p = skip_value(buf, wire, p, e)
            continue
        p += 1
        if p < e and buf[p] < 0x80:  # stats are short: a one-byte length
            a = p + 1
            p = a + buf[p]
            if p > e:
                raise TruncatedError(f"XStat at offset {a} runs past the end of its event")
        else:
            a, p = read_length(buf, p, e)
        if a < p and buf[a] == 0x08:  # metadata_id first, as every writer serializes it
            q = a + 1
            if q < p and buf[q] < 0x80:
                mid = buf[q]
                q += 1
            else:
                mid, q = read_varint(buf, q, p)
            name = names.get(mid, f"#{mid}") if wanted is None else wanted.get(mid)
            if name is None:
                continue
            if q + 2 == p and buf[q] == 0x38 and buf[q + 1] < 0x80:  # one-byte ref
                out[name] = names.get(buf[q + 1], "")
            elif q + 3 == p and buf[q] == 0x38 and buf[q + 2] < 0x80:  # two-byte ref
                out[name] = names.get((buf[q + 1] & 0x7F) | (buf[q + 2] << 7), "")
            else:
                out[name] = _stat_value(buf, q, p, names)
        else:
            name, val = _decode_stat(buf, a, p, names)
            if wanted is None or name in wanted.values():
                out[name] = val
    return out


def _line_header(buf: bytes, start: int, end: int) -> tuple[int, str, int]:
    """(id, name, timestamp_ns) of an XLine, skipping its events by length."""
    lid, name, display, ts = 0, "", "", 0
    for field, wire, a, b in iter_fields(buf, start, end):
        if field == 1 and wire == VARINT:
            lid = to_int64(a)
        elif field == 2 and wire == LEN:
            name = decode_str(buf, a, b)
        elif field == 11 and wire == LEN:
            display = decode_str(buf, a, b)
        elif field == 3 and wire == VARINT:
            ts = to_int64(a)
    return lid, name or display, ts


def _events(buf: bytes, start: int, end: int):
    """Yield (metadata_id, offset_ps, duration_ps, stats_start, ev_end) per timed event.

    The hot loop: one-byte tags and short lengths are handled inline. Writers serialize
    fields in number order, so once id, offset and duration are seen the rest of the event
    is its stats: ``stats_start`` is where they begin (== ``ev_end`` when there are none).
    Aggregated events (``num_occurrences`` instead of ``offset_ps``) have no place on a
    timeline and are skipped.
    """
    pos = start
    while pos < end:
        if buf[pos] != 0x22:  # anything but field 4 (events): skip it
            _f, wire, pos = read_tag(buf, pos, end)
            pos = skip_value(buf, wire, pos, end)
            continue
        pos += 1
        if pos + 1 < end and buf[pos] < 0x80:
            es = pos + 1
            ee = es + buf[pos]
        elif pos + 2 < end and buf[pos + 1] < 0x80:
            es = pos + 2
            ee = es + ((buf[pos] & 0x7F) | (buf[pos + 1] << 7))
        else:
            es, ee = read_length(buf, pos, end)
        if ee > end:
            raise TruncatedError(f"XEvent at offset {es} runs past the end of its line")
        pos = ee
        mid = off = dur = 0
        seen = 0  # bit 1 id, 2 offset, 4 duration
        stats_at = -1
        p = es
        while p < ee:
            k = buf[p]
            if k == 0x22:
                if stats_at < 0:
                    stats_at = p
                if seen == 7:
                    break
                p = read_length(buf, p + 1, ee)[1]
                continue
            p += 1
            if k == 0x08:
                if p < ee and buf[p] < 0x80:
                    mid = buf[p]
                    p += 1
                else:
                    mid, p = read_varint(buf, p, ee)
                seen |= 1
            elif k == 0x10:
                off, p = read_varint(buf, p, ee)
                seen |= 2
            elif k == 0x18:
                dur, p = read_varint(buf, p, ee)
                seen |= 4
            else:
                _f, wire, p = read_tag(buf, p - 1, ee)
                p = skip_value(buf, wire, p, ee)
        if seen & 2:
            if off >= _I64_SIGN:
                off -= _U64
            if dur >= _I64_SIGN:
                dur = 0
            yield mid, off, dur, (stats_at if stats_at >= 0 else ee), ee


def _dims(v: Any) -> tuple[int, int, int] | None:
    m = _DIM.match(str(v).strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


_KernelLaunch = tuple  # (grid, block, registers, shared_mem, occupancy)


def parse_kernel_details(details: str) -> _KernelLaunch:
    """Parse a ``kernel_details`` stat into (grid, block, registers, shared_mem, occupancy).

    Format: ``regs:168 static_shared:0 dynamic_shared:231424 grid:15,8,1 block:384,1,1
    occ_pct:18.75`` (older TF versions omit ``occ_pct``).
    """
    kv = dict(part.split(":", 1) for part in details.split() if ":" in part)
    regs = kv.get("regs")
    static = kv.get("static_shared")
    dynamic = kv.get("dynamic_shared")
    shared = None
    if static is not None or dynamic is not None:
        try:
            shared = int(static or 0) + int(dynamic or 0)
        except ValueError:
            shared = None
    occ = kv.get("occ_pct")
    try:
        occ_f = float(occ) if occ is not None else None
    except ValueError:
        occ_f = None
    return (_dims(kv.get("grid", "")), _dims(kv.get("block", "")),
            int(regs) if regs and regs.isdigit() else None, shared, occ_f)


def _separate_launch_stats(st: dict[str, Any]) -> _KernelLaunch:
    """Launch parameters written as one stat each (some XLA/XProf versions)."""
    def num(*keys: str) -> Any:
        for k in keys:
            if isinstance(st.get(k), int | float):
                return st[k]
        return None

    def dims(prefix: str) -> tuple[int, int, int] | None:
        x = num(f"{prefix}_x", f"{prefix}_dim_x")
        if not x:
            return None
        return (int(x), int(num(f"{prefix}_y", f"{prefix}_dim_y") or 1),
                int(num(f"{prefix}_z", f"{prefix}_dim_z") or 1))

    grid, block = dims("grid"), dims("block")
    static = num("static_shared_memory_usage", "static_shared")
    dynamic = num("dynamic_shared_memory_usage", "dynamic_shared")
    shared = None if static is None and dynamic is None else int(static or 0) + int(dynamic or 0)
    return grid, block, num("registers_per_thread", "regs"), shared, num("occ_pct")


def _op_of(st: dict[str, Any]) -> tuple[str | None, str | None]:
    """(op, op_type) from a device event's stats: hlo_op / tf_op / JAX source name."""
    hlo_op = st.get("hlo_op") or None
    tf_name = tf_type = None
    tf_op = st.get("tf_op")
    if isinstance(tf_op, str) and tf_op:
        # nested ScopedAnnotations arrive joined by "::"; the innermost op is the last part
        tf_op = tf_op.rsplit("::", 1)[-1]
        name, sep, typ = tf_op.rpartition(":")
        if sep and typ:  # "XlaModule:" (JAX) names no framework op
            tf_name, tf_type = name, typ
        elif not sep:
            tf_name = tf_op
    # JAX's "name" is the HLO op_name path "jit(f)/.../conv_general_dilated" (or a bare
    # variable name, which says nothing about the op)
    src = st.get("name")
    src_type = src.rsplit("/", 1)[-1] if isinstance(src, str) and "/" in src else None
    op_type = tf_type or src_type or st.get("hlo_category") or None
    if op_type is None:
        long_name = st.get("long_name")
        m = _HLO_OPCODE.search(long_name) if isinstance(long_name, str) else None
        if m:
            op_type = m[1]
        elif hlo_op:
            op_type = _HLO_SUFFIX.sub("", hlo_op)
    return hlo_op or tf_name or (src if src_type else None), op_type


def _device_info(dev: int, st: dict[str, Any]) -> DeviceInfo:
    def as_int(k: str) -> int | None:
        v = st.get(k)
        return int(v) if isinstance(v, int | float) else None

    name = st.get("gpu_device_name") or st.get("device_name") or ""
    return DeviceInfo(id=dev, name=str(name), compute_major=as_int("compute_cap_major"),
                      compute_minor=as_int("compute_cap_minor"), num_sms=as_int("core_count"),
                      total_memory=as_int("memory_size"))


class _Reader:
    def __init__(self, path: str, buf: bytes) -> None:
        self.path = path
        self.buf = buf
        self.profile = Profile(source=path, format="xplane")
        self.kd_cache: dict[str, _KernelLaunch] = {}
        self.weak_steps: dict[str, list[Annotation]] = {}
        self.gpu_steps: list[Annotation] = []
        self.skipped_lines: set[str] = set()
        self.named_planes = 0  # once a plane parsed, bad bytes are corruption, not another format

    # -- top level ---------------------------------------------------------------------
    def read(self) -> Profile:
        buf = self.buf
        planes: list[tuple[int, int]] = []
        md = self.profile.metadata
        lists: dict[int, list[str]] = {2: [], 3: [], 4: []}
        for field, wire, a, b in iter_fields(buf, 0, len(buf)):
            if 1 <= field <= 4:
                expect_wire(field, wire, LEN, "XSpace")
                if field == 1:
                    planes.append((a, b))
                else:
                    lists[field].append(decode_str(buf, a, b))
        scanned = []
        for a, b in planes:
            scanned.append(_scan_plane(buf, a, b))
            self.named_planes += bool(scanned[-1].name)
        if not self.named_planes:
            raise _not_xspace(self.path, "it holds no named XPlane planes")
        md["hostnames"] = lists[4]
        if lists[2]:
            md["xspace_errors"] = lists[2]
        if lists[3]:
            md["xspace_warnings"] = lists[3]
        for p in scanned:
            if p.name.startswith(GPU_PLANE_PREFIX):
                self.read_gpu_plane(p)
        for p in scanned:
            if p.name in (HOST_PLANE, CUPTI_PLANE):
                self.read_host_plane(p, cupti=p.name == CUPTI_PLANE)
            elif p.name == METADATA_PLANE:
                self.read_metadata_plane(p)
            elif p.name == TASK_ENV_PLANE:
                st = self.plane_stats(p)
                if isinstance(st.get("profile_start_time"), int):
                    md["time_origin_ns"] = st["profile_start_time"]
                    if isinstance(st.get("profile_stop_time"), int):
                        md["profile_duration_us"] = (
                            st["profile_stop_time"] - st["profile_start_time"]) / 1e3
        self.finish()
        return self.profile

    def plane_stats(self, p: _Plane, names: dict[int, str] | None = None) -> dict[str, Any]:
        names = names if names is not None else _stat_names(self.buf, p)
        return dict(_decode_stat(self.buf, a, b, names) for a, b in p.stats)

    def read_metadata_plane(self, p: _Plane) -> None:
        st = self.plane_stats(p)
        md = self.profile.metadata
        md["host_metadata"] = {k: v for k, v in st.items() if not isinstance(v, bytes)}
        for fw in ("jax", "tensorflow", "tf", "keras"):
            v = st.get(f"{fw}_version")
            if v is not None:
                md["framework"] = "tensorflow" if fw == "tf" else fw
                md["framework_version"] = str(v)
                break
        for key, out in (("cuda_runtime_version", "cuda_runtime"),
                         ("cuda_driver_version", "cuda_driver")):
            v = st.get(key)
            if v is not None and str(v).isdigit():  # CUDA encodes 13.0 as 13000
                n = int(v)
                md[out] = f"{n // 1000}.{(n % 1000) // 10}"

    # -- GPU ---------------------------------------------------------------------------
    def read_gpu_plane(self, p: _Plane) -> None:
        buf = self.buf
        digits = re.match(r"\d+", p.name[len(GPU_PLANE_PREFIX):])
        dev = int(digits[0]) if digits else p.id
        names = _stat_names(buf, p)
        info = _device_info(dev, self.plane_stats(p, names))
        self.profile.devices.append(info)
        emd = _event_metadata(buf, p)
        out = self.profile.gpu
        op_lines: list[tuple[int, int, int]] = []
        first = len(out)
        wanted = {mid: n for mid, n in names.items() if n in GPU_STATS}
        op_cache: dict[tuple, tuple[str | None, str | None]] = {}
        num_sms = info.num_sms
        for ls, le in p.lines:
            _lid, lname, ts_ns = _line_header(buf, ls, le)
            m = _STREAM_LINE.match(lname)
            if m is None:
                if lname in OP_LINES:
                    op_lines.append((ls, le, ts_ns))
                elif lname == STEP_LINE:
                    self.read_gpu_steps(emd, ls, le, ts_ns)
                else:
                    self.skipped_lines.add(lname)
                continue
            stream = int(m[1])
            base_ps = ts_ns * 1000
            for mid, off, dur, ss, ee in _events(buf, ls, le):
                st = _decode_stats(buf, ss, ee, 4, names, wanted) if ss < ee else {}
                act = self.gpu_activity(emd.get(mid, _NO_MD)[0], st, op_cache, num_sms)
                if act is not None:
                    act.start_us, act.dur_us = (base_ps + off) / 1e6, dur / 1e6
                    act.device, act.stream = dev, stream
                    out.append(act)
        if op_lines:
            self.name_kernels_from_op_lines(emd, names, op_lines, out, first)

    def gpu_activity(self, name: str, st: dict[str, Any], op_cache: dict[tuple, Any],
                     num_sms: int | None) -> GpuActivity | None:
        """One device event (its name and wanted stats) as an activity, or None when it is
        no GPU work. Times, device and stream are the caller's to set."""
        details = None
        if "kernel_details" in st:
            kind = KERNEL
        elif "memcpy_details" in st or name.startswith(_MEMCPY_PREFIXES):
            kind, details = MEMCPY, st.get("memcpy_details")
        elif "Memset_details" in st or "memset_details" in st or name.startswith(
                _MEMSET_PREFIXES):
            kind, details = MEMSET, st.get("Memset_details", st.get("memset_details"))
        elif not _NOT_GPU_WORK.isdisjoint(st):
            return None  # memalloc / free / residency records are not GPU work
        else:
            kind = KERNEL
        key = (st.get("hlo_op"), st.get("tf_op"), st.get("name"),
               st.get("hlo_category"), st.get("long_name"))
        ops = op_cache.get(key)
        if ops is None:
            ops = op_cache[key] = _op_of(st)
        corr = st.get("correlation_id")
        grid = block = regs = shared = occ = per_sm = nbytes = None
        if kind == KERNEL:
            kd = st.get("kernel_details")
            if isinstance(kd, str) and kd:
                launch = self.kd_cache.get(kd)
                if launch is None:
                    launch = self.kd_cache[kd] = parse_kernel_details(kd)
            else:
                launch = _separate_launch_stats(st)
            grid, block, regs, shared, occ = launch
            if occ is None:
                t = st.get("theoretical_occupancy_pct")
                occ = float(t) if isinstance(t, int | float) else None
            if grid and num_sms:
                per_sm = grid[0] * grid[1] * grid[2] / num_sms
        elif isinstance(details, str):
            mb = _DETAIL_INT.search(details)
            nbytes = int(mb[1]) if mb else None
        return GpuActivity(
            kind=kind, name=name, start_us=0.0, dur_us=0.0,
            correlation=corr if isinstance(corr, int) else None, grid=grid,
            block=block, registers=regs, shared_mem=shared, blocks_per_sm=per_sm,
            occupancy=occ, bytes=nbytes, op=ops[0], op_type=ops[1])

    def name_kernels_from_op_lines(self, emd, names, op_lines, out, first) -> None:
        """Give kernels without op stats the op of the derived op-line event around them."""
        spans = self.op_line_spans(emd, names, op_lines)
        spans.sort()
        starts = [s[0] for s in spans]
        for act in out[first:]:
            if act.op is not None:
                continue
            i = bisect.bisect_right(starts, act.start_us) - 1
            # innermost enclosing span: walk back a little over spans starting earlier
            stop = max(-1, i - 16)
            while i > stop and spans[i][1] < act.start_us + act.dur_us - 1e-6:
                i -= 1
            if i > stop:
                act.op, act.op_type = spans[i][2], spans[i][3]

    def op_line_spans(self, emd, names, op_lines) -> list[tuple[float, float, str, str | None]]:
        buf = self.buf
        spans = []
        for ls, le, ts_ns in op_lines:
            for mid, off, dur, _ss, _ee in _events(buf, ls, le):
                name, display, ms, me = emd.get(mid, ("", "", 0, 0))
                st = _decode_stats(buf, ms, me, 5, names) if me > ms else {}
                spans.append(_op_span(name, display, st, (ts_ns * 1000 + off) / 1e6, dur / 1e6))
        return spans

    def read_gpu_steps(self, emd, ls: int, le: int, ts_ns: int) -> None:
        for mid, off, dur, _ss, _ee in _events(self.buf, ls, le):
            name = emd.get(mid, ("",))[0]
            self.gpu_steps.append(Annotation(
                name=name, start_us=(ts_ns * 1000 + off) / 1e6, dur_us=dur / 1e6, kind=STEP,
                on_gpu=True, step=int(name) if name.isdigit() else None))

    # -- host --------------------------------------------------------------------------
    def read_host_plane(self, p: _Plane, cupti: bool) -> None:
        buf = self.buf
        prof = self.profile
        names = _stat_names(buf, p)
        emd = _event_metadata(buf, p)
        cats: dict[int, tuple[int, str, int | None]] = {}
        is_tf = any(md[0] in TF_HOST_MARKERS for md in emd.values())
        wanted = {mid: n for mid, n in names.items() if n in HOST_STATS}
        if is_tf:
            prof.metadata.setdefault("framework", "tensorflow")
        for ls, le in p.lines:
            tid, _lname, ts_ns = _line_header(buf, ls, le)
            base_ps = ts_ns * 1000
            for mid, off, dur, ss, ee in _events(buf, ls, le):
                cat = cats.get(mid)
                if cat is None:
                    md = emd.get(mid)
                    name = (md[0] or md[1]) if md else f"#{mid}"
                    cat = cats[mid] = _classify_host(name, cupti, is_tf)
                if cat[0] == _SKIP:
                    continue
                st = _decode_stats(buf, ss, ee, 4, names, wanted) if ss < ee else None
                self.host_event(cat, (base_ps + off) / 1e6, dur, tid, st)

    def host_event(self, cat: tuple[int, str, int | None], start: float, dur: int, tid: int,
                   st: dict[str, Any] | None) -> None:
        """One host event, classified by its name (``cat``) and its wanted stats."""
        prof = self.profile
        kind, name, step = cat
        dur_us = dur / 1e6
        corr = None
        if st:
            sn = st.get("step_num")
            if isinstance(sn, int):
                kind, step = _STEP_NAMED, sn
            c = st.get("correlation_id")
            if isinstance(c, int) and kind != _STEP_NAMED:
                kind, corr = _RUNTIME, c
        if kind == _RUNTIME:
            prof.runtime.append(RuntimeCall(name, start, dur_us, tid, corr))
        elif kind == _CPU_OP:
            prof.cpu_ops.append(CpuOp(name, start, dur_us, tid))
        elif dur <= 0:
            return  # instants (allocations, threadpool records) are not ranges
        elif kind == _STEP_NAMED:
            prof.annotations.append(Annotation(name, start, dur_us, STEP, False, step))
        elif kind == _WEAK:
            a = Annotation(name, start, dur_us, USER)
            self.weak_steps.setdefault(_weak_key(name), []).append(a)
            prof.annotations.append(a)
        else:
            prof.annotations.append(Annotation(name, start, dur_us, USER))

    def finish(self) -> None:
        prof = self.profile
        has_steps = STEP in map(_KIND, prof.annotations)  # a C loop: ~300k annotations
        if not has_steps:
            for key in WEAK_STEP_NAMES:
                if key in self.weak_steps:
                    for a in self.weak_steps[key]:
                        a.kind = STEP
                    prof.metadata["step_marker"] = key
                    has_steps = True
                    break
        if self.gpu_steps and not has_steps:
            prof.annotations.extend(self.gpu_steps)
        if self.skipped_lines:
            prof.metadata["skipped_gpu_lines"] = sorted(self.skipped_lines)
        for seq in (prof.gpu, prof.cpu_ops, prof.runtime, prof.annotations):
            seq.sort(key=_START)  # stable: events that start together keep their order
        if not (prof.gpu or prof.cpu_ops or prof.runtime or prof.annotations):
            raise EmptyProfileError(self.path, "XPlane holds no GPU or host activity")


_START = operator.attrgetter("start_us")
_KIND = operator.attrgetter("kind")


def _op_span(name: str, display: str, st: dict[str, Any], start: float,
             dur_us: float) -> tuple[float, float, str, str | None]:
    """(start, end, op, op type) of an op-line event ("XLA Ops", "TensorFlow Ops", ...)."""
    op, op_type = _op_of({"tf_op": name, **st}) if ":" in name else (
        name, st.get("hlo_category") or _HLO_SUFFIX.sub("", display or name))
    return start, start + dur_us, op or name, op_type


def _weak_key(name: str) -> str:
    m = _INFERENCE_FN.match(name)
    return m[1] if m else name


def _classify_host(name: str, cupti: bool, is_tf: bool) -> tuple[int, str, int | None]:
    """(category, name, step number) of a host event name; cached per metadata id."""
    if not name or name.startswith("$"):  # python tracer frames: "$file.py:12 fn"
        return _SKIP, name, None
    if cupti or _CUDA_API.match(name):
        return _RUNTIME, name, None
    m = _STEP_NAME.match(name) or _STEP_IN_NAME.search(name)
    if m:
        return _STEP_NAMED, name.split("#step_num=")[0].rstrip("#"), int(m[1])
    if _weak_key(name) in WEAK_STEP_NAMES:
        return _WEAK, name, None
    if is_tf and _TF_OP.match(name):
        return _CPU_OP, name, None
    return _USER, name, None


def read_xplane(path: str | os.PathLike[str], decoder: str = "upb") -> Profile:
    """Read an ``*.xplane.pb`` file into the normalized model; raise TraceReadError on bad input.

    ``decoder``: "upb" (protobuf's C decoder, :mod:`.xplane_upb`) or "wire" (the pure-Python
    decoder in this module; the reference the upb path is tested against).
    """
    path = os.fspath(path)
    if decoder == "upb":
        from .xplane_upb import read_file

        return read_file(path)
    return read_buffer(path, read_bytes(path))


def read_bytes(path: str) -> bytes:
    """The file's bytes; a missing, unreadable or empty file is a TraceReadError."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except FileNotFoundError:
        raise TraceReadError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceReadError(path, "is a directory, not a trace file") from None
    except OSError as e:
        raise TraceReadError(path, f"cannot read: {e.strerror or e}") from None
    if not buf:
        raise TraceReadError(path, "empty file")
    return buf


def read_buffer(path: str, buf: bytes) -> Profile:
    """The wire decoder on a file's bytes."""
    reader = _Reader(path, buf)
    try:
        return reader.read()
    except WireTypeError as e:
        if reader.named_planes:
            raise _truncated(path, e) from None
        raise _not_xspace(path, str(e)) from None
    except ProtoDecodeError as e:
        raise _truncated(path, e) from None


__all__ = ["parse_kernel_details", "read_xplane"]
