"""The protobuf wire decoder against the spec's worked examples, protobuf's own encoder, and
truncated/garbage input (which must raise ProtoDecodeError, never hang or crash otherwise)."""

from __future__ import annotations

import random
import struct

import pytest

from tb_gpuprof.readers import protowire as pw
from tests import xplane_builder as xb


@pytest.mark.parametrize(
    ("encoded", "value"),
    [  # examples from https://protobuf.dev/programming-guides/encoding/
        (b"\x00", 0),
        (b"\x01", 1),
        (b"\x7f", 127),
        (b"\x96\x01", 150),
        (b"\xac\x02", 300),
        (b"\xff\xff\xff\xff\x0f", 2**32 - 1),
        (b"\xff" * 9 + b"\x01", 2**64 - 1),
    ],
)
def test_varint_known_encodings(encoded, value):
    assert pw.read_varint(encoded, 0, len(encoded)) == (value, len(encoded))


def test_varint_roundtrip_with_independent_encoder():
    values = [0, 1, 127, 128, 255, 16383, 16384, 2**31, 2**35 + 7, 2**63 - 1, 2**63, 2**64 - 1]
    values += [random.Random(7).getrandbits(n) for n in range(1, 64, 3)]
    for v in values:
        enc = xb.varint(v)
        assert pw.read_varint(enc, 0, len(enc)) == (v, len(enc))


def test_int64_negative_and_int32():
    enc = xb.varint(-1)
    assert enc == b"\xff" * 9 + b"\x01"  # the spec: int64 -1 takes ten bytes
    raw, _ = pw.read_varint(enc, 0, len(enc))
    assert pw.to_int64(raw) == -1
    assert pw.to_int64(pw.read_varint(xb.varint(-(2**63)), 0, 10)[0]) == -(2**63)
    assert pw.to_int32(raw) == -1
    assert pw.to_int64(5) == 5


@pytest.mark.parametrize(  # the spec's zigzag table
    ("signed", "encoded"),
    [(0, 0), (-1, 1), (1, 2), (-2, 3), (2147483647, 4294967294), (-2147483648, 4294967295)],
)
def test_zigzag(signed, encoded):
    assert pw.zigzag_decode(encoded) == signed
    assert xb.zigzag(signed) == encoded


def test_fixed_width_values():
    buf = struct.pack("<dfIQ", -2.5, 0.75, 0xDEADBEEF, 2**64 - 2)
    assert pw.read_double(buf, 0, len(buf)) == (-2.5, 8)
    assert pw.read_float(buf, 8, len(buf)) == (0.75, 12)
    assert pw.read_fixed32(buf, 12, len(buf)) == (0xDEADBEEF, 16)
    assert pw.read_fixed64(buf, 16, len(buf)) == (2**64 - 2, 24)
    assert pw.u64_to_double(struct.unpack("<Q", struct.pack("<d", 3.25))[0]) == 3.25


def test_iter_fields_matches_protobuf_library_encoding():
    descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
    msg = descriptor_pb2.FieldDescriptorProto(
        name="conv_weight", number=150, label=3, type=12, json_name="convWeight",
        default_value="x" * 300,  # a length prefix of two bytes
    )
    msg.options.deprecated = True
    buf = msg.SerializeToString()
    seen = {}
    for field, wire, a, b in pw.iter_fields(buf, 0, len(buf)):
        seen[field] = (wire, a, b)
    assert pw.decode_str(buf, seen[1][1], seen[1][2]) == "conv_weight"  # name = 1
    assert seen[3][:2] == (pw.VARINT, 150)  # number = 3
    assert seen[4][:2] == (pw.VARINT, 3)  # label = 4
    assert seen[5][:2] == (pw.VARINT, 12)  # type = 5
    assert pw.decode_str(buf, seen[7][1], seen[7][2]) == "x" * 300  # default_value = 7
    assert pw.decode_str(buf, seen[10][1], seen[10][2]) == "convWeight"  # json_name = 10
    # options (8) is a nested message: FieldOptions.deprecated = 3
    opts = list(pw.iter_fields(buf, seen[8][1], seen[8][2]))
    assert opts[0][:3] == (3, pw.VARINT, 1)


def test_fixed_fields_and_skip():
    buf = xb.f_double(1, 1.5) + xb.f_fixed32(2, 7) + xb.f_fixed64(3, 9) + xb.f_varint(4, 300)
    fields = list(pw.iter_fields(buf, 0, len(buf)))
    assert [(f, w) for f, w, _a, _b in fields] == [(1, pw.I64), (2, pw.I32), (3, pw.I64),
                                                   (4, pw.VARINT)]
    assert pw.u64_to_double(fields[0][2]) == 1.5
    assert fields[1][2] == 7 and fields[2][2] == 9 and fields[3][2] == 300
    pos = 0
    for _ in range(4):
        _f, wire, pos = pw.read_tag(buf, pos, len(buf))
        pos = pw.skip_value(buf, wire, pos, len(buf))
    assert pos == len(buf)


@pytest.mark.parametrize(
    "buf",
    [
        b"\x96",  # varint cut in the middle
        b"\x08",  # key without its value
        b"\x0a\x05abc",  # length says 5, only 3 bytes follow
        b"\x09\x00\x00",  # fixed64 cut short
        b"\x0d\x00",  # fixed32 cut short
    ],
)
def test_truncated_input_raises(buf):
    with pytest.raises(pw.TruncatedError):
        list(pw.iter_fields(buf, 0, len(buf)))


def test_sub_message_bounds_are_enforced():
    # a varint that would continue past the end of its enclosing message must not read on
    buf = b"\x08\x96\x01"
    with pytest.raises(pw.TruncatedError):
        pw.read_varint(buf, 1, 2)


@pytest.mark.parametrize(
    "buf",
    [
        b"\x00\x01",  # field number 0
        b"\x0b",  # start-group
        b"\x0c",  # end-group
        b"\x0e\x00",  # wire type 6
        b"\x0f\x00",  # wire type 7
    ],
)
def test_invalid_keys_raise(buf):
    with pytest.raises(pw.WireTypeError):
        list(pw.iter_fields(buf, 0, len(buf)))


def test_overlong_varint_raises():
    buf = b"\xff" * 11 + b"\x01"
    with pytest.raises(pw.ProtoDecodeError, match="longer than 10 bytes"):
        pw.read_varint(buf, 0, len(buf))


def test_expect_wire():
    pw.expect_wire(1, pw.LEN, pw.LEN, "XSpace")
    with pytest.raises(pw.WireTypeError, match="XSpace field 1"):
        pw.expect_wire(1, pw.VARINT, pw.LEN, "XSpace")


def test_garbage_never_escapes_as_another_exception():
    rng = random.Random(1234)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        buf = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
        try:
            for _f, wire, a, b in pw.iter_fields(buf, 0, len(buf)):
                if wire == pw.LEN:  # walk one level down like a reader would
                    list(pw.iter_fields(buf, a, b))
            outcomes["ok"] += 1
        except pw.ProtoDecodeError:
            outcomes["error"] += 1
    assert outcomes["error"] > 0  # random bytes are mostly not protobuf
