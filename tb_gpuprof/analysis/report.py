"""Build the report (docs/report-schema.md) from a normalized Profile. Imports no framework.

:func:`build_report` only composes the stages in analysis/stages.py (each tested on its own in
tests/test_report_stages.py) and the sections other modules own (distributed, throughput, rules).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import REPORT_SCHEMA_VERSION, __version__
from ..model import Profile
from .bottleneck import host_timeline
from .columns import column_scope, forget
from .distributed import communication_section
from .identity import analysis_id
from .memory import memory_section
from .roofline import roofline_section
from .rules import recommend
from .schema import check_built_report
from .stages import (
    IterationSelection,
    KernelTable,
    Tally,
    assign_to_iterations,
    attribute_idle,
    bottleneck_stage,
    breakdown_section,
    host_probe_ms,
    iterations_section,
    kernel_table,
    phases_section,
    savings_stage,
    select_iterations,
    tally_activities,
    tensor_core_section,
    unprofiled_median,
)
from .throughput import throughput_section


def build_report(profile: Profile, *, iter_start: int | None = None, iter_stop: int | None = None,
                 key: str | None = None, env: dict[str, Any] | None = None,
                 telemetry: dict[str, Any] | None = None,
                 peak_tflops: float | None = None,
                 topology: dict[str, Any] | None = None,
                 memory_record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Analyze ``profile`` and return the JSON-able report (docs/report-schema.md).

    ``peak_tflops`` overrides the peak table's dense TFLOP/s for MFU (analysis/throughput.py).
    ``topology`` (tb_gpuprof.nvml.topology's dict, which a hook records) lets the
    ``gpu_placement`` rule judge the job's GPUs. ``memory_record`` (the PyTorch hook's record
    of the model's and optimizer's tensors, analysis/memory_parts.py) names the parameters
    and optimizer state in the memory peak's decomposition.
    """
    # the stages share the event lists' columns (analysis/columns.py)
    with column_scope(), _collector_paused():
        return _build(profile, iter_start, iter_stop, key, env, telemetry, peak_tflops,
                      topology, memory_record)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cycle collector off while the report is built: the stages make lists of every
    event's values (and no reference cycles of note), which the collector's young passes
    would walk again and again (5 % of the report of a 136 MB trace). Turned back on only
    when it was on: a report built beside another (threads) never leaves it off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build(profile: Profile, iter_start: int | None, iter_stop: int | None, key: str | None,
           env: dict[str, Any] | None, telemetry: dict[str, Any] | None,
           peak_tflops: float | None, topology: dict[str, Any] | None,
           memory_record: dict[str, Any] | None) -> dict[str, Any]:
    env = dict(env or {})
    unprofiled = env.pop("unprofiled", None)
    sel = select_iterations(profile, key, iter_start, iter_stop)
    linked = assign_to_iterations(profile, sel.windows)
    tally = tally_activities(linked.per_window, linked.times)
    activities = tally.activities()
    if activities is not None:  # the roofline reads these columns: the pairs' last reader is
        linked.per_window = []  # done (at 2 GB their launch contexts alone are ~100 MB)
    host = host_timeline(profile)  # what the host threads did: idle, bottleneck and savings read it
    idle = attribute_idle(profile, sel.windows, tally.windows, host.blocking)
    forget(profile.cpu_ops)  # its last column reader: the ops' coverage
    system = _system(profile, env)
    unprofiled_ms = unprofiled_median(unprofiled)
    bottleneck = bottleneck_stage(profile, linked, sel.windows, host, unprofiled_ms,
                                  system.get("framework"))
    report = _assemble(profile, sel, tally, kernel_table(tally, linked.op_flops),
                       iterations_section(sel, idle.items, unprofiled),
                       breakdown_section(sel.windows, idle, tally.totals), system, bottleneck,
                       telemetry)
    report["distributed"] = communication_section(profile, report)
    report["throughput"] = throughput_section(report, peak_tflops=peak_tflops)
    report["memory"] = memory_section(profile, linked.host_windows, telemetry, memory_record)
    report["roofline"] = roofline_section(report, profile, linked.per_window, linked.op_flops,
                                          activities)
    report["recommendations"] = recommend(report, topology=topology)
    savings_stage(report, profile, tally, host, sel.windows, unprofiled_ms,
                  host_probe_ms(unprofiled), linked.host_windows)
    check_built_report(report)
    return report


