"""The report's typed contract: msgspec Structs for the report and each of its sections.

``build_report`` returns a plain dict (the rules and the store read and write dicts); these
types say what that dict holds. :func:`validate_report` checks a dict against them, the JSON
Schema (``tb-gpuprof schema``) is generated from them, and the frontend's report types
(frontend/src/report.gen.ts) are generated from that schema. A field added to the report and
not here fails validation, so the three cannot drift apart.

Open-ended maps stay maps: hook-recorded ``flags``, a rule's ``evidence``, NVML metric means.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from .. import REPORT_SCHEMA_VERSION
from ..errors import ReportSchemaError

# Reports built while this is "1" raise on a schema mismatch instead of warning (the tests set
# it for the whole session, child processes included).
STRICT_ENV = "TB_GPUPROF_STRICT_SCHEMA"

Number = float  # msgspec accepts ints for float fields
# A field added within schema version 1: reports stored before it lack it (readers must cope),
# a report built now always has it (check_built_report).
Later = UnsetType
Severity = Literal["high", "medium", "low"]
BoundClass = Literal["gpu", "copy", "communication", "dispatch", "host", "data_wait", "sync",
                     "mixed", "no_gpu"]


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A report object: every field declared, none unknown."""


class Source(_Section, kw_only=True):
    path: str
    format: str  # kineto | xplane | nsys
    events: int


class DistributedInfo(_Section, kw_only=True):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None


class System(msgspec.Struct, kw_only=True):
    """What the trace and the capturing hook recorded. The one open object: ``build_report``'s
    ``env`` is merged in, so a caller's own keys (a benchmark's ``batch_size``) are kept."""
    gpu_name: str | None
    compute_capability: str | None
    num_sms: int | None
    gpu_memory_bytes: int | None
    cuda_runtime: str | None
    cuda_driver: str | None
    framework: str | None
    framework_version: str | None
    flags: dict[str, Any]
    distributed: DistributedInfo | None
    gpu_count: int | None = None
    cudnn: str | None = None
    keras_backend: str | None = None
    backend_version: str | None = None
    jaxlib_version: str | None = None
    steps_per_execution: int | None = None
    batch_end_dispatch: str | None = None
    memory_peak_bytes: int | None = None
    data_wait_mean_ms: Number | None = None


class IterationBreakdown(_Section, kw_only=True):
    tc_compute: Number
    non_tc_compute: Number
    memory: Number
    communication: Number
    layout: Number
    idle: Number


class IterationItem(_Section, kw_only=True):
    step: int | None
    start_us: Number
    wall_ms: Number
    gpu_busy_ms: Number
    breakdown_ms: IterationBreakdown


class Iterations(_Section, kw_only=True):
    method: Literal["profiler_step", "key_range", "optimizer_step", "whole_trace"]
    key: str | None
    count: int
    range: list[int]
    range_kind: Literal["step", "index"] | Later = UNSET
    mean_ms: Number
    median_ms: Number
    min_ms: Number
    max_ms: Number
    p95_ms: Number
    gpu_busy_mean_ms: Number
    unprofiled_median_ms: Number | Later | None = UNSET
    unprofiled_source: str | Later | None = UNSET  # gpu_events | wall_time from the hooks
    profiler_overhead_ratio: Number | Later | None = UNSET
    items: list[IterationItem]


class SyncSite(_Section, kw_only=True):
    op: str
    source: str | None
    count_per_iteration: Number
    blocked_ms_per_iteration: Number


class Bottleneck(_Section, kw_only=True):
    bound: BoundClass
    verdict: str
    basis: Literal["unprofiled", "profiled"]
    mean_ms: dict[str, Number]
    mean_pct: dict[str, Number]
    corrected_ms: dict[str, Number] | None
    corrected_pct: dict[str, Number] | None
    items: list[dict[str, Number | None]]  # {"step": ..., <class>: ms}
    sync_sites: list[SyncSite] | Later = UNSET
    glue_max_us: Number
    note: str | None
    # names in the trace that show compiled code runs (Inductor/Triton kernels, compiled
    # regions, CUDA graph launches), at most 5; empty when none
    compiled_code: list[str] | Later = UNSET
    # host syncs inside the forward (data-dependent ops: .item(), nonzero, ...): the places
    # torch.compile breaks its graph
    graph_breaks: list[SyncSite] | Later = UNSET
    # host time per iteration before the forward's first kernel launch in data-loader
    # fetches and op-less host work (the input's preparation), profiled; None: no forward
    input_prep_ms: Number | Later | None = UNSET
    # with graph breaks: host framework time per iteration in the forward from its first to
    # its last sync, plus the same share of the backward's (per-branch dispatch), profiled;
    # and that share of the forward's framework time; None without graph breaks
    branch_dispatch_ms: Number | Later | None = UNSET
    branch_share: Number | Later | None = UNSET


