"""What an analysis knows beside the trace: the hook's flags and model facts, the un-profiled
iteration time, NVML telemetry and topology, the iteration key and range, a peak override.

The window's analysis writes it next to the stored raw trace (``context.json``), so that a
later analysis of the same run (``tb-gpuprof report RUN --reanalyze``, and the automatic
refresh of a report that an older analysis made) knows all that the hook knew, and gives the
answer the hook would give today. Runs stored before contexts existed get one recovered from
their stored report (:func:`recover_context`): the report carried the same facts.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import StoredDataError
from ..model import Profile
from .report import build_report
from .verify import attach_verification

# The report's ``system`` fields that come from the trace, not from the hook: left out of a
# recovered context so that the re-analysis reads them from the trace again.
_TRACE_SYSTEM_FIELDS = ("gpu_count",)


class AnalysisContext(msgspec.Struct, kw_only=True, omit_defaults=True):
    """build_report's keywords besides the profile (analysis/report.py says what each is)."""
    key: str | None = None
    iter_start: int | None = None
    iter_stop: int | None = None
    env: dict[str, Any] | None = None  # the hook's system, flags and ``unprofiled``
    telemetry: dict[str, Any] | None = None
    peak_tflops: float | None = None
    topology: dict[str, Any] | None = None
    # what verify= measured in the running loop after the window (schema.Verification)
    verification: dict[str, Any] | None = None
    # the model's and optimizer's tensors at the window's stop (memory_parts.TensorRecord)
    memory_record: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


def context_from_dict(data: Any, where: str) -> AnalysisContext:
    """A stored context, checked; :class:`StoredDataError` names what is wrong with it."""
    try:
        return msgspec.convert(data, AnalysisContext)
    except msgspec.ValidationError as e:
        raise StoredDataError(f"{where}: the stored analysis context is unusable: {e}") from None


def build_report_in_context(profile: Profile, context: AnalysisContext) -> dict[str, Any]:
    """The report of ``profile`` with everything ``context`` holds: the one way from a trace
    and its context to a report, for the hooks' window and every re-analysis."""
    report = build_report(profile, key=context.key, iter_start=context.iter_start,
                          iter_stop=context.iter_stop, env=context.env,
                          telemetry=context.telemetry, peak_tflops=context.peak_tflops,
                          topology=context.topology, memory_record=context.memory_record)
    if context.verification:
        attach_verification(report, context.verification)
    return report


def recover_context(stored: dict[str, Any], topology: dict[str, Any] | None = None
                    ) -> AnalysisContext:
    """The context of a report stored before contexts were: its ``system`` (the hook's
    flags and model facts), its un-profiled time, telemetry and peak override, and the run's
    stored topology when there is one."""
    system = {k: v for k, v in (stored.get("system") or {}).items()
              if v is not None and k not in _TRACE_SYSTEM_FIELDS}
    iterations = stored.get("iterations") or {}
    if iterations.get("unprofiled_median_ms"):
        system["unprofiled"] = {"median_ms": iterations["unprofiled_median_ms"],
                                "source": iterations.get("unprofiled_source")}
    throughput = stored.get("throughput") or {}
    peak = (throughput.get("peak_tflops")
            if throughput.get("peak_source") == "peak_tflops argument" else None)
    key = iterations.get("key") if iterations.get("method") == "key_range" else None
    return AnalysisContext(key=key, env=system or None, telemetry=stored.get("telemetry"),
                           peak_tflops=peak, topology=topology,
                           verification=stored.get("verification"))


__all__ = ["AnalysisContext", "build_report_in_context", "context_from_dict",
           "recover_context"]
