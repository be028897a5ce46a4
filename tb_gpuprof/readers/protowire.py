"""A minimal protobuf wire-format decoder: enough to walk XPlane files without generated code.

Works on ``bytes`` (or anything indexable to ints and sliceable to bytes, such as ``mmap``).
Every read is bounds-checked against the end of the enclosing message, so truncated or
garbage input raises :class:`ProtoDecodeError` instead of reading past the end, hanging or
recursing: nothing here recurses, and every step advances the position by at least one byte.

Positions are plain ints; sub-messages are ``(start, end)`` ranges into the same buffer, so
nothing is copied until a string is actually wanted.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

# Wire types (https://protobuf.dev/programming-guides/encoding/#structure)
VARINT = 0
I64 = 1
LEN = 2
SGROUP = 3  # deprecated groups: never written by XPlane producers, treated as corrupt input
EGROUP = 4
I32 = 5

_U64 = 1 << 64
_I64_SIGN = 1 << 63
_MAX_VARINT_BYTES = 10
_unpack_double = struct.Struct("<d").unpack_from
_unpack_float = struct.Struct("<f").unpack_from
_unpack_u64 = struct.Struct("<Q").unpack_from
_unpack_u32 = struct.Struct("<I").unpack_from


class ProtoDecodeError(ValueError):
    """The bytes are not a well-formed protobuf message."""


class TruncatedError(ProtoDecodeError):
    """A varint or length-delimited field runs past the end of its message."""


class WireTypeError(ProtoDecodeError):
    """A field has a wire type the decoder cannot handle or the schema does not allow."""


def read_varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """Decode an unsigned varint at ``pos``; return ``(value, next_pos)``."""
    if pos >= end:
        raise TruncatedError(f"varint at offset {pos} runs past the end of its message ({end})")
    b = buf[pos]
    if b < 0x80:  # the common one-byte case, no loop
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    i = pos + 1
    stop = min(end, pos + _MAX_VARINT_BYTES)
    while i < stop:
        b = buf[i]
        result |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            # 10th byte may carry only the top bit of a 64-bit value; mask like protoc does
            return result & (_U64 - 1), i
        shift += 7
    if i - pos >= _MAX_VARINT_BYTES:
        raise ProtoDecodeError(f"varint at offset {pos} is longer than 10 bytes")
    raise TruncatedError(f"varint at offset {pos} runs past the end of its message ({end})")


def to_int64(value: int) -> int:
    """Reinterpret a decoded uint64 as two's-complement int64 (int64 fields, negatives)."""
    return value - _U64 if value & _I64_SIGN else value


def to_int32(value: int) -> int:
    """Reinterpret a decoded varint as int32 (negative int32 are sign-extended to 64 bits)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def zigzag_decode(value: int) -> int:
    """sint32/sint64 zigzag: 0->0, 1->-1, 2->1, 3->-2, ..."""
    return (value >> 1) ^ -(value & 1)


def read_fixed64(buf: Any, pos: int, end: int) -> tuple[int, int]:
    if pos + 8 > end:
        raise TruncatedError(f"fixed64 at offset {pos} runs past the end of its message ({end})")
    return _unpack_u64(buf, pos)[0], pos + 8


def read_fixed32(buf: Any, pos: int, end: int) -> tuple[int, int]:
    if pos + 4 > end:
        raise TruncatedError(f"fixed32 at offset {pos} runs past the end of its message ({end})")
    return _unpack_u32(buf, pos)[0], pos + 4


def read_double(buf: Any, pos: int, end: int) -> tuple[float, int]:
    if pos + 8 > end:
        raise TruncatedError(f"double at offset {pos} runs past the end of its message ({end})")
    return _unpack_double(buf, pos)[0], pos + 8


def read_float(buf: Any, pos: int, end: int) -> tuple[float, int]:
    if pos + 4 > end:
        raise TruncatedError(f"float at offset {pos} runs past the end of its message ({end})")
    return _unpack_float(buf, pos)[0], pos + 4


def read_length(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """Read the length prefix of a LEN field; return ``(payload_start, payload_end)``."""
    n, start = read_varint(buf, pos, end)
    stop = start + n
    if stop > end:
        raise TruncatedError(
            f"length-delimited field at offset {pos} claims {n} bytes, only {end - start} left"
        )
    return start, stop


def read_tag(buf: Any, pos: int, end: int) -> tuple[int, int, int]:
    """Read a field key; return ``(field_number, wire_type, next_pos)``."""
    key, pos2 = read_varint(buf, pos, end)
    field = key >> 3
    wire = key & 7
    if field == 0:
        raise WireTypeError(f"field number 0 at offset {pos}")
    if wire in (SGROUP, EGROUP) or wire > I32:
        raise WireTypeError(f"unsupported wire type {wire} (field {field}) at offset {pos}")
    return field, wire, pos2


def skip_value(buf: Any, wire: int, pos: int, end: int) -> int:
    """Return the position after the value of a field of wire type ``wire`` at ``pos``."""
    if wire == VARINT:
        return read_varint(buf, pos, end)[1]
    if wire == LEN:
        return read_length(buf, pos, end)[1]
    if wire == I64:
        if pos + 8 > end:
            raise TruncatedError(f"fixed64 at offset {pos} runs past the end of its message")
        return pos + 8
    if wire == I32:
        if pos + 4 > end:
            raise TruncatedError(f"fixed32 at offset {pos} runs past the end of its message")
        return pos + 4
    raise WireTypeError(f"unsupported wire type {wire} at offset {pos}")


def iter_fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(field_number, wire_type, a, b)`` for each field of the message in [start, end).

    VARINT: ``a`` is the raw unsigned value; I64/I32: ``a`` is the raw little-endian unsigned
    integer (use :func:`read_double` on the position for doubles); LEN: ``(a, b)`` is the
    payload range. ``b`` is the position after the field for non-LEN fields.
    """
    pos = start
    while pos < end:
        field, wire, pos = read_tag(buf, pos, end)
        if wire == VARINT:
            value, pos = read_varint(buf, pos, end)
            yield field, wire, value, pos
        elif wire == LEN:
            a, pos = read_length(buf, pos, end)
            yield field, wire, a, pos
        elif wire == I64:
            value, pos = read_fixed64(buf, pos, end)
            yield field, wire, value, pos
        else:  # I32 (read_tag rejected everything else)
            value, pos = read_fixed32(buf, pos, end)
            yield field, wire, value, pos


def expect_wire(field: int, wire: int, expected: int, what: str) -> None:
    """Raise :class:`WireTypeError` when a known field has the wrong wire type."""
    if wire != expected:
        raise WireTypeError(f"{what} field {field} has wire type {wire}, expected {expected}")


def decode_str(buf: Any, start: int, end: int) -> str:
    return bytes(buf[start:end]).decode("utf-8", "replace")


def u64_to_double(raw: int) -> float:
    """The double whose IEEE-754 bits are the fixed64 ``raw`` (as yielded by iter_fields)."""
    return struct.unpack("<d", struct.pack("<Q", raw))[0]


__all__ = [
    "EGROUP",
    "I32",
    "I64",
    "LEN",
    "SGROUP",
    "VARINT",
    "ProtoDecodeError",
    "TruncatedError",
    "WireTypeError",
    "decode_str",
    "expect_wire",
    "iter_fields",
    "read_double",
    "read_fixed32",
    "read_fixed64",
    "read_float",
    "read_length",
    "read_tag",
    "read_varint",
    "skip_value",
    "to_int32",
    "to_int64",
    "u64_to_double",
    "zigzag_decode",
]