class Kernel(_Section, kw_only=True):
    name: str
    demangled: str
    kind: str  # kernel | memcpy | memset
    count: int
    total_us: Number
    mean_us: Number
    min_us: Number
    max_us: Number
    pct: Number
    uses_tensor_cores: bool
    precision: str
    category: str
    tc_eligible: bool
    ops: list[str]
    grid: list[int] | None
    block: list[int] | None
    registers: int | None
    shared_mem: int | None
    occupancy_pct: Number | None
    flops: Number | None
    bytes: Number | None
    tflops: Number | None
    source: str | None
    pct_of_sol: Number | Later | None = UNSET  # roofline.py: % of speed of light
    # what ``flops`` are: "counted" (the op's math, which the kernel executes: ``tflops`` is its
    # rate), "direct_conv_equivalent" (an FFT/Winograd convolution's share of the direct
    # convolution's FLOPs: no ``tflops``, not on the roofline), "over_pipe_peak" (a rate above
    # its pipe's peak, so not its work: no ``tflops``); null without FLOPs
    flops_basis: Literal["counted", "direct_conv_equivalent", "over_pipe_peak"] | Later | None \
        = UNSET


class TensorCores(_Section, kw_only=True):
    tc_us: Number
    eligible_not_tc_us: Number
    other_us: Number
    memory_us: Number
    tc_pct: Number
    eligible_not_tc_pct: Number
    other_pct: Number
    memory_pct: Number
    tc_kernel_efficiency_pct: Number | None


class IdleAttribution(_Section, kw_only=True):
    data_loading: Number
    cpu_ops: Number
    launch_overhead: Number
    synchronization: Number
    other: Number


class Breakdown(_Section, kw_only=True):
    wall_us: Number
    gpu_busy_us: Number
    tc_compute_us: Number
    non_tc_compute_us: Number
    memory_us: Number
    communication_us: Number
    layout_us: Number
    idle_us: Number
    idle_attribution_us: IdleAttribution


class Phases(_Section, kw_only=True):
    method: Literal["autograd"]
    forward_ms: Number
    backward_ms: Number
    optimizer_ms: Number
    unattributed_ms: Number | Later = UNSET


class TelemetryGpu(_Section, kw_only=True):
    gpu: int
    nvml_index: int | None
    uuid: str | None
    name: str | None
    mig: bool
    samples: int
    mean: dict[str, Number]
    max: dict[str, Number]
    clock_events_pct: dict[str, Number]
    clock_event_power_pct: Number | None
    clock_event_thermal_pct: Number | None
    gpm: bool | None
    lost: bool
    unsupported: dict[str, Any]


class Telemetry(_Section, kw_only=True):
    """NVML window averages (:meth:`tb_gpuprof.nvml.NvmlSampler.window_summary`)."""
    source: Literal["nvml"]
    interval_s: Number
    samples: int
    duration_s: Number
    gpus: list[TelemetryGpu]
    driver_version: str | None
    unavailable_reason: str | None
    warnings: list[str]


class DistributedMeans(_Section, kw_only=True):
    wall_ms: Number
    compute_ms: Number
    communication_ms: Number
    overlap_ms: Number
    exposed_ms: Number


class DistributedIteration(_Section, kw_only=True):
    step: int | None
    wall_ms: Number
    compute_ms: Number
    communication_ms: Number
    overlap_ms: Number
    exposed_ms: Number


class Collective(_Section, kw_only=True):
    name: str
    count: int
    total_us: Number


class Distributed(_Section, kw_only=True):
    rank: int | None
    world_size: int | None
    backend: str | None
    communication_source: Literal["gpu_kernels", "cpu_ranges"] | None
    compute_source: Literal["gpu_kernels", "cpu_ops"]
    communication_us: Number
    compute_us: Number
    overlap_us: Number
    exposed_us: Number
    overlap_pct: Number | None
    communication_pct: Number
    exposed_pct: Number
    mean_ms: DistributedMeans
    per_iteration: list[DistributedIteration]
    collectives: list[Collective]


