"""Model TFLOP/s and MFU of each iteration after a window: the scalars the hooks' flush thread
writes, from the window's report (docs/metrics.md).

A leaf module (it imports store.layout's names only) because the flush thread imports it in
the training process: importing throughput.py there (its classifier compiles its kernel-name
patterns at import) held the GIL for 32-35 ms, once, at a random step after the first window.
"""

from __future__ import annotations

from typing import Any

from ..store.layout import MFU_TAG, MODEL_TFLOPS_TAG


def section_scalars(section: dict[str, Any], iteration_ms: float) -> dict[str, float]:
    """``gpuprof/model_tflops`` and ``gpuprof/mfu_pct`` for one iteration after a window, from
    the report's ``throughput`` section.

    The window's FLOPs per iteration over this iteration's wall time (the always-on
    ``gpuprof/iteration_time_ms``); MFU over the section's ``peak_tflops``, the GPU's dense
    BF16 Tensor Core peak (or the caller's ``peak_tflops=``), whatever the run's precision, as
    the report's MFU. Empty when the window counted no FLOPs or the time is not positive; no
    MFU when no peak is known. Cheap: two divisions and a few dict lookups.
    """
    flops = section.get("flops_per_iteration")
    if not flops or not iteration_ms or iteration_ms <= 0:
        return {}
    tflops = flops / (iteration_ms * 1e-3) / 1e12
    out = {MODEL_TFLOPS_TAG: tflops}
    peak = section.get("peak_tflops")
    if peak:
        out[MFU_TAG] = 100.0 * tflops / peak
    return out
