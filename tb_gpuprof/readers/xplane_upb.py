"""XPlane through protobuf's C decoder (upb) and the project's own schema (xplane_schema.py).

The same reading rules as the wire decoder in xplane.py (its ``_Reader`` methods turn a
device event's stats into an activity, a host event into an op/call/range), with the
protobuf parsing done in C and the events of the hot lines (GPU streams, host threads)
decoded column-wise with numpy (xplane_columns.py). Parsing is lazy where the schema allows
it: an XSpace is parsed into raw planes; only the planes the analysis reads (GPU devices,
host threads, CUPTI, metadata, task environment) are parsed, each into its lines with every
event as bytes; only the events of stream, op, step and host lines are decoded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from ..model import STEP, USER, Annotation, CpuOp, GpuActivity, RuntimeCall
from . import xplane as wire
from .xplane_columns import CORRELATION, READ, EventColumns, IdCodes, IntStats, LaunchGroups
from .xplane_schema import XEvent, XPlaneHeader, XPlaneLines, XSpace

_PLANES_READ = (wire.HOST_PLANE, wire.CUPTI_PLANE, wire.METADATA_PLANE, wire.TASK_ENV_PLANE)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _stat_value(st: Any, names: dict[int, str]) -> Any:
    which = st.WhichOneof("value")
    if which == "ref_value":
        return names.get(st.ref_value, "")
    if which == "str_value":
        return _text(st.str_value)
    if which is None:
        return None
    return getattr(st, which)  # double, uint64, int64 or bytes


def _stats(stats: Any, names: dict[int, str], wanted: dict[int, str] | None) -> dict[str, Any]:
    """Repeated XStat -> {name: value}; with ``wanted`` (id -> name) only those stats."""
    out: dict[str, Any] = {}
    for st in stats:
        mid = st.metadata_id
        name = wanted.get(mid) if wanted is not None else names.get(mid, f"#{mid}")
        if name is not None:
            out[name] = _stat_value(st, names)
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _stat_finder(ids: Any) -> re.Pattern[bytes]:
    """Finds, in an event's bytes, every XStat that may carry one of these metadata ids: a
    stats field (tag 0x22, a length of up to 3 bytes) whose message starts with one of the
    ids, or does not start with its id at all. An event it finds nothing in has none of them;
    a find is checked by decoding the event (it may be a byte pattern inside another value)."""
    ids_alt = b"|".join(re.escape(b"\x08" + _varint(i)) for i in ids)
    first = rb"(?:" + ids_alt + rb"|[^\x08])" if ids_alt else rb"[^\x08]"
    return re.compile(rb"\x22(?:[\x80-\xff]{0,2}[\x00-\x7f])" + first, re.DOTALL)


class _UpbPlane:
    __slots__ = ("emd", "id", "msg", "name", "names")

    def __init__(self, msg: Any) -> None:
        self.msg = msg
        self.id = msg.id
        self.name = _text(msg.name)
        self.names = {e.key: _text(e.value.name) for e in msg.stat_metadata if e.value.name}
        # id -> (name, display name, XEventMetadata), as the wire decoder's table
        self.emd = {e.key: (_text(e.value.name), _text(e.value.display_name), e.value)
                    for e in msg.event_metadata}


class UpbReader(wire._Reader):
    """``wire._Reader`` with every byte-level step done by upb."""

    def read(self) -> Any:
        space = XSpace.FromString(self.buf)
        self.buf = b""  # from here on memory holds the planes, one parsed at a time
        md = self.profile.metadata
        md["hostnames"] = [_text(h) for h in space.hostnames]
        if space.errors:
            md["xspace_errors"] = [_text(h) for h in space.errors]
        if space.warnings:
            md["xspace_warnings"] = [_text(h) for h in space.warnings]
        raws: list[bytes | None] = list(space.planes)
        del space
        gpu, other = [], []
        for i, raw in enumerate(raws):
            assert raw is not None
            name = _text(XPlaneHeader.FromString(raw).name)
            self.named_planes += bool(name)
            if name.startswith(wire.GPU_PLANE_PREFIX):
                gpu.append(i)
            elif name in _PLANES_READ:
                other.append(i)
        if not self.named_planes:
            raise wire._not_xspace(self.path, "it holds no named XPlane planes")
        for i in gpu + other:  # the GPU planes first, as the wire decoder reads them
            plane = _UpbPlane(XPlaneLines.FromString(raws[i]))
            raws[i] = None
            self.read_plane(plane)
        self.finish()
        return self.profile

    def read_plane(self, p: _UpbPlane) -> None:
        if p.name.startswith(wire.GPU_PLANE_PREFIX):
            self.read_gpu_plane(p)
        elif p.name in (wire.HOST_PLANE, wire.CUPTI_PLANE):
            self.read_host_plane(p, cupti=p.name == wire.CUPTI_PLANE)
        elif p.name == wire.METADATA_PLANE:
            self.read_metadata_plane(p)  # type: ignore[arg-type]  # via our plane_stats
        elif p.name == wire.TASK_ENV_PLANE:
            self.read_task_environment(p)

    def read_task_environment(self, p: Any) -> None:
        st = self.plane_stats(p)
        md = self.profile.metadata
        if isinstance(st.get("profile_start_time"), int):
            md["time_origin_ns"] = st["profile_start_time"]
            if isinstance(st.get("profile_stop_time"), int):
                md["profile_duration_us"] = (
                    st["profile_stop_time"] - st["profile_start_time"]) / 1e3

    def plane_stats(self, p: Any, names: dict[int, str] | None = None) -> dict[str, Any]:
        return _stats(p.msg.stats, p.names, None)

    def read_gpu_plane(self, p: Any) -> None:
        digits = re.match(r"\d+", p.name[len(wire.GPU_PLANE_PREFIX):])
        dev = int(digits[0]) if digits else p.id
        info = wire._device_info(dev, self.plane_stats(p))
        self.profile.devices.append(info)
        emd, out = p.emd, self.profile.gpu
        first = len(out)
        streams = _StreamReader(self, p, dev, info.num_sms)
        op_lines = []
        for line in p.msg.lines:
            lname = _text(line.name or line.display_name)
            m = wire._STREAM_LINE.match(lname)
            if m is None:
                if lname in wire.OP_LINES:
                    op_lines.append(_decoded(line))
                elif lname == wire.STEP_LINE:
                    self.read_gpu_steps(emd, _decoded(line))
                else:
                    self.skipped_lines.add(lname)
                continue
            streams.read(line, int(m[1]))
        if op_lines:
            self.name_kernels_from_op_lines(emd, p.names, op_lines, out, first)

    def op_line_spans(self, emd: Any, names: dict[int, str],
                      op_lines: list[Any]) -> list[tuple[float, float, str, str | None]]:
        spans = []
        for line in op_lines:
            base_ps = line.timestamp_ns * 1000
            for ev in line.events:
                if not ev.HasField("offset_ps"):
                    continue
                name, display, emsg = emd.get(ev.metadata_id, ("", "", None))
                st = _stats(emsg.stats, names, None) if emsg is not None else {}
                start = (base_ps + ev.offset_ps) / 1e6
                spans.append(wire._op_span(name, display, st, start,
                                           max(ev.duration_ps, 0) / 1e6))
        return spans

    def read_gpu_steps(self, emd: Any, line: Any) -> None:  # type: ignore[override]
        base_ps = line.timestamp_ns * 1000
        for ev in line.events:
            if not ev.HasField("offset_ps"):
                continue
            name = emd.get(ev.metadata_id, ("",))[0]
            self.gpu_steps.append(Annotation(
                name=name, start_us=(base_ps + ev.offset_ps) / 1e6,
                dur_us=max(ev.duration_ps, 0) / 1e6, kind=STEP, on_gpu=True,
                step=int(name) if name.isdigit() else None))

    def read_host_plane(self, p: Any, cupti: bool) -> None:
        names, emd = p.names, p.emd
        cats: dict[int, tuple[int, str, int | None]] = {}
        is_tf = any(md[0] in wire.TF_HOST_MARKERS for md in emd.values())
        wanted = {mid: n for mid, n in names.items() if n in wire.HOST_STATS}
        if is_tf:
            self.profile.metadata.setdefault("framework", "tensorflow")
        for line in p.msg.lines:
            reader = _HostLine(self, p, line.id, line.timestamp_ns * 1000, cats, cupti, is_tf,
                               wanted)
            # in chunks: the columns of a 400k-event line would double the reader's peak
            for chunk in _chunks(line.events, HOST_CHUNK_EVENTS):
                reader.read(chunk)


HOST_CHUNK_EVENTS = 1 << 13
STREAM_CHUNK_EVENTS = 1 << 13


class _DecodedLine(NamedTuple):
    """A line (op or step line: few events) with each event parsed by upb."""

    timestamp_ns: int
    events: list[Any]


def _decoded(line: Any) -> _DecodedLine:
    return _DecodedLine(line.timestamp_ns, [XEvent.FromString(ev) for ev in line.events])


def _chunks(events: Any, size: int) -> Iterator[list[bytes]]:
    """A line's events (upb's repeated bytes) as lists of at most ``size``."""
    for i in range(0, len(events), size):
        yield events[i:i + size]


def _object_column(values: list[Any]) -> np.ndarray:
    """``values`` as a 1-d object array (np.array would make tuples a second dimension)."""
    column = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        column[i] = v
    return column


def _times_us(base_ps: int, offsets_ps: np.ndarray) -> np.ndarray:
    """``(base_ps + offset) / 1e6`` of every offset, as the per-event code computed it: an
    int64 to float64 conversion then one division, in numpy where the sum fits int64 (else
    with Python ints, as an object column)."""
    bound = 1 << 62
    if not len(offsets_ps) or (abs(base_ps) < bound and -bound < offsets_ps.min()
                               and offsets_ps.max() < bound):
        return (offsets_ps + base_ps) / 1e6
    return _object_column([(base_ps + off) / 1e6 for off in offsets_ps.tolist()])


class _StreamReader:
    """The stream lines of one GPU plane, a chunk of events at a time. The kernels of one op
    repeat their stats but for the correlation id and other per-launch integers, so the
    events of a chunk are grouped by launch site (:class:`LaunchGroups`) and one event per
    launch site, per plane, is decoded into a template activity; every event's activity is
    its template with the event's times and correlation id."""

    def __init__(self, reader: UpbReader, p: _UpbPlane, dev: int, num_sms: int | None) -> None:
        self.reader, self.p, self.dev, self.num_sms = reader, p, dev, num_sms
        self.wanted = {mid: n for mid, n in p.names.items() if n in wire.GPU_STATS}
        self.roles = IdCodes({mid: CORRELATION if n == "correlation_id" else READ
                              for mid, n in self.wanted.items()})
        self.templates: dict[tuple[int, bytes], GpuActivity | None] = {}
        self.op_cache: dict[tuple, Any] = {}
        self.out = reader.profile.gpu

    def read(self, line: Any, stream: int) -> None:
        base_ps = line.timestamp_ns * 1000
        for chunk in _chunks(line.events, STREAM_CHUNK_EVENTS):
            cols = EventColumns(chunk)
            if cols.ok:
                self.read_columns(chunk, cols, base_ps, stream)
            else:  # a layout the column decoder does not take: upb reads each event
                self.read_upb(chunk, base_ps, stream)

    def decode(self, ev: Any) -> GpuActivity | None:
        """The activity of one parsed event (times and stream not set), None if no GPU work."""
        st = _stats(ev.stats, self.p.names, self.wanted)
        name = self.p.emd.get(ev.metadata_id, wire._NO_MD)[0]
        return self.reader.gpu_activity(name, st, self.op_cache, self.num_sms)

    def read_upb(self, events: list[bytes], base_ps: int, stream: int) -> None:
        for ev_bytes in events:
            ev = XEvent.FromString(ev_bytes)
            if not ev.HasField("offset_ps"):
                continue  # aggregated (num_occurrences): no place on a timeline
            act = self.decode(ev)
            if act is not None:
                act.start_us = (base_ps + ev.offset_ps) / 1e6
                act.dur_us = max(ev.duration_ps, 0) / 1e6
                act.device, act.stream = self.dev, stream
                self.out.append(act)

    def templates_of(self, events: list[bytes], groups: LaunchGroups
                     ) -> tuple[np.ndarray, list[GpuActivity | None]]:
        """(template number per event, -1 where none; the templates): one per launch group
        (decoded on its first sight in this plane), one per event that is decoded alone."""
        found = [self.templates.get(key, _UNSEEN) for key in groups.keys]
        for i, (t, key, ev_index) in enumerate(zip(found, groups.keys, groups.first,
                                                   strict=True)):
            if t is _UNSEEN:
                t = found[i] = self.templates[key] = self.decode(
                    XEvent.FromString(events[ev_index]))
        number = groups.group.copy()
        alone = np.flatnonzero(groups.alone & groups.timed)
        number[alone] = np.arange(len(found), len(found) + len(alone))
        found += [self.decode(XEvent.FromString(events[i])) for i in alone.tolist()]
        return number, found

    def read_columns(self, events: list[bytes], cols: EventColumns, base_ps: int,
                     stream: int) -> None:
        groups = LaunchGroups(cols, self.roles)
        number, templates = self.templates_of(events, groups)
        is_work = np.array([t is not None for t in templates] + [False], dtype=bool)
        shown = np.flatnonzero(is_work[number])  # number -1: the False at the end
        numbers = number[shown]
        corrs = groups.correlations(shown)
        for j in np.flatnonzero(groups.alone[shown]).tolist():  # the event's own, decoded
            corrs[j] = templates[numbers[j]].correlation
        corrs = corrs.tolist()
        per_event = [_object_column([getattr(t, f, None) for t in templates])[numbers].tolist()
                     for f in _TEMPLATE_FIELDS]
        kind, name, grid, block, regs, shared, per_sm, occ, nbytes, op, op_type = per_event
        self.out.extend(map(
            GpuActivity, kind, name, _times_us(base_ps, cols.offsets[shown]).tolist(),
            (np.maximum(cols.durations[shown], 0) / 1e6).tolist(), repeat(self.dev),
            repeat(stream), corrs, repeat(None), grid, block, regs, shared, per_sm, occ,
            nbytes, op, op_type))