class Throughput(_Section, kw_only=True):
    flops_per_iteration: Number | None
    flops_by_category: dict[str, Number]
    math_time_counted_pct: Number | None
    iteration_ms: Number | None
    time_source: Literal["unprofiled_median_ms", "window_median_ms"]
    achieved_tflops: Number | None
    precision: Literal["fp32", "tf32", "bf16", "fp16", "fp8"] | None
    precision_source: Literal["kernel_flops", "precision_us", "flags", "unknown"]
    peak_tflops: Number | None  # MFU's: dense BF16 Tensor Core peak, or peak_tflops=
    peak_source: str
    mfu_pct: Number | None  # 100 * achieved_tflops / peak_tflops
    # the precision of peak_tflops: "bf16" ("fp16" on GPUs without BF16); null for peak_tflops=
    peak_precision: Literal["bf16", "fp16"] | Later | None = UNSET
    # the peak of the precision the run computes in (``precision``), and its utilisation
    precision_peak_tflops: Number | Later | None = UNSET
    precision_peak_source: str | Later = UNSET
    precision_utilization_pct: Number | Later | None = UNSET


class RooflineCeilings(_Section, kw_only=True):
    gpu: str  # the peak table's row (analysis/peaks.py)
    hbm_gbps: Number | None
    memory: str
    tflops: dict[str, Number]  # precision -> dense peak TFLOP/s (int8: TOPS)


class RooflinePoint(_Section, kw_only=True):
    name: str
    demangled: str
    time_us: Number
    count: int
    precision: str | None  # the data's precision (colour)
    ceiling: str | None  # the peak-table precision its compute is bounded by
    category: str
    flops: Number
    bytes: Number
    intensity: Number  # FLOP/byte
    achieved_tflops: Number
    ceiling_tflops: Number | None  # attainable at this intensity: min(peak, intensity * bw)
    pct_of_sol: Number
    bound: Literal["memory", "compute"]


class RooflineLeftOut(_Section, kw_only=True):
    reason: str
    kernels: int
    time_us: Number


class OverCeiling(_Section, kw_only=True):
    name: str
    pct_of_sol: Number
    why: str


class Roofline(_Section, kw_only=True):
    """Kernels against the GPU's ceilings (docs/roofline.md)."""
    gpu_name: str | None
    ceilings: RooflineCeilings | None
    ceilings_source: str
    kernels_total: int
    kernels_plotted: int
    points: list[RooflinePoint]
    left_out: list[RooflineLeftOut]
    over_ceiling: list[OverCeiling]


class VerifiedSaving(_Section, kw_only=True):
    """A fix measured inside the training loop (``verify=`` on the hooks; analysis/verify.py):
    blocks of iterations without and with it, interleaved ABBA, after a warm-up."""
    status: Literal["measured", "no_change", "failed", "not_verifiable", "stopped"]
    verdict: str  # one line: "saves X% [lo%, hi%]", "no measurable change (within ±Y%)", ...
    saving_pct: Number | None = None  # 100 (1 - ratio)
    interval_pct: list[Number] | None = None  # [lo, hi] of saving_pct
    ratio: Number | None = None  # iteration time with the fix / without it
    blocks: int = 0  # completed blocks, warm-up excluded
    iterations: int = 0  # every iteration the trial ran, warm-up included
    seconds: Number = 0.0  # their recorded time
    reason: str | None = None  # why not verifiable, why failed or stopped
    warmup_seconds: Number | None = None  # the fix's first switch-on (compile: its compile time)
    # the fix this one was measured after: on in both arms, as the prediction counts this
    # fix's saving after it (Retiming.after: bf16 autocast after TF32)
    measured_after: str | None = None
    # iterations per block in this trial: the verification's block_iterations, or fewer where
    # this trial's share of the time cap could not hold MIN_PAIRS pairs of full blocks
    block_iterations: int | None = None
    # each completed block pair's mean ms per iteration, [with the fix, without it], in the
    # order they ran: what the interval was computed from (an outlier block shows here)
    pairs_ms: list[list[Number]] | None = None


