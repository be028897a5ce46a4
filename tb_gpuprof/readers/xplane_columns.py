"""XEvents decoded column-wise with numpy: every event of a chunk at once, no Python per event.

Producers write an XEvent's fields in field order: metadata_id (tag 0x08), offset_ps (0x10),
duration_ps (0x18), then its stats (0x22, each an XStat: metadata_id, then one value field)
and num_occurrences (0x28). :class:`EventColumns` decodes the three header fields of every
event as columns and walks the rest of each event field by field (one field of every event
per numpy step), so an event laid out otherwise is found, never misread: ``ok`` is False and
the caller decodes that chunk with upb. :class:`StatFields` does the same for the fields of
the stats, and :class:`LaunchGroups` groups a stream line's events by launch site: events
whose bytes differ only in their header and per-launch integers (correlation id and others
the reader does not use) decode to the same activity, so only one event per group is decoded.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_PAD = bytes(16)  # reads look up to 11 bytes past a field's start
_MAX_LEN = 1 << 40  # a longer length field is corruption: the column walk gives up
# what follows an XStat value field's tag: a varint (uint64, int64, ref), 8 bytes (double),
# a length and that many bytes (str, bytes); 0 for a tag that is no XStat value
_VARINT, _DOUBLE, _LEN = 1, 2, 3
_VALUE_KIND = np.zeros(256, np.int8)
_VALUE_KIND[[0x18, 0x20, 0x38]] = _VARINT
_VALUE_KIND[0x11] = _DOUBLE
_VALUE_KIND[[0x2A, 0x32]] = _LEN
KEY_CAP = 512  # an event whose launch key is longer is decoded alone, not grouped
READ, CORRELATION = 1, 2  # LaunchGroups' roles of stat ids (others: 0, not read)


def varints(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, position after it) of the varints starting at ``at``; position -1 for a
    varint longer than 10 bytes. ``buf`` must be padded: a varint may run past its message,
    which the caller checks. Each step reads one more byte of the varints not done yet."""
    value = buf[at].astype(np.uint64)
    after = at + 1
    going = np.flatnonzero(value >= 0x80)
    value &= np.uint64(0x7F)
    for k in range(1, 10):
        if not len(going):
            return value, after
        byte = buf[at[going] + k].astype(np.uint64)
        value[going] |= (byte & np.uint64(0x7F)) << np.uint64(7 * k)
        after[going] += 1
        going = going[byte >= 0x80]
    after[going] = -1
    return value, after


class StatSpans(NamedTuple):
    """Every stat field of a chunk's events, in field order within each event."""

    event: np.ndarray  # the index of the event it belongs to
    tag_at: np.ndarray  # where its field tag (0x22) is
    start: np.ndarray  # where its XStat message begins
    end: np.ndarray  # and ends


_NO_SPANS = StatSpans(*(np.zeros(0, np.int64) for _ in range(4)))