# what an activity takes from its launch site's template (all but times and ids)
_TEMPLATE_FIELDS = ("kind", "name", "grid", "block", "registers", "shared_mem",
                    "blocks_per_sm", "occupancy", "bytes", "op", "op_type")


_UNSEEN: Any = object()


_IS_RANGE = np.zeros(6, dtype=bool)  # host categories that make annotations (not instants)
_IS_RANGE[[wire._STEP_NAMED, wire._WEAK, wire._USER]] = True
_RANGE_KIND = _object_column([USER, STEP])  # by is-a-step: the model's own str objects


_NONE = np.array(None, dtype=object)


def _present(values: np.ndarray) -> np.ndarray:
    """Where an object column holds a value (not None)."""
    return np.not_equal(values, _NONE)


class _LiveEvents:
    """The columns of a chunk's live host events (named, timed, not skipped): category
    number, name, start and duration (us), each a numpy array to index by output."""

    def __init__(self, cats: list[tuple[int, str, int | None]], categories: np.ndarray,
                 starts_us: np.ndarray, durations_ps: np.ndarray) -> None:
        self.cats, self.categories = cats, categories
        self.names = _object_column([c[1] for c in cats])[categories]  # shared str objects
        self.starts_us, self.durations_ps = starts_us, durations_ps
        self.durations_us = durations_ps / 1e6

    def columns(self, events: np.ndarray) -> tuple[list[str], list[float], list[float]]:
        """(name, start, duration) of ``events``."""
        return (self.names[events].tolist(), self.starts_us[events].tolist(),
                self.durations_us[events].tolist())


