"""Trace readers: Kineto JSON, XPlane protobuf, Nsight Systems SQLite -> :class:`Profile`.

``load_profile(path)`` sniffs the format from the file's first bytes (not only its name) and
dispatches through ``READERS``, the registry: one :class:`Reader` per format, a sniff and a
lazily imported read function. Every reader raises :class:`TraceReadError` subclasses for bad
input. Adding a format: docs/design.md, "How to add a trace reader".
"""

from __future__ import annotations

import gzip
import importlib
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import TraceReadError, UnknownFormatError
from ..model import Profile

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class Reader:
    """One trace format: how to recognise a file of it, and the function that reads it.

    ``sniff(head, name)`` sees the first 64 bytes (gunzipped when the file is gzip) and the
    file's base name. Content sniffers run first, in registry order; ``by_name_only`` ones
    (a guess from the name or a weak magic) run after the known misnamed files are refused.
    ``read`` is ``"module:function"`` under tb_gpuprof.readers, imported on first use so that
    sniffing imports no reader (or the function itself, for a reader defined elsewhere).
    ``options``: the keywords of :func:`load_profile` its function takes (others do not
    apply to the format and are not passed).
    """
    format: str
    sniff: Callable[[bytes, str], bool]
    read: str | Callable[[str], Profile]
    by_name_only: bool = False
    gzip_ok: bool = True  # False: the format is never gzipped (SQLite), sniffed on raw bytes
    options: frozenset[str] = frozenset()

    def load(self, path: str, **options: Any) -> Profile:
        taken = {k: v for k, v in options.items() if k in self.options}
        if callable(self.read):
            return self.read(path, **taken)
        module, function = self.read.split(":")
        reader: Callable[..., Profile] = getattr(
            importlib.import_module(f".{module}", __name__), function)
        return reader(path, **taken)


READERS: list[Reader] = [
    Reader("nsys", lambda head, name: head.startswith(SQLITE_MAGIC), "nsys:read_nsys",
           gzip_ok=False),
    Reader("kineto", lambda head, name: head.lstrip()[:1] in (b"{", b"["), "kineto:read_kineto",
           options=frozenset({"python_calls"})),
    Reader("xplane", lambda head, name: name.endswith((".xplane.pb", ".pb"))
           or head[:1] in (b"\x0a", b"\x12", b"\x1a"), "xplane:read_xplane", by_name_only=True),
]


def reader_for(fmt: str) -> Reader:
    for r in READERS:
        if r.format == fmt:
            return r
    raise KeyError(fmt)


def _head(path: str) -> bytes:
    if not os.path.exists(path):
        raise TraceReadError(path, "no such file")
    if os.path.isdir(path):
        raise TraceReadError(path, "is a directory, not a trace file")
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise TraceReadError(path, f"cannot read: {e.strerror or e}") from None
    if not head:
        raise TraceReadError(path, "empty file")
    return head


def _gunzipped_head(path: str) -> bytes:
    try:
        with gzip.open(path, "rb") as g:
            head = g.read(64)
    except EOFError:
        raise TraceReadError(path, "truncated gzip file (stream ends early)") from None
    except (OSError, zlib.error) as e:
        raise TraceReadError(path, f"corrupt gzip data: {e}") from None
    if not head:
        raise TraceReadError(path, "empty file (gzip holds no data)")
    return head


def _refuse_misnamed(path: str, name: str) -> None:
    """Files whose name promises a format their bytes do not hold: say what to do."""
    if name.endswith((".nsys-rep", ".qdrep")):
        raise UnknownFormatError(
            path, "an Nsight Systems report; export it first: nsys export --type sqlite FILE")
    if name.endswith((".sqlite", ".sqlite3", ".db")):
        raise UnknownFormatError(path, "named like an SQLite export but is not an SQLite file")


def sniff_format(path: str) -> str:
    """The registered format of ``path`` ("kineto", "xplane", "nsys", ...); raise for others."""
    raw = _head(path)
    name = os.path.basename(path)
    for r in READERS:  # formats sniffed on the raw bytes come before gzip is opened
        if not r.gzip_ok and not r.by_name_only and r.sniff(raw, name):
            return r.format
    head = _gunzipped_head(path) if raw.startswith(GZIP_MAGIC) else raw
    for r in READERS:
        if r.gzip_ok and not r.by_name_only and r.sniff(head, name):
            return r.format
    _refuse_misnamed(path, name)
    for r in READERS:
        if r.by_name_only and r.sniff(head, name):
            return r.format
    raise UnknownFormatError(
        path, "not a Kineto JSON trace, XPlane .xplane.pb or Nsight Systems .sqlite export"
    )


def load_profile(path: str | os.PathLike[str], *, python_calls: bool = True) -> Profile:
    """Read any supported trace file into the normalized model.

    ``python_calls=False`` leaves out ``Profile.python``, every Python call of a Kineto trace
    recorded with stacks (the Timeline's Python rows): a report never reads it, and on an
    LLM-scale trace it is tens of MB (about 32 bytes a call) held through the analysis.
    """
    path = os.fspath(path)
    return reader_for(sniff_format(path)).load(path, python_calls=python_calls)


__all__ = ["READERS", "Reader", "load_profile", "reader_for", "sniff_format"]