class EventColumns:
    """The metadata id, offset and duration of every event of a chunk, with the spans of
    their stats. ``ok`` is False when some event is laid out otherwise (a repeated or
    reordered header field, an unknown field, a varint or length past its event's end)."""

    __slots__ = ("aggregated", "buf", "durations", "ends", "has_offset", "metadata_ids",
                 "offsets", "ok", "spans", "starts", "stats_at")

    def __init__(self, events: list[bytes]) -> None:
        n = len(events)
        lens = np.fromiter(map(len, events), np.int64, n)
        self.buf = np.frombuffer(b"".join(events) + _PAD, np.uint8)
        self.ends = np.cumsum(lens)
        self.starts = self.ends - lens
        pos = self.starts.copy()
        self.metadata_ids, _ = self._field(pos, 0x08)
        self.offsets, self.has_offset = self._field(pos, 0x10)
        self.durations, _ = self._field(pos, 0x18)
        self.stats_at = pos  # where each event's fields after the header begin
        self.aggregated = np.zeros(n, dtype=bool)  # num_occurrences after the header
        walked = self._walk_rest()
        self.ok = walked is not None and not (pos > self.ends).any()
        self.spans = walked if walked is not None else _NO_SPANS

    def _field(self, pos: np.ndarray, tag: int) -> tuple[np.ndarray, np.ndarray]:
        """The int64 values of field ``tag`` where it comes next (0 elsewhere); moves ``pos``
        past it. A varint that runs past its event is left for the walk to reject."""
        ends = self.ends
        present = (pos < ends) & (self.buf[pos] == tag)
        value = np.zeros(len(pos), np.uint64)
        idx = np.flatnonzero(present)
        v, after = varints(self.buf, pos[idx] + 1)
        value[idx] = v
        pos[idx] = np.where(after < 0, ends[idx] + 1, after)
        return value.view(np.int64), present

    def _walk_rest(self) -> StatSpans | None:
        """The spans of every stat, when every event's fields after its header are stats or
        num_occurrences ending exactly at the event's end; else None."""
        idx = np.flatnonzero(self.stats_at < self.ends)
        at, end = self.stats_at[idx], self.ends[idx]
        found: list[tuple[np.ndarray, ...]] = []
        while len(idx):
            tag = self.buf[at]
            length = self.buf[at + 1].astype(np.int64)
            if (tag == 0x22).all() and (length < 0x80).all():  # stats of one-byte lengths
                after = at + 2
                nxt = after + length
                if (nxt > end).any():
                    return None
                found.append((idx, at, after, nxt))
            else:
                step = self._other_fields(idx, at, end, tag)
                if step is None:
                    return None
                stats, nxt = step
                found.append(stats)
            more = nxt < end
            idx, at, end = idx[more], nxt[more], end[more]
        if not found:
            return _NO_SPANS
        return StatSpans(*(np.concatenate(c) for c in zip(*found, strict=True)))

    def _other_fields(self, idx: np.ndarray, at: np.ndarray, end: np.ndarray, tag: np.ndarray
                      ) -> tuple[tuple[np.ndarray, ...], np.ndarray] | None:
        """One step of the walk where some field is not a stat with a one-byte length:
        ((event index, tag, start, end) of its stats, where each event's field ends); None
        for a field that is neither a stat nor num_occurrences."""
        is_stat = tag == 0x22
        if not (is_stat | (tag == 0x28)).all():
            return None
        value, after = varints(self.buf, at + 1)
        if (after < 0).any() or (value > np.uint64(_MAX_LEN)).any():
            return None
        nxt = np.where(is_stat, after + value.astype(np.int64), after)
        if (nxt > end).any():
            return None
        self.aggregated[idx[~is_stat]] = True
        return (idx[is_stat], at[is_stat], after[is_stat], nxt[is_stat]), nxt


class StatFields:
    """The fields of every stat in ``spans``: its metadata id, value tag and integer value.
    ``simple``: the stat is its metadata_id then exactly one value field, ending at the
    stat's end (every writer's layout); the other fields mean something only where it is."""

    __slots__ = ("ids", "simple", "tags", "values")

    def __init__(self, buf: np.ndarray, spans: StatSpans) -> None:
        start, end = spans.start, spans.end
        id_first = (buf[start] == 0x08) & (end > start)
        ids, after = varints(buf, start + 1)
        id_ok = id_first & (after > 0) & (after < end)
        after = np.where(id_ok, after, start)  # where the value field's tag is
        tags = buf[after]
        values, stop = varints(buf, after + 1)
        stop[stop < 0] = -_MAX_LEN * 4  # a varint that does not end: no value ends near it
        length = np.minimum(values, np.uint64(_MAX_LEN)).astype(np.int64)
        kind = _VALUE_KIND[tags]
        value_end = np.where(kind == _VARINT, stop, np.where(
            kind == _DOUBLE, after + 9, np.where(kind == _LEN, stop + length, -1)))
        self.simple = id_ok & (value_end == end)
        self.ids = ids.view(np.int64)
        self.tags = tags
        self.values = values  # as uint64; an int64_value (tag 0x20) is its view as int64


class IdCodes:
    """Stat metadata ids -> small codes (0 for every other id), looked up a column at a time:
    through a table when the ids are small (every writer numbers them from 1), else np.isin."""

    _MAX_TABLE = 1 << 16

    def __init__(self, codes: dict[int, int]) -> None:
        self.codes = codes
        self.table: np.ndarray | None = None
        if all(0 <= i < self._MAX_TABLE for i in codes):
            self.table = np.zeros(max(codes, default=-1) + 2, np.int8)  # last: other ids
            for i, code in codes.items():
                self.table[i] = code

    def of(self, ids: np.ndarray) -> np.ndarray:
        """The code of each id (int64 column)."""
        if self.table is not None:
            return self.table[np.minimum(ids.view(np.uint64), np.uint64(len(self.table) - 1))]
        out = np.zeros(len(ids), np.int8)
        for code in set(self.codes.values()):
            out[np.isin(ids, [i for i, c in self.codes.items() if c == code])] = code
        return out


