"""Small Kineto (torch.profiler Chrome trace) files with chosen kernel names, for the browser
tests (a hostile kernel name) and the dashboard benchmark (thousands of distinct kernels).

The layout follows what torch.profiler writes: ProfilerStep#N ranges, an aten op per launch,
a cudaLaunchKernel linked by correlation id, and the kernel on a GPU stream with its launch
configuration. The files then go through the real `tb-gpuprof import`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HOSTILE_KERNEL = '<img src=x onerror="window.__xss=1">'


@dataclass(frozen=True)
class SynthKernel:
    name: str
    dur_us: float
    op: str = "aten::mm"
    grid: tuple[int, int, int] = (132, 1, 1)
    block: tuple[int, int, int] = (256, 1, 1)
    registers: int = 64


def write_kineto_trace(path: Path, kernels: Sequence[SynthKernel], steps: int = 3,
                       first_step: int = 10, memory: bool = False) -> Path:
    """Write a trace where every step launches each kernel once, back to back on one stream.
    ``memory``: each op also allocates ``MEMORY_UNIT`` times its 1-based position on GPU 0
    (a ``[memory]`` event, as profile_memory=True writes them), freed at the step's end."""
    events: list[dict] = []
    corr = 0
    t = 1_000.0
    allocated = 0
    for s in range(first_step, first_step + steps):
        step_start = t
        cpu_t = t
        gpu_t = t + 5.0
        live: list[tuple[int, int]] = []
        for pos, k in enumerate(kernels, 1):
            if memory:
                allocated += pos * MEMORY_UNIT
                live.append((0x7F0000000000 + corr * 4096, pos * MEMORY_UNIT))
                events.append(_memory_event(cpu_t + 0.5, live[-1][0], live[-1][1], allocated))
            corr += 1
            events.append({"ph": "X", "cat": "cpu_op", "name": k.op, "pid": 1, "tid": 1,
                           "ts": cpu_t, "dur": 4.0,
                           "args": {"External id": corr, "Input Dims": [[64, 64], [64, 64]],
                                    "Input type": ["c10::BFloat16", "c10::BFloat16"]}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 1, "tid": 1, "ts": cpu_t + 1.0, "dur": 2.0,
                           "args": {"correlation": corr, "External id": corr}})
            gpu_t = max(gpu_t, cpu_t + 3.0)
            events.append({"ph": "X", "cat": "kernel", "name": k.name, "pid": 0, "tid": 7,
                           "ts": gpu_t, "dur": k.dur_us,
                           "args": {"device": 0, "stream": 7, "correlation": corr,
                                    "External id": corr, "grid": list(k.grid),
                                    "block": list(k.block), "registers per thread": k.registers,
                                    "shared memory": 0}})
            gpu_t += k.dur_us + 1.0
            cpu_t += 5.0
        t = max(cpu_t, gpu_t) + 10.0
        for addr, size in live:
            allocated -= size
            events.append(_memory_event(t - 5.0, addr, -size, allocated))
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}",
                       "pid": 1, "tid": 1, "ts": step_start, "dur": t - step_start,
                       "args": {"External id": 0}})
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
                              "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
        "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
        "traceEvents": events,
    }
    text = json.dumps(trace, indent=1)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)
    return path


MEMORY_UNIT = 64 << 20  # bytes an op allocates per position in the step


def _memory_event(ts: float, addr: int, nbytes: int, allocated: int) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
            "tid": 1, "ts": ts,
            "args": {"Total Reserved": 2 * (8 * MEMORY_UNIT), "Total Allocated": allocated,
                     "Bytes": nbytes, "Device Id": 0, "Device Type": 1, "Addr": addr}}


def hostile_kernels() -> list[SynthKernel]:
    """A GEMM, an elementwise kernel and one whose name is an HTML injection attempt."""
    return [
        SynthKernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
                    400.0, op="aten::mm"),
        SynthKernel(HOSTILE_KERNEL, 250.0, op="aten::add"),
        SynthKernel("void at::native::vectorized_elementwise_kernel<4, "
                    "at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, "
                    "at::native::FillFunctor<float>, at::detail::Array<char*, 1>)", 50.0,
                    op="aten::fill_"),
    ]


def many_kernels(n: int) -> list[SynthKernel]:
    """``n`` distinct kernels with spread-out durations (a large model's kernel zoo)."""
    ops = ("aten::mm", "aten::add", "aten::mul")
    return [SynthKernel(f"void synth_kernel_{i:05d}<float, {i % 7}>(float*, int)",
                        1.0 + (i * 37 % 500) / 10.0, op=ops[i % 3])
            for i in range(n)]
