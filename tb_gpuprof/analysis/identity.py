"""Which analysis made a report: ``analysis_id``, a digest of the code that turns a trace into
a report (the readers, the profile model, the analysis) and of the report schema's version.

A stored report whose ``analysis_id`` differs from the installed one was made by other code:
the CLI, ``compare`` and the plugin then rebuild it from the run's stored trace and context
(tb_gpuprof/pipeline.py, docs/storage.md). A digest of the sources, not a version number
bumped by hand, so that no change to the analysis can leave a stored report looking current.
Comments and docstrings count too: a false "stale" costs one re-analysis, a false "current"
would show an old answer.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from .. import REPORT_SCHEMA_VERSION

_PACKAGE = Path(__file__).resolve().parent.parent
# What decides a report's content, relative to the package (directories: their *.py files).
ANALYSIS_SOURCES = ("readers", "analysis", "model.py", "errors.py")
ID_LENGTH = 16  # hex digits (64 bits): enough to tell versions apart, short to show


def _source_files() -> list[Path]:
    files: list[Path] = []
    for name in ANALYSIS_SOURCES:
        path = _PACKAGE / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


@functools.cache
def analysis_id() -> str:
    """The installed analysis's identity (computed once per process: ~60 files, a few ms)."""
    digest = hashlib.sha256(f"schema {REPORT_SCHEMA_VERSION}\n".encode())
    for path in _source_files():
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:ID_LENGTH]


__all__ = ["ANALYSIS_SOURCES", "analysis_id"]