class IntStats:
    """Per event, the value of each wanted integer stat (``wanted``: stat id -> name). A stat
    is taken here only as metadata_id then one uint64/int64 value, once per event and name;
    an event with a stat that may carry a wanted id in any other layout, or with one name
    twice, is marked in ``decode`` (the caller decodes its stats with upb)."""

    __slots__ = ("decode", "present", "signed", "values")

    def __init__(self, cols: EventColumns, wanted: dict[int, str]) -> None:
        n = len(cols.metadata_ids)
        self.decode = np.zeros(n, dtype=bool)
        self.present: dict[str, np.ndarray] = {}
        self.values: dict[str, np.ndarray] = {}
        self.signed: dict[str, np.ndarray] = {}
        if not wanted:
            return
        buf, spans = cols.buf, cols.spans
        event, start, end = spans.event, spans.start, spans.end
        id_first = (buf[start] == 0x08) & (end > start)
        self.decode[event[~id_first]] = True  # its id is not where we read it: upb decides
        event, start, end = event[id_first], start[id_first], end[id_first]
        mid, after = varints(buf, start + 1)
        names = sorted(set(wanted.values()))
        code = IdCodes({i: names.index(n) + 1 for i, n in wanted.items()}).of(
            mid.view(np.int64))
        mine = (code > 0) & (after > 0)
        event, end, code, after = event[mine], end[mine], code[mine], after[mine]
        tag = buf[after]
        value, stop = varints(buf, after + 1)
        plain = ((tag == 0x18) | (tag == 0x20)) & (stop == end)
        self.decode[event[~plain]] = True
        for number, name in enumerate(names, 1):
            this = plain & (code == number)
            count = np.bincount(event[this], minlength=n)
            self.decode |= count > 1
            self.present[name] = count == 1
            self.values[name] = np.zeros(n, np.uint64)
            self.values[name][event[this]] = value[this]
            self.signed[name] = np.zeros(n, dtype=bool)
            self.signed[name][event[this]] = tag[this] == 0x20

    def of(self, name: str, events: np.ndarray) -> np.ndarray:
        """The values of stat ``name`` for ``events`` as an object column of Python ints,
        None where an event has none."""
        if name not in self.present:
            return np.full(len(events), None, dtype=object)
        return python_ints(self.values[name][events], self.signed[name][events],
                           self.present[name][events])


def python_ints(values: np.ndarray, signed: np.ndarray, present: np.ndarray) -> np.ndarray:
    """uint64 varint values as an object column of Python ints: as int64 where ``signed``
    (an int64_value), None where not ``present``."""
    out = np.full(len(values), None, dtype=object)
    unsigned = present & ~signed
    out[unsigned] = values[unsigned]  # numpy makes each a Python int
    signed = present & signed
    out[signed] = values[signed].view(np.int64)
    return out


