"""A tiny protobuf encoder that writes synthetic XSpace files, for reader edge-case tests only.

Field numbers follow tsl/profiler/protobuf/xplane.proto. Written independently of the reader's
decoder (straight from the wire-format spec) so the two check each other.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any


def varint(value: int) -> bytes:
    if value < 0:  # int64 negatives are sent as their 64-bit two's complement
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def key(field_no: int, wire: int) -> bytes:
    return varint((field_no << 3) | wire)


def f_varint(field_no: int, value: int) -> bytes:
    return key(field_no, 0) + varint(value)


def f_bytes(field_no: int, payload: bytes | str) -> bytes:
    if isinstance(payload, str):
        payload = payload.encode()
    return key(field_no, 2) + varint(len(payload)) + payload


def f_double(field_no: int, value: float) -> bytes:
    return key(field_no, 1) + struct.pack("<d", value)


def f_fixed32(field_no: int, value: int) -> bytes:
    return key(field_no, 5) + struct.pack("<I", value)


def f_fixed64(field_no: int, value: int) -> bytes:
    return key(field_no, 1) + struct.pack("<Q", value)


def xstat(mid: int, value: Any, *, ref: bool = False, unsigned: bool = False) -> bytes:
    """XStat: 1 metadata_id, 2 double, 3 uint64, 4 int64, 5 str, 6 bytes, 7 ref."""
    out = f_varint(1, mid)
    if ref:
        return out + f_varint(7, value)
    if isinstance(value, float):
        return out + f_double(2, value)
    if isinstance(value, int):
        return out + f_varint(3 if unsigned else 4, value)
    if isinstance(value, str):
        return out + f_bytes(5, value)
    return out + f_bytes(6, value)


@dataclass
class PlaneBuilder:
    """Interns event/stat names the way the profiler does; lines hold (name, ts, events)."""

    name: str
    id: int = 0
    event_names: dict[str, int] = field(default_factory=dict)
    stat_names: dict[str, int] = field(default_factory=dict)
    lines: list[bytes] = field(default_factory=list)
    plane_stats: list[bytes] = field(default_factory=list)

    def event_id(self, name: str) -> int:
        return self.event_names.setdefault(name, len(self.event_names) + 1)

    def stat_id(self, name: str) -> int:
        return self.stat_names.setdefault(name, len(self.stat_names) + 1)

    def stat(self, name: str, value: Any, *, as_ref: bool = False) -> bytes:
        """A stat; ``as_ref`` stores a string value as a ref to a stat-metadata name."""
        if as_ref:
            return xstat(self.stat_id(name), self.stat_id(value), ref=True)
        return xstat(self.stat_id(name), value)

    def event(self, name: str, offset_ps: int, duration_ps: int, stats: list[bytes] = (),
              *, canonical: bool = True) -> bytes:
        parts = [f_varint(1, self.event_id(name)), f_varint(2, offset_ps),
                 f_varint(3, duration_ps)] + [f_bytes(4, s) for s in stats]
        if not canonical:  # fields out of number order: decoders must not rely on order
            parts.reverse()
        return b"".join(parts)

    def line(self, line_id: int, name: str, timestamp_ns: int, events: list[bytes],
             *, events_first: bool = False) -> None:
        head = f_varint(1, line_id) + f_bytes(2, name) + f_varint(3, timestamp_ns)
        body = b"".join(f_bytes(4, e) for e in events)
        self.lines.append(body + head if events_first else head + body)

    def add_plane_stat(self, name: str, value: Any, *, unsigned: bool = False) -> None:
        self.plane_stats.append(xstat(self.stat_id(name), value, unsigned=unsigned))

    def encode(self) -> bytes:
        out = f_varint(1, self.id) + f_bytes(2, self.name)
        out += b"".join(f_bytes(3, ln) for ln in self.lines)
        for name, mid in self.event_names.items():
            md = f_varint(1, mid) + f_bytes(2, name)
            out += f_bytes(4, f_varint(1, mid) + f_bytes(2, md))
        for name, mid in self.stat_names.items():
            md = f_varint(1, mid) + f_bytes(2, name)
            out += f_bytes(5, f_varint(1, mid) + f_bytes(2, md))
        out += b"".join(f_bytes(6, s) for s in self.plane_stats)
        return out


def xspace(planes: list[PlaneBuilder], hostnames: list[str] = ("testhost",)) -> bytes:
    return b"".join(f_bytes(1, p.encode()) for p in planes) + b"".join(
        f_bytes(4, h) for h in hostnames)
