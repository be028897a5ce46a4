"""The NVML rules' old home: they live in tb_gpuprof/analysis/rules/nvml.py (re-exported)."""

from __future__ import annotations

from ..analysis.rules.nvml import *  # noqa: F403
from ..analysis.rules.nvml import (
    BATCH_MEMORY_PCT,
    MIN_SAMPLES,
    THROTTLE_PCT,
    batch_size_advice,
    gpu_placement_advice,
    nvml_recommendations,
    throttling_advice,
)

__all__ = ["BATCH_MEMORY_PCT", "MIN_SAMPLES", "THROTTLE_PCT", "batch_size_advice",
           "gpu_placement_advice", "nvml_recommendations", "throttling_advice"]
