"""XPlane through protobuf's C decoder (upb) and the project's own schema (xplane_schema.py).

The same reading rules as the wire decoder in xplane.py (its ``_Reader`` methods turn a
device event's stats into an activity, a host event into an op/call/range), with the
protobuf parsing done in C. Parsing is lazy where the schema allows it: an XSpace is parsed
into raw planes; only the planes the analysis reads (GPU devices, host threads, CUPTI,
metadata, task environment) are parsed; of a GPU plane only the stream, op and step lines are
parsed to events, other lines stop at their header.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from ..model import STEP, USER, Annotation, GpuActivity
from . import xplane as wire
from .xplane_schema import (
    XEvent,
    XLine,
    XLineEventBytes,
    XLineHeader,
    XLineSlim,
    XPlane,
    XPlaneHeader,
    XSpace,
)

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


class _IntStatStripper:
    """Removes integer XStats with given metadata ids from a serialized XEvent.

    The pattern spells out each stat exactly: tag 0x22, its length byte (which must equal what
    follows), field 1 with one of the ids, then one uint64 (0x18) or int64 (0x20) varint as the
    stat's only value. ``key`` is the event's bytes after its id/offset/duration header,
    without those stats: equal keys mean equal stats apart from the stripped ones.
    """

    def __init__(self, ids: Any) -> None:
        by_len: dict[int, list[bytes]] = {}
        for i in sorted(ids):
            by_len.setdefault(len(_varint(i)), []).append(re.escape(_varint(i)))
        alts = []
        for id_len, mids in by_len.items():
            mid_alt = b"(?:" + b"|".join(mids) + b")"
            for value_len in range(1, 11):
                length = re.escape(bytes([1 + id_len + 1 + value_len]))
                alts.append(b"\x22" + length + b"\x08" + mid_alt + rb"[\x18\x20]"
                            + (rb"[\x80-\xff]{%d}" % (value_len - 1)) + rb"[\x00-\x7f]")
        self.pattern = re.compile(b"|".join(alts) if alts else rb"(?!)", re.DOTALL)
        self._strip = self.pattern.sub

    def key(self, ev_bytes: bytes) -> bytes:
        head = _EVENT_HEAD.match(ev_bytes)
        return self._strip(b"", ev_bytes[head.end():] if head else ev_bytes)


_EVENT_HEAD = re.compile(rb"(?:\x08[\x80-\xff]{0,9}[\x00-\x7f])?(?:\x10[\x80-\xff]{0,9}"
                         rb"[\x00-\x7f])?(?:\x18[\x80-\xff]{0,9}[\x00-\x7f])?")


def _int_stat_value(stat: bytes) -> int:
    """The value of a stat :class:`_IntStatStripper` matched: 0x22 L 0x08 id tag varint."""
    i = 3
    while stat[i] >= 0x80:  # the id's varint
        i += 1
    signed = stat[i + 1] == 0x20  # int64_value, else uint64_value
    value = 0
    for shift, b in enumerate(stat[i + 2:]):
        value |= (b & 0x7F) << (7 * shift)
    if signed and value >= 1 << 63:  # two's complement
        value -= 1 << 64
    return value


class _Headers:
    """Every event's metadata id, offset and duration, decoded from the line's event bytes in
    numpy (varints, column-wise) instead of one upb attribute read per field and event; and,
    with ``wanted`` (stat id -> name), each event's wanted integer stats.

    Producers write an XEvent's fields in field order: metadata_id (tag 0x08), offset_ps
    (0x10), duration_ps (0x18), then stats (0x22) and num_occurrences (0x28). Each event's
    fields after the header are walked too (column-wise, one field per step), so an event
    that repeats or reorders a header field, or a varint running past its event, makes
    ``ok`` False, and the caller reads that line with upb instead. A stat is taken here only
    as ``metadata_id`` then one uint64/int64 value; an event with a stat that may carry a
    wanted id in any other layout is marked ``decode`` (upb decodes its stats).
    """

    __slots__ = ("_buf", "decode", "durations", "has_offset", "metadata_ids", "offsets",
                 "ok", "stats")

    def __init__(self, events: Any, wanted: dict[int, str]) -> None:
        n = len(events)
        lens = np.fromiter(map(len, events), np.int64, n)
        self._buf = np.frombuffer(b"".join(events) + b"\x00" * 11, np.uint8)  # padded
        ends = np.cumsum(lens)
        pos = ends - lens
        self.metadata_ids, _ = self._field(pos, ends, 0x08)
        self.offsets, self.has_offset = self._field(pos, ends, 0x10)
        self.durations, _ = self._field(pos, ends, 0x18)
        self.stats: dict[int, dict[str, int]] = {}  # event index -> its wanted stats
        self.decode = np.zeros(n, dtype=bool)
        walked = self._walk_rest(pos, ends)
        self.ok = walked is not None and not (pos > ends).any()
        if self.ok and walked is not None and wanted:
            self._int_stats(*walked, wanted)
        del self._buf

    def _varints(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(value, position after it) of the varints starting at ``at``; position -1 for a
        varint longer than 10 bytes."""
        buf = self._buf
        value = np.zeros(len(at), np.uint64)
        at = at.copy()
        going = np.ones(len(at), dtype=bool)
        for k in range(10):
            byte = buf[at].astype(np.uint64)
            value[going] |= (byte[going] & np.uint64(0x7F)) << np.uint64(7 * k)
            at[going] += 1
            going &= byte >= 0x80
            if not going.any():
                return value, at
        at[going] = -1
        return value, at

    def _field(self, pos: np.ndarray, ends: np.ndarray, tag: int
               ) -> tuple[np.ndarray, np.ndarray]:
        """The int64 values of field ``tag`` where it comes next (0 elsewhere); moves ``pos``
        past it. A varint that runs past its event is left for the walk to reject."""
        present = (pos < ends) & (self._buf[pos] == tag)
        value = np.zeros(len(pos), np.uint64)
        idx = np.flatnonzero(present)
        v, after = self._varints(pos[idx] + 1)
        value[idx] = v
        pos[idx] = np.where(after < 0, ends[idx] + 1, after)
        return value.view(np.int64), present

    def _walk_rest(self, pos: np.ndarray, ends: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(event index, start, end) of every stat, when every event's fields after its
        header are stats or num_occurrences ending exactly at the event's end; else None."""
        idx = np.flatnonzero(pos < ends)
        at, end = pos[idx], ends[idx]
        found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        while len(idx):
            tag = self._buf[at]
            if not np.isin(tag, (0x22, 0x28)).all():
                return None
            value, after = self._varints(at + 1)
            if (after < 0).any() or (value > np.uint64(1 << 40)).any():
                return None
            is_stat = tag == 0x22
            nxt = np.where(is_stat, after + value.astype(np.int64), after)
            if (nxt > end).any():
                return None
            found.append((idx[is_stat], after[is_stat], nxt[is_stat]))
            more = nxt < end
            idx, at, end = idx[more], nxt[more], end[more]
        if not found:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return tuple(np.concatenate(c) for c in zip(*found, strict=True))  # type: ignore

    def _int_stats(self, event: np.ndarray, start: np.ndarray, end: np.ndarray,
                   wanted: dict[int, str]) -> None:
        buf = self._buf
        ids = np.fromiter(wanted, np.int64, len(wanted))
        id_first = (buf[start] == 0x08) & (end > start)
        self.decode[event[~id_first]] = True  # its id is not where we read it: upb decides
        event, start, end = event[id_first], start[id_first], end[id_first]
        mid, after = self._varints(start + 1)
        mine = np.isin(mid.view(np.int64), ids) & (after > 0)
        event, end, mid, after = event[mine], end[mine], mid[mine], after[mine]
        tag = buf[after]
        value, stop = self._varints(after + 1)
        plain = ((tag == 0x18) | (tag == 0x20)) & (stop == end)
        self.decode[event[~plain]] = True
        signed = value.view(np.int64)
        for e, m, t, v, sv in zip(event[plain].tolist(), mid[plain].tolist(),
                                  tag[plain].tolist(), value[plain].tolist(),
                                  signed[plain].tolist(), strict=True):
            self.stats.setdefault(e, {})[wanted[m]] = sv if t == 0x20 else v


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

    def __init__(self, path: str, buf: bytes) -> None:
        super().__init__(path, buf)
        self.templates: dict[tuple, GpuActivity | None] = {}

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
            plane = _UpbPlane(XPlane.FromString(raws[i]))
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
        names, emd, out = p.names, p.emd, self.profile.gpu
        first = len(out)
        wanted = {mid: n for mid, n in names.items() if n in wire.GPU_STATS}
        op_cache: dict[tuple, Any] = {}
        op_lines = []
        for raw in p.msg.lines:
            head = XLineHeader.FromString(raw)
            lname = _text(head.name or head.display_name)
            m = wire._STREAM_LINE.match(lname)
            if m is None:
                if lname in wire.OP_LINES:
                    op_lines.append(XLine.FromString(raw))
                elif lname == wire.STEP_LINE:
                    self.read_gpu_steps(emd, XLine.FromString(raw))
                else:
                    self.skipped_lines.add(lname)
                continue
            self.read_stream(raw, int(m[1]), dev, p, wanted, op_cache, info.num_sms)
        if op_lines:
            self.name_kernels_from_op_lines(emd, names, op_lines, out, first)

    def read_stream(self, raw: bytes, stream: int, dev: int, p: _UpbPlane,
                    wanted: dict[int, str], op_cache: dict[tuple, Any],
                    num_sms: int | None) -> None:
        """A stream line's activities. The kernels of one op repeat their stats but for the
        correlation id and other per-launch ids, so each event's bytes less those (and less
        its id, offset and duration) key one template activity; only a new key is decoded."""
        corr_ids = [mid for mid, n in wanted.items() if n == "correlation_id"]
        per_launch = _IntStatStripper(set(p.names) - set(wanted) | set(corr_ids))
        find_corr = _IntStatStripper(corr_ids).pattern.search if corr_ids else None
        templates = self.templates
        out = self.profile.gpu
        line = XLineSlim.FromString(raw)
        base_ps = line.timestamp_ns * 1000
        for ev, ev_bytes in zip(line.events, XLineEventBytes.FromString(raw).events, strict=True):
            off = ev.offset_ps
            if not off and not ev.HasField("offset_ps"):
                continue  # aggregated (num_occurrences): no place on a timeline
            key = (ev.metadata_id, per_launch.key(ev_bytes))
            try:
                t = templates[key]
            except KeyError:  # a new launch site: decode its stats once
                st = _stats(XEvent.FromString(ev_bytes).stats, p.names, wanted)
                name = p.emd.get(ev.metadata_id, wire._NO_MD)[0]
                t = templates[key] = self.gpu_activity(name, st, op_cache, num_sms)
            if t is None:
                continue  # not GPU work
            corr = t.correlation  # a correlation stat the pattern does not match stays in key
            m = find_corr(ev_bytes) if find_corr is not None else None
            if m is not None:
                corr = _int_stat_value(m.group())
            dur = ev.duration_ps
            out.append(GpuActivity(
                t.kind, t.name, (base_ps + off) / 1e6, (dur if dur > 0 else 0) / 1e6, dev,
                stream, corr, None, t.grid, t.block, t.registers, t.shared_mem,
                t.blocks_per_sm, t.occupancy, t.bytes, t.op, t.op_type))

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
        for raw in p.msg.lines:
            head = XLineHeader.FromString(raw)
            line = _HostLine(self, p, head.id, head.timestamp_ns * 1000, cats, cupti, is_tf,
                             wanted)
            events = iter(XLineEventBytes.FromString(raw).events)
            # in chunks: the columns of a 400k-event line would double the reader's peak
            while chunk := list(itertools.islice(events, HOST_CHUNK_EVENTS)):
                line.read(chunk)


HOST_CHUNK_EVENTS = 1 << 15


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
        cols = _Headers(events, self.wanted)
        if not cols.ok:  # a layout the column decoder does not take: upb reads each event
            self.read_upb(events)
            return
        cats, names, wanted, tid, base_ps = (self.cats, self.p.names, self.wanted, self.tid,
                                             self.base_ps)
        skip, user = wire._SKIP, wire._USER
        host_event = self.reader.host_event
        annotations = self.reader.profile.annotations
        stats, decode = cols.stats, cols.decode.tolist()
        for i, (mid, off, has_off, dur) in enumerate(zip(
                cols.metadata_ids.tolist(), cols.offsets.tolist(),
                cols.has_offset.tolist(), cols.durations.tolist(), strict=True)):
            cat = cats.get(mid) or self.category(mid)
            if cat[0] == skip:
                continue
            if not has_off:
                continue  # aggregated: no place on a timeline
            if i in stats or decode[i]:
                st = (_stats(XEvent.FromString(events[i]).stats, names, wanted)
                      if decode[i] else stats[i]) or None
                host_event(cat, (base_ps + off) / 1e6, dur if dur > 0 else 0, tid, st)
            elif cat[0] == user:  # the common case, inline: a TraceMe range
                if dur > 0:
                    annotations.append(Annotation(cat[1], (base_ps + off) / 1e6, dur / 1e6,
                                                  USER))
            else:
                host_event(cat, (base_ps + off) / 1e6, dur if dur > 0 else 0, tid, None)

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