def _assemble(profile: Profile, sel: IterationSelection, tally: Tally,
              kernels: KernelTable, iterations: dict[str, Any],
              breakdown: dict[str, Any], system: dict[str, Any], bottleneck: dict[str, Any],
              telemetry: dict[str, Any] | None) -> dict[str, Any]:
    """The report's sections in their order; distributed, throughput and the recommendations
    are filled in after (they read the report)."""
    gpu_time = kernels.gpu_time_us
    warnings = sel.warnings
    window = profile.metadata.get("read_window")
    if window:  # a bounded read of a large Nsight export (readers/nsys.py)
        warnings.append(
            f"the export holds about {window['rows_in_export']:,} activity rows; to stay in "
            f"bounded memory only the iterations that start within its first "
            f"{window['max_rows']:,} rows were read (read_nsys(path, max_rows=None) reads all)")
    if not profile.gpu:
        warnings.append("the trace holds no GPU activity (CPU-only run or CUDA activities off); "
                        "Tensor Core and kernel views are empty")
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "generator": f"tb_gpuprof {__version__}",
        "analysis_id": analysis_id(),
        "refreshed": None,
        "source": {"path": profile.source, "format": profile.format,
                   "events": len(profile.gpu) + len(profile.cpu_ops) + len(profile.runtime)},
        "system": system,
        "iterations": iterations,
        "bottleneck": bottleneck,
        "gpu_time_us": round(gpu_time, 3),
        "kernels": kernels.rows,
        "kernels_total": len(kernels.rows),
        "tensor_cores": tensor_core_section(tally.totals, gpu_time),
        "precision_us": {k: round(v, 3) for k, v in sorted(tally.precision_us.items())},
        "category_us": {k: round(v, 3) for k, v in sorted(tally.category_us.items())},
        "breakdown": breakdown,
        "phases": phases_section(tally, gpu_time, len(sel.windows)),
        "telemetry": telemetry,
        "distributed": None,
        "recommendations": [],
        "warnings": warnings,
    }


def _cuda_version(v: Any) -> str | None:
    """13000 -> "13.0" (CUDA's integer encoding, as Kineto records it)."""
    if isinstance(v, int) and v >= 1000:
        return f"{v // 1000}.{(v % 1000) // 10}"
    return str(v) if v else None


def _system(profile: Profile, env: dict[str, Any] | None) -> dict[str, Any]:
    md = profile.metadata
    framework = md.get("framework") or ("pytorch" if profile.format == "kineto" else None)
    system: dict[str, Any] = {"gpu_name": None, "compute_capability": None, "num_sms": None,
                              "gpu_memory_bytes": None,
                              "cuda_runtime": md.get("cuda_runtime")
                              or _cuda_version(md.get("cuda_runtime_version")),
                              "cuda_driver": md.get("cuda_driver")
                              or _cuda_version(md.get("cuda_driver_version")),
                              "framework": framework,
                              "framework_version": md.get("framework_version"),
                              "flags": {}, "distributed": md.get("distributed")}
    if profile.devices:
        d = profile.devices[0]
        system["gpu_name"] = d.name or None
        if d.compute_major is not None:
            system["compute_capability"] = f"{d.compute_major}.{d.compute_minor or 0}"
        system["num_sms"] = d.num_sms
        system["gpu_memory_bytes"] = d.total_memory
        system["gpu_count"] = len(profile.devices)
    for k, v in (env or {}).items():
        if k == "flags":
            system["flags"].update(v or {})
        elif v is not None:
            system[k] = v
    return system
