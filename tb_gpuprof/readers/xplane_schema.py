"""The XSpace message schema, built at import, for protobuf's C decoder (upb).

Wire-compatible with tsl/profiler/protobuf/xplane.proto but our own: no generated code from
TensorFlow or XProf, and two deliberate differences that make decoding lazy.

* ``XSpace.planes`` and ``XPlane.lines`` are declared ``bytes``. On the wire an embedded
  message and a bytes field are the same (length-delimited), so parsing an XSpace only
  slices out each plane, and the reader parses only the planes it uses (tools that rewrite
  lines, such as benchmarks/scale_xplane.py, parse planes with :data:`XPlane`).
* ``XPlaneLines`` is an XPlane whose lines keep each event as ``bytes`` (``XLineEvents``):
  one parse of a plane gives every line's header and its events as byte strings, with no
  message per event. The reader decodes those bytes column-wise (xplane_columns.py) and
  parses with :data:`XEvent` only the events it must.

Maps (``event_metadata``, ``stat_metadata``) are declared as the repeated entry messages they
are on the wire. Strings are ``bytes`` where a producer might write invalid UTF-8 (stat
values and names: XProf writes raw kernel names), so decoding never fails on them; the
reader decodes with ``errors="replace"`` like the wire decoder did.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_T = descriptor_pb2.FieldDescriptorProto
PACKAGE = "tb_gpuprof.xplane"

# message name -> fields (name, number, type, label, message type name or None, oneof index)
_OPT, _REP = _T.LABEL_OPTIONAL, _T.LABEL_REPEATED
_SCHEMA: dict[str, list[tuple[str, int, int, int, str | None, int | None]]] = {
    "XSpace": [
        ("planes", 1, _T.TYPE_BYTES, _REP, None, None),  # lazy XPlane
        ("errors", 2, _T.TYPE_BYTES, _REP, None, None),
        ("warnings", 3, _T.TYPE_BYTES, _REP, None, None),
        ("hostnames", 4, _T.TYPE_BYTES, _REP, None, None),
    ],
    "XPlane": [
        ("id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("name", 2, _T.TYPE_BYTES, _OPT, None, None),
        ("lines", 3, _T.TYPE_BYTES, _REP, None, None),  # lazy XLine
        ("event_metadata", 4, _T.TYPE_MESSAGE, _REP, "EventMetadataEntry", None),
        ("stat_metadata", 5, _T.TYPE_MESSAGE, _REP, "StatMetadataEntry", None),
        ("stats", 6, _T.TYPE_MESSAGE, _REP, "XStat", None),
    ],
    "XPlaneHeader": [  # an XPlane's id and name only: picks the planes worth parsing
        ("id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("name", 2, _T.TYPE_BYTES, _OPT, None, None),
    ],
    "XPlaneLines": [  # an XPlane whose lines keep their events as bytes
        ("id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("name", 2, _T.TYPE_BYTES, _OPT, None, None),
        ("lines", 3, _T.TYPE_MESSAGE, _REP, "XLineEvents", None),
        ("event_metadata", 4, _T.TYPE_MESSAGE, _REP, "EventMetadataEntry", None),
        ("stat_metadata", 5, _T.TYPE_MESSAGE, _REP, "StatMetadataEntry", None),
        ("stats", 6, _T.TYPE_MESSAGE, _REP, "XStat", None),
    ],
    "EventMetadataEntry": [
        ("key", 1, _T.TYPE_INT64, _OPT, None, None),
        ("value", 2, _T.TYPE_MESSAGE, _OPT, "XEventMetadata", None),
    ],
    "StatMetadataEntry": [
        ("key", 1, _T.TYPE_INT64, _OPT, None, None),
        ("value", 2, _T.TYPE_MESSAGE, _OPT, "XStatMetadata", None),
    ],
    "XLine": [
        ("id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("name", 2, _T.TYPE_BYTES, _OPT, None, None),
        ("timestamp_ns", 3, _T.TYPE_INT64, _OPT, None, None),
        ("events", 4, _T.TYPE_MESSAGE, _REP, "XEvent", None),
        ("display_name", 11, _T.TYPE_BYTES, _OPT, None, None),
    ],
    "XEvent": [
        ("metadata_id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("offset_ps", 2, _T.TYPE_INT64, _OPT, None, 0),
        ("duration_ps", 3, _T.TYPE_INT64, _OPT, None, None),
        ("stats", 4, _T.TYPE_MESSAGE, _REP, "XStat", None),
        ("num_occurrences", 5, _T.TYPE_INT64, _OPT, None, 0),
    ],
    "XLineEvents": [  # an XLine with each event as its serialized bytes
        ("id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("name", 2, _T.TYPE_BYTES, _OPT, None, None),
        ("timestamp_ns", 3, _T.TYPE_INT64, _OPT, None, None),
        ("events", 4, _T.TYPE_BYTES, _REP, None, None),
        ("display_name", 11, _T.TYPE_BYTES, _OPT, None, None),
    ],
    "XStat": [
        ("metadata_id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("double_value", 2, _T.TYPE_DOUBLE, _OPT, None, 0),
        ("uint64_value", 3, _T.TYPE_UINT64, _OPT, None, 0),
        ("int64_value", 4, _T.TYPE_INT64, _OPT, None, 0),
        ("str_value", 5, _T.TYPE_BYTES, _OPT, None, 0),
        ("bytes_value", 6, _T.TYPE_BYTES, _OPT, None, 0),
        ("ref_value", 7, _T.TYPE_UINT64, _OPT, None, 0),
    ],
    "XEventMetadata": [
        ("id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("name", 2, _T.TYPE_BYTES, _OPT, None, None),
        ("display_name", 4, _T.TYPE_BYTES, _OPT, None, None),
        ("stats", 5, _T.TYPE_MESSAGE, _REP, "XStat", None),
    ],
    "XStatMetadata": [
        ("id", 1, _T.TYPE_INT64, _OPT, None, None),
        ("name", 2, _T.TYPE_BYTES, _OPT, None, None),
    ],
}
_ONEOFS = {"XEvent": "data", "XStat": "value"}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="tb_gpuprof/xplane.proto", package=PACKAGE,
                                            syntax="proto3")
    for msg_name, fields in _SCHEMA.items():
        msg = fd.message_type.add(name=msg_name)
        if msg_name in _ONEOFS:
            msg.oneof_decl.add(name=_ONEOFS[msg_name])
        for name, number, ftype, label, type_name, oneof in fields:
            f = msg.field.add(name=name, number=number, type=ftype, label=label)
            if type_name is not None:
                f.type_name = f".{PACKAGE}.{type_name}"
            if oneof is not None:
                f.oneof_index = oneof
    return fd


def _build() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()  # our own pool: no clash with any other xplane.proto
    pool.Add(_file_descriptor())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in _SCHEMA}


_CLASSES = _build()
XSpace = _CLASSES["XSpace"]
XPlane = _CLASSES["XPlane"]
XPlaneHeader = _CLASSES["XPlaneHeader"]
XPlaneLines = _CLASSES["XPlaneLines"]
XLine = _CLASSES["XLine"]
XLineEvents = _CLASSES["XLineEvents"]
XEvent = _CLASSES["XEvent"]
XEventMetadata = _CLASSES["XEventMetadata"]
XStat = _CLASSES["XStat"]

__all__ = ["XEvent", "XLine", "XLineEvents", "XPlane", "XPlaneHeader", "XPlaneLines", "XSpace",
           "XStat"]