class Recommendation(_Section, kw_only=True):
    id: str
    severity: Severity
    title: str
    problem: str
    evidence: dict[str, Any]
    fix: dict[str, str]  # framework -> code (pytorch, keras, jax; "system" for NVML rules)
    estimated_saving_ms: Number | None
    estimated_saving_pct: Number | None
    # set when the saving was re-timed (analysis/savings.py)
    estimated_range_pct: list[Number] | None = None  # [low, high]; None: one value
    predicted_iteration_ms: Number | None = None
    estimate_basis: str | None = None
    # the most the fix can remove per iteration (the time of the work it changes): the
    # estimated saving never exceeds it; None where no rule bound applies
    removable_ms: Number | None = None
    verified: VerifiedSaving | None = None  # measured in the loop, where verify= ran it


class MemorySeries(_Section, kw_only=True):
    """Allocator totals after each kept event, ms from ``Memory.t0_us``."""
    t_ms: list[Number]
    allocated_bytes: list[int]
    reserved_bytes: list[int] | None  # None: the allocator reports no reserve (CPU)
    downsampled_from: int  # events in the window


class MemoryPeak(_Section, kw_only=True):
    allocated_bytes: int
    reserved_bytes: int | None
    t_ms: Number
    step: int | None


class MemoryHolder(_Section, kw_only=True):
    """Allocations live at the peak made by one op (at one source line when stacks were
    recorded)."""
    op: str
    source: str | None
    stack: list[str] | None
    bytes: int
    allocations: int


class MemoryPartHolder(_Section, kw_only=True):
    """What holds a part's bytes: a module (recorded parameters, gradients, optimizer state)
    or the op that allocated them (at one source line when stacks were recorded)."""
    module: str | None
    op: str | None
    source: str | None
    bytes: int
    allocations: int


class MemoryPart(_Section, kw_only=True):
    part: Literal["parameters", "gradients", "optimizer_state", "activations", "temporaries",
                  "before_window"]
    bytes: int | None  # its share of the allocated bytes at the peak; None: not recorded
    tensor_bytes: int | None  # parameters, optimizer state: sum of numel * element size
    allocations: int
    holders: list[MemoryPartHolder]
    holders_total: int


class MemoryAllocatorStop(_Section, kw_only=True):
    """The CUDA caching allocator at the window's stop (torch.cuda.memory_stats/snapshot)."""
    reserved_bytes: int | None
    allocated_bytes: int | None
    inactive_split_bytes: int | None
    largest_free_block_bytes: int | None


class MemoryFragmentation(_Section, kw_only=True):
    bytes: int  # reserved but not allocated at the peak
    at_stop: MemoryAllocatorStop | None


class MemoryOutsidePytorch(_Section, kw_only=True):
    bytes: int  # nvml_used_bytes - reserved_bytes
    nvml_used_bytes: int
    reserved_bytes: int
    scope: Literal["process", "device"]


class MemoryPeakParts(_Section, kw_only=True):
    """The peak decomposed (analysis/memory_parts.py)."""
    allocated_bytes: int
    parts: list[MemoryPart]
    uncounted_bytes: int  # in the parts but not in allocated_bytes (the CPU allocator's)
    sum_matches_allocated: bool
    tensors_recorded: list[str]
    backward_passes: int
    fragmentation: MemoryFragmentation | None
    outside_pytorch: MemoryOutsidePytorch | None


class MemoryIteration(_Section, kw_only=True):
    step: int | None
    allocated_bytes: int
    reserved_bytes: int | None


class MemoryDevice(_Section, kw_only=True):
    device: str  # cuda:0 | cpu
    events: int
    series: MemorySeries
    peak: MemoryPeak
    max_reserved_bytes: int | None
    holders: list[MemoryHolder]
    holders_total: int
    held_before_window_bytes: int
    iterations: list[MemoryIteration]
    peak_parts: MemoryPeakParts | Later = UNSET


class MemoryNvml(_Section, kw_only=True):
    gpu: int | None
    name: str | None
    used_mib_mean: Number | None
    used_mib_max: Number | None
    total_mib: Number | None
    process_mib_max: Number | None


class Memory(_Section, kw_only=True):
    """The allocator over the window (analysis/memory.py)."""
    recorded: bool
    note: str | None  # how to get allocator events when the trace has none
    t0_us: Number
    devices: list[MemoryDevice]
    nvml: list[MemoryNvml] | None
    scalar_tags: dict[str, str]  # the hook's per-iteration peak scalars


