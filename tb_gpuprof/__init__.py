"""tb_gpuprof: why is training slow on NVIDIA GPUs, and what to change.

Importing this package pulls in no deep-learning framework; the framework adapters
(:mod:`tb_gpuprof.torch`, :mod:`tb_gpuprof.keras`, :mod:`tb_gpuprof.lightning`) import theirs
lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"

REPORT_SCHEMA_VERSION = 1

__all__ = ["REPORT_SCHEMA_VERSION", "__version__"]