class _HostLine:
    """The events of one host line (thread), a chunk at a time."""

    def __init__(self, reader: UpbReader, p: Any, tid: int, base_ps: int, cats: dict,
                 cupti: bool, is_tf: bool, wanted: dict[int, str]) -> None:
        self.reader, self.p, self.tid, self.base_ps = reader, p, tid, base_ps
        self.cats, self.cupti, self.is_tf, self.wanted = cats, cupti, is_tf, wanted
        self.find = _stat_finder(wanted).search

    def category(self, mid: int) -> tuple[int, str, int | None]:
        md = self.p.emd.get(mid)
        name = (md[0] or md[1]) if md else f"#{mid}"
        cat = self.cats[mid] = wire._classify_host(name, self.cupti, self.is_tf)
        return cat

    def read(self, events: list[bytes]) -> None:
        cols = EventColumns(events)
        if not cols.ok:  # a layout the column decoder does not take: upb reads each event
            self.read_upb(events)
            return
        ids, per_event = np.unique(cols.metadata_ids, return_inverse=True)
        cats = [self.cats.get(mid) or self.category(mid) for mid in ids.tolist()]
        kinds = np.array([c[0] for c in cats], np.int64)[per_event]
        live = np.flatnonzero(cols.has_offset & (kinds != wire._SKIP))  # else no range
        steps, corrs = self.stats_of(events, cols, live)
        kinds = kinds[live]
        # an event's own stats decide over its name: a step number makes it a step, else a
        # correlation id a runtime call (host_event's rule)
        kinds[_present(steps)] = wire._STEP_NAMED
        kinds[(kinds != wire._STEP_NAMED) & _present(corrs)] = wire._RUNTIME
        events_of = _LiveEvents(cats, per_event[live], _times_us(self.base_ps, cols.offsets[live]),
                                np.maximum(cols.durations[live], 0))
        prof = self.reader.profile
        runtime = np.flatnonzero(kinds == wire._RUNTIME)
        prof.runtime.extend(map(RuntimeCall, *events_of.columns(runtime), repeat(self.tid),
                                corrs[runtime].tolist()))
        cpu_ops = np.flatnonzero(kinds == wire._CPU_OP)
        prof.cpu_ops.extend(map(CpuOp, *events_of.columns(cpu_ops), repeat(self.tid)))
        ranges = np.flatnonzero(_IS_RANGE[kinds] & (events_of.durations_ps > 0))
        self.add_ranges(ranges, kinds[ranges], events_of, steps)

    def stats_of(self, events: list[bytes], cols: EventColumns, live: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(step_num, correlation_id) of each live event as object columns, None where it
        has none (or one that is not an integer); the stats the columns do not take are
        decoded by upb."""
        stats = IntStats(cols, self.wanted)
        steps, corrs = stats.of("step_num", live), stats.of("correlation_id", live)
        for j in np.flatnonzero(stats.decode[live]).tolist():
            st = _stats(XEvent.FromString(events[live[j]]).stats, self.p.names, self.wanted)
            step, corr = st.get("step_num"), st.get("correlation_id")
            steps[j] = step if isinstance(step, int) else None
            corrs[j] = corr if isinstance(corr, int) else None
        return steps, corrs

    def add_ranges(self, ranges: np.ndarray, kinds: np.ndarray, events_of: _LiveEvents,
                   steps: np.ndarray) -> None:
        """Annotations for the steps and other ranges (not instants) among the events."""
        is_step = kinds == wire._STEP_NAMED
        step_nums = np.full(len(ranges), None, dtype=object)
        at_step = ranges[is_step]
        # a step's number: its step_num stat, else the number in its name
        by_name = _object_column([c[2] for c in events_of.cats])[events_of.categories[at_step]]
        step_nums[is_step] = np.where(_present(steps[at_step]), steps[at_step], by_name)
        annotations = list(map(Annotation, *events_of.columns(ranges),
                               _RANGE_KIND[is_step.view(np.int8)].tolist(), repeat(False),
                               step_nums.tolist()))
        self.reader.profile.annotations.extend(annotations)
        weak_steps = self.reader.weak_steps
        for j in np.flatnonzero(kinds == wire._WEAK).tolist():
            a = annotations[j]
            weak_steps.setdefault(wire._weak_key(a.name), []).append(a)

    def read_upb(self, events: list[bytes]) -> None:
        """Each event decoded by upb (any field order); stats only where ``find`` sees one."""
        names, wanted, find = self.p.names, self.wanted, self.find
        host_event = self.reader.host_event
        annotations = self.reader.profile.annotations
        for ev_bytes in events:
            ev = XEvent.FromString(ev_bytes)
            cat = self.cats.get(ev.metadata_id) or self.category(ev.metadata_id)
            if cat[0] == wire._SKIP:
                continue
            off = ev.offset_ps
            if not off and not ev.HasField("offset_ps"):
                continue  # aggregated: no place on a timeline
            dur = ev.duration_ps
            start = (self.base_ps + off) / 1e6
            if find(ev_bytes) is not None:
                st = _stats(ev.stats, names, wanted) or None
                host_event(cat, start, dur if dur > 0 else 0, self.tid, st)
            elif cat[0] == wire._USER:
                if dur > 0:
                    annotations.append(Annotation(cat[1], start, dur / 1e6, USER))
            else:
                host_event(cat, start, dur if dur > 0 else 0, self.tid, None)


def read_file(path: str) -> Any:
    """The Profile of one XSpace file; bad input raises what the wire decoder says."""
    reader = UpbReader(path, wire.read_bytes(path))  # the reader owns the only reference
    try:
        return reader.read()
    except DecodeError:
        pass
    # upb says only that the message does not parse; the wire decoder says where and why
    # (truncated at offset N, wrong wire type, not an XSpace) and raises that error.
    return wire.read_buffer(path, wire.read_bytes(path))