class Refreshed(_Section, kw_only=True):
    """Set on a report rebuilt from a run's stored trace because the stored report was made by
    another analysis (tb_gpuprof/pipeline.py): what was stored, and how it was rebuilt."""
    from_generator: str  # the stored report's ``generator``
    from_analysis_id: str | None  # the stored report's ``analysis_id`` (None: before it existed)
    context: Literal["stored", "recovered"]  # the window's stored context, or one recovered
    # from the stored report (runs recorded before contexts were stored)
    reason: str  # one sentence for the user


class Verification(_Section, kw_only=True):
    """What ``verify=`` did after the window: the trials of the top fixes in the running loop,
    and the check that training went on as before (analysis/verify.py, docs/verify.md)."""
    requested: list[str]  # fix ids asked for (``verify=True``: the report's top fixes)
    block_iterations: int | None  # iterations per block, sized from the loop's own noise
    noise_pct: Number | None  # block-to-block variation at that size (CV of block means)
    # the noise run's curve: block size (iterations) -> CV of block means, in percent
    noise_curve_pct: dict[str, Number] | None = None
    iterations: int  # every iteration the verification ran, the noise run included
    seconds: Number
    before_ms: Number | None  # median iteration before the trials (the noise run)
    after_ms: Number | None  # median iteration after them, every setting restored
    after_within_noise: bool | None  # after_ms within the before run's spread
    restored: bool  # every setting a switch touched is as it was (checked by snapshot)
    status: Literal["done", "capped", "failed"]
    note: str | None = None
    trials: dict[str, VerifiedSaving]  # fix id -> its trial (a null "aa" trial too)


class Report(_Section, kw_only=True):
    """The whole report (docs/report-schema.md)."""
    schema_version: int
    generator: str
    analysis_id: str | Later = UNSET  # analysis/identity.py: the code that made this report
    refreshed: Refreshed | None = None
    source: Source
    system: System
    iterations: Iterations
    bottleneck: Bottleneck | Later = UNSET
    gpu_time_us: Number
    kernels: list[Kernel]
    kernels_total: int
    tensor_cores: TensorCores
    precision_us: dict[str, Number]
    category_us: dict[str, Number]
    breakdown: Breakdown
    phases: Phases | None
    telemetry: Telemetry | None
    distributed: Distributed | Later | None = UNSET
    throughput: Throughput | Later = UNSET
    memory: Memory | Later = UNSET
    roofline: Roofline | Later = UNSET
    recommendations: list[Recommendation]
    warnings: list[str]
    verification: Verification | None = None


def validate_report(report: dict[str, Any]) -> Report:
    """The report as typed Structs; :class:`ReportSchemaError` names the first mismatch."""
    try:
        typed = msgspec.convert(report, Report)
    except msgspec.ValidationError as e:
        raise ReportSchemaError(f"report does not match the schema: {e}") from None
    if typed.schema_version != REPORT_SCHEMA_VERSION:
        raise ReportSchemaError(f"report schema_version {typed.schema_version}, this schema "
                                f"is version {REPORT_SCHEMA_VERSION}")
    return typed


def _unset_fields(value: Any, path: str) -> list[str]:
    """Paths of the ``Later`` fields a typed report lacks."""
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _unset_fields(v, f"{path}[{i}]")]
    if not isinstance(value, msgspec.Struct):
        return []
    out = []
    for name in value.__struct_fields__:
        v = getattr(value, name)
        out += [f"{path}.{name}"] if v is UNSET else _unset_fields(v, f"{path}.{name}")
    return out


def validate_built_report(report: dict[str, Any]) -> Report:
    """:func:`validate_report`, and every field this version writes is there."""
    typed = validate_report(report)
    missing = _unset_fields(typed, "$")
    if missing:
        raise ReportSchemaError(f"report lacks {', '.join(missing[:5])}")
    return typed


def check_built_report(report: dict[str, Any]) -> None:
    """build_report's last step: a mismatch raises under STRICT_ENV (tests), else it becomes
    one of the report's warnings (a user's analysis is not lost to a schema slip)."""
    try:
        validate_built_report(report)
    except ReportSchemaError as e:
        if os.environ.get(STRICT_ENV) == "1":
            raise
        report["warnings"].append(f"tb_gpuprof bug, please report: {e}")


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of :class:`Report`, sections under ``$defs``."""
    return msgspec.json.schema(Report)


__all__ = ["STRICT_ENV", "Recommendation", "Report", "ReportSchemaError", "check_built_report",
           "json_schema", "validate_built_report",
           "validate_report"]
