"""NVML telemetry: a background sampler (dmon fields, clock events, Hopper GPM activity),
topology like ``nvidia-smi topo -m`` and ``tb-gpuprof dmon``. The advice read from them lives
with the other recommendation rules, in tb_gpuprof/analysis/rules/nvml.py.

Uses NVIDIA's ``nvidia-ml-py`` (import name ``pynvml``) lazily: importing this package does not
load libnvidia-ml. Without a driver or GPU the sampler reports ``unavailable_reason`` and the
caller carries on; :func:`topology` and ``dmon`` raise :class:`NvmlUnavailableError`.
"""

from __future__ import annotations

from .backend import NvmlUnavailableError
from .sampler import DEFAULT_INTERVAL_S, NvmlSampler, Sample
from .topology import topology

__all__ = ["DEFAULT_INTERVAL_S", "NvmlSampler", "NvmlUnavailableError", "Sample", "topology"]