class LaunchGroups:
    """The timed events of a stream-line chunk, grouped by launch site.

    An event's launch key is its metadata id and its stats less the integer stats that
    change from launch to launch: the correlation id (kept per event: ``correlations``) and
    every integer stat the reader does not read (``roles``: stat id -> READ, CORRELATION or
    0; scope_range_id, cuda_graph_node_id, ... are 0).
    Events with equal keys decode to the same activity but for the correlation id, so one
    event per group (``first``) is decoded. An event with a stat of another layout, with more
    than one correlation id, or with a key over KEY_CAP bytes is ``alone``: decoded by itself.
    """

    __slots__ = ("alone", "corr_signed", "corr_values", "first", "group", "has_corr", "keys",
                 "timed")

    def __init__(self, cols: EventColumns, roles: IdCodes) -> None:
        n = len(cols.metadata_ids)
        spans = cols.spans
        fields = StatFields(cols.buf, spans)
        role = roles.of(fields.ids)
        is_int = fields.simple & ((fields.tags == 0x18) | (fields.tags == 0x20))
        is_corr = fields.simple & (role == CORRELATION)
        per_launch = is_int & (role != READ)
        self.alone = np.zeros(n, dtype=bool)
        self.alone[spans.event[~fields.simple | (is_corr & ~is_int)]] = True
        corr_count = np.bincount(spans.event[is_corr], minlength=n)
        self.alone |= corr_count > 1
        self.has_corr = corr_count == 1
        self.corr_values = np.zeros(n, np.uint64)
        self.corr_values[spans.event[is_corr]] = fields.values[is_corr]
        self.corr_signed = np.zeros(n, dtype=bool)
        self.corr_signed[spans.event[is_corr]] = fields.tags[is_corr] == 0x20
        # upb's reading: num_occurrences after offset_ps (one oneof) unsets it
        self.timed = cols.has_offset & ~cols.aggregated
        kept, key_start, key_len = _launch_key_bytes(cols, per_launch)
        self.alone |= key_len > KEY_CAP
        self.group = np.full(n, -1, np.int64)
        self.first, self.keys = self._group(cols.metadata_ids, kept, key_start, key_len)

    def _group(self, metadata_ids: np.ndarray, kept: np.ndarray, key_start: np.ndarray,
               key_len: np.ndarray) -> tuple[list[int], list[tuple[int, bytes]]]:
        """Group the timed events that are not alone by their exact launch key; (first
        event, key) per group. Keys are compared as fixed-width rows: the key's bytes, zero
        after its end, with its length and metadata id."""
        members = np.flatnonzero(self.timed & ~self.alone)
        if not len(members):
            return [], []
        lens = key_len[members]
        width = max(8, -(-int(lens.max()) // 8) * 8)
        padded = np.concatenate([kept, np.zeros(width, np.uint8)])
        rows = sliding_window_view(padded, width)[key_start[members]]  # a copy
        rows[np.arange(width) >= lens[:, None]] = 0
        table = np.column_stack([metadata_ids[members].view(np.uint64),
                                 lens.astype(np.uint64), rows.view(np.uint64)])
        first, inverse = _unique_rows(table)
        self.group[members] = inverse
        first_events = members[first]
        starts, ends = key_start[first_events], key_start[first_events] + key_len[first_events]
        keys = [(mid, kept[s:e].tobytes()) for mid, s, e in zip(
            metadata_ids[first_events].tolist(), starts.tolist(), ends.tolist(), strict=True)]
        return first_events.tolist(), keys

    def correlations(self, events: np.ndarray) -> np.ndarray:
        """The correlation id of each of ``events`` (None where it has none): an object
        column of Python ints."""
        return python_ints(self.corr_values[events], self.corr_signed[events],
                           self.has_corr[events])


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _unique_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct row, its distinct row's number per row) of a uint64
    table. Rows are told apart by a hash, then checked against their group's first row in
    full; only if some differ (a hash collision) are they sorted as whole rows."""
    words = table ^ (table >> np.uint64(31))
    words *= _MIX
    weights = (np.arange(1, table.shape[1] + 1, dtype=np.uint64) * _MIX) | np.uint64(1)
    hashes = (words * weights).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    if (table == table[first[inverse]]).all():
        return first, inverse
    _, first, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _launch_key_bytes(cols: EventColumns, per_launch: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, start, length): every event's bytes less its header and its ``per_launch``
    stats (tag, length and message), one event after the other in ``bytes``."""
    spans = cols.spans
    n = len(cols.ends)
    size = int(cols.ends[-1]) if n else 0
    # the bytes to drop are ranges that never overlap: mark where each opens and closes
    opens = np.zeros(size + 1, np.int8)
    closes = np.zeros(size + 1, np.int8)
    head = cols.stats_at > cols.starts
    opens[cols.starts[head]] = 1
    closes[cols.stats_at[head]] = 1
    opens[spans.tag_at[per_launch]] = 1
    closes[spans.end[per_launch]] = 1
    dropped = np.cumsum(opens - closes, dtype=np.int8)[:size].astype(bool)
    kept = cols.buf[:size][~dropped]
    stripped = np.bincount(spans.event[per_launch], minlength=n,
                           weights=(spans.end - spans.tag_at)[per_launch]).astype(np.int64)
    key_len = cols.ends - cols.stats_at - stripped
    return kept, np.cumsum(key_len) - key_len, key_len
