"""The normalized profile model every reader produces and every analysis consumes.

Times are microseconds on one clock per profile (the reader's), durations too. Readers fill
what their format knows and leave the rest ``None``; analysis never assumes a field is set.
The per-event classes are msgspec Structs without GC tracking: a 1M-event trace must fit in a
few hundred MB and be built in about a second (a Struct is created about 4x faster than a
slotted dataclass, in 16 bytes less). They hold no reference cycles (nothing points back at
an event), which is what leaving them out of the cycle collector needs.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import msgspec

# GpuActivity.kind values
KERNEL = "kernel"
MEMCPY = "memcpy"
MEMSET = "memset"

# Annotation.kind values
STEP = "step"  # ProfilerStep#N, Keras/TF step markers, XPlane StepMarker
OPTIMIZER = "optimizer"  # Optimizer.step#AdamW.step
DATALOADER = "dataloader"  # enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__
USER = "user"  # record_function / NVTX / tf.profiler.TraceMe ranges


class GpuActivity(msgspec.Struct, gc=False):
    """One kernel, memcpy or memset that ran on a GPU."""

    kind: str
    name: str
    start_us: float
    dur_us: float
    device: int = 0
    stream: int = 0
    correlation: int | None = None  # links to RuntimeCall.correlation
    external_id: int | None = None  # links to CpuOp.external_id (Kineto)
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    registers: int | None = None  # per thread
    shared_mem: int | None = None  # bytes per block (static + dynamic)
    blocks_per_sm: float | None = None
    occupancy: float | None = None  # estimated achieved occupancy, percent
    bytes: int | None = None  # memcpy/memset size
    op: str | None = None  # framework op name when the format names it (tf_op, hlo_op, aten::...)
    op_type: str | None = None  # op type when known (Conv2D, MatMul, convolution, dot)


class CpuOp(msgspec.Struct, gc=False):
    """A framework operator on the host (aten::conv2d, TF op, ...)."""

    name: str
    start_us: float
    dur_us: float
    tid: int = 0
    external_id: int | None = None
    input_shapes: list[Any] | None = None
    input_types: list[str] | None = None
    flops: float | None = None
    stack: list[str] | None = None
    concrete_inputs: list[Any] | None = None  # scalar arguments (stride, padding, ...) as text


class RuntimeCall(msgspec.Struct, gc=False):
    """A CUDA runtime/driver API call on the host (cudaLaunchKernel, cudaMemcpyAsync, ...)."""

    name: str
    start_us: float
    dur_us: float
    tid: int = 0
    correlation: int | None = None
    external_id: int | None = None


class Annotation(msgspec.Struct, gc=False):
    """A named time range: iteration marker, optimizer step, data loading, user/NVTX range."""

    name: str
    start_us: float
    dur_us: float
    kind: str = USER
    on_gpu: bool = False  # a GPU-timeline projection of a host range (gpu_user_annotation)
    step: int | None = None  # the iteration number when the name carries one (ProfilerStep#17)


@dataclass(slots=True)
class DeviceInfo:
    id: int
    name: str = ""
    compute_major: int | None = None
    compute_minor: int | None = None
    num_sms: int | None = None
    total_memory: int | None = None  # bytes


@dataclass(slots=True)
class MemoryEvents:
    """The allocator's events (``torch.profiler(profile_memory=True)``'s ``[memory]``), one
    entry per allocation (``nbytes`` > 0) or free (< 0), as parallel arrays in time order:
    a window can hold millions, so no object per event. ``allocated``/``reserved`` are the
    allocator's totals for that device right after the event."""

    ts: array = field(default_factory=lambda: array("d"))  # µs
    nbytes: array = field(default_factory=lambda: array("q"))
    allocated: array = field(default_factory=lambda: array("q"))
    reserved: array = field(default_factory=lambda: array("q"))
    addr: array = field(default_factory=lambda: array("q"))
    device_type: array = field(default_factory=lambda: array("b"))  # 0 CPU, 1 CUDA (c10)
    device_id: array = field(default_factory=lambda: array("b"))  # -1 for the CPU
    tid: array = field(default_factory=lambda: array("q"))

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(slots=True)
class PythonCalls:
    """Python function calls (``torch.profiler(with_stack=True)``'s ``python_function``
    events), as parallel arrays: a window holds about as many as CPU ops."""

    start: array = field(default_factory=lambda: array("d"))  # µs
    dur: array = field(default_factory=lambda: array("d"))
    tid: array = field(default_factory=lambda: array("q"))
    name: list[str] = field(default_factory=list)  # interned: repeated names share one string

    def __len__(self) -> int:
        return len(self.start)


@dataclass(slots=True)
class Profile:
    """Everything a reader could get out of one trace file."""

    source: str  # path it was read from
    format: str  # "kineto" | "xplane" | "nsys"
    gpu: list[GpuActivity] = field(default_factory=list)
    cpu_ops: list[CpuOp] = field(default_factory=list)
    runtime: list[RuntimeCall] = field(default_factory=list)
    annotations: list[Annotation] = field(default_factory=list)
    devices: list[DeviceInfo] = field(default_factory=list)
    # Free-form facts the format records: framework/CUDA versions, distributed info
    # ({"rank": 0, "world_size": 2, "backend": "nccl"}), trace flags (record_shapes, with_flops).
    metadata: dict[str, Any] = field(default_factory=dict)
    memory: MemoryEvents | None = None  # allocator events, when the profiler recorded them
    python: PythonCalls | None = None  # Python calls, when the profiler recorded stacks

    @property
    def kernels(self) -> list[GpuActivity]:
        return [a for a in self.gpu if a.kind == KERNEL]
