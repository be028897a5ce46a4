"""Typed exceptions of the public API. The CLI turns each into one line and a non-zero exit."""

from __future__ import annotations


class GpuProfError(Exception):
    """Base class of every error tb_gpuprof raises on purpose."""


class TraceReadError(GpuProfError):
    """A trace file is missing, unreadable, truncated, or not in a format we know.

    The message names the file and the problem in one line.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnknownFormatError(TraceReadError):
    """The file is none of Kineto JSON, XPlane protobuf or Nsight Systems SQLite."""


class EmptyProfileError(TraceReadError):
    """The file parsed but holds no GPU or CPU activity to analyze."""


class SchemaVersionError(GpuProfError):
    """A stored report was written by a newer tb_gpuprof whose schema we cannot read."""


class RunNotFoundError(GpuProfError):
    """A log directory or run holds no tb_gpuprof data."""


class StoredDataError(GpuProfError):
    """A stored gpuprof blob is corrupt, truncated or in an encoding we do not know."""


class ReportSchemaError(GpuProfError, ValueError):
    """A report does not match the typed report schema (tb_gpuprof/analysis/schema.py)."""
