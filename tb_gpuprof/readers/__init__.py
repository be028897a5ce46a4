"""Trace readers: Kineto JSON, XPlane protobuf, Nsight Systems SQLite -> :class:`Profile`.

``load_profile(path)`` sniffs the format from the file's first bytes (not only its name) and
dispatches; every reader raises :class:`TraceReadError` subclasses for bad input.
"""

from __future__ import annotations

import gzip
import os
import zlib

from ..errors import TraceReadError, UnknownFormatError
from ..model import Profile

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


def sniff_format(path: str) -> str:
    """Return "kineto", "xplane" or "nsys" for ``path``; raise for anything else."""
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
    if head.startswith(SQLITE_MAGIC):
        return "nsys"
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as g:
                head = g.read(64)
        except EOFError:
            raise TraceReadError(path, "truncated gzip file (stream ends early)") from None
        except (OSError, zlib.error) as e:
            raise TraceReadError(path, f"corrupt gzip data: {e}") from None
        if not head:
            raise TraceReadError(path, "empty file (gzip holds no data)")
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "kineto"
    name = os.path.basename(path)
    if name.endswith((".nsys-rep", ".qdrep")):
        raise UnknownFormatError(
            path, "an Nsight Systems report; export it first: nsys export --type sqlite FILE")
    if name.endswith((".sqlite", ".sqlite3", ".db")):
        raise UnknownFormatError(path, "named like an SQLite export but is not an SQLite file")
    if name.endswith((".xplane.pb", ".pb")) or head[:1] in (b"\x0a", b"\x12", b"\x1a"):
        return "xplane"
    raise UnknownFormatError(
        path, "not a Kineto JSON trace, XPlane .xplane.pb or Nsight Systems .sqlite export"
    )


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read any supported trace file into the normalized model."""
    path = os.fspath(path)
    fmt = sniff_format(path)
    if fmt == "kineto":
        from .kineto import read_kineto

        return read_kineto(path)
    if fmt == "xplane":
        from .xplane import read_xplane

        return read_xplane(path)
    from .nsys import read_nsys

    return read_nsys(path)


__all__ = ["load_profile", "sniff_format"]
