"""``tb-gpuprof dmon``: a live per-GPU table like ``nvidia-smi dmon`` plus Hopper GPM columns,
optionally recorded into a run directory (scalars every interval, topology once).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from ..store import layout
from .backend import NvmlUnavailableError
from .sampler import NvmlSampler, Sample

# (header, unit, metric, decimals) in nvidia-smi dmon's order, then the GPM columns
COLUMNS: tuple[tuple[str, str, str, int], ...] = (
    ("pwr", "W", "power_w", 0),
    ("gtemp", "C", "gpu_temp_c", 0),
    ("mtemp", "C", "mem_temp_c", 0),
    ("sm", "%", "sm_util_pct", 0),
    ("mem", "%", "mem_util_pct", 0),
    ("enc", "%", "enc_util_pct", 0),
    ("dec", "%", "dec_util_pct", 0),
    ("mclk", "MHz", "mem_clock_mhz", 0),
    ("pclk", "MHz", "sm_clock_mhz", 0),
    ("smact", "%", "sm_active_pct", 0),
    ("smocc", "%", "sm_occupancy_pct", 0),
    ("tensor", "%", "tensor_active_pct", 0),
    ("dram", "%", "dram_bw_pct", 0),
)
HEADER_EVERY = 25  # reprint the header like nvidia-smi so it stays on screen


def header_lines() -> list[str]:
    names = "# gpu" + "".join(f"{c[0]:>7}" for c in COLUMNS)
    units = "# Idx" + "".join(f"{c[1]:>7}" for c in COLUMNS)
    return [names, units]


def format_row(sample: Sample) -> str:
    cells = []
    for _, _, metric, decimals in COLUMNS:
        value = sample.values.get(metric)
        cells.append("-" if value is None else f"{value:.{decimals}f}")
    return f"{sample.gpu:>5}" + "".join(f"{c:>7}" for c in cells)


def run_dmon(interval: float, count: int | None, logdir: str | None, *, backend: Any = None,
             out: TextIO | None = None, cuda_visible_devices: str | None = None) -> int:
    """Print one row per GPU per interval; ``count`` rows-per-GPU then exit (None: until ^C).

    Raises NvmlUnavailableError (the CLI prints it as one line, exit 2) when NVML is unusable.
    """
    out = out or sys.stdout
    sampler = NvmlSampler(interval_s=interval, backend=backend,
                          cuda_visible_devices=cuda_visible_devices)
    if not sampler.open():
        raise NvmlUnavailableError(sampler.unavailable_reason or "NVML unavailable")
    writer = None
    try:
        if logdir is not None:
            writer = _open_run(logdir, sampler)
        sampler.sample_once()  # GPM needs a first sample to difference against
        next_tick = time.monotonic() + interval
        step = 0
        while count is None or step < count:
            time.sleep(max(0.0, next_tick - time.monotonic()))
            next_tick += interval
            samples = sampler.sample_once()
            if step % HEADER_EVERY == 0:
                out.write("\n".join(header_lines()) + "\n")
            for s in samples:
                out.write(format_row(s) + "\n")
            out.flush()
            if writer is not None and samples:
                scalars = sampler.scalars(samples)
                writer.add_scalars({layout.scalar_tag(k): v for k, v in scalars.items()}, step,
                                   wall_time=samples[0].time)
            if sampler.all_lost:  # the sampler already warned (logging) for each GPU
                out.write("# all GPUs lost; stopping\n")
                break
            step += 1
        return 0
    finally:
        if writer is not None:
            writer.close()
        sampler.stop()


def _open_run(logdir: str, sampler: NvmlSampler) -> Any:
    from ..store.writer import EventWriter
    from .topology import topology_from_backend

    writer = EventWriter(logdir)
    topo = topology_from_backend(sampler.backend, [info.uuid for _, info in sampler.devices])
    writer.add_json(layout.TOPOLOGY_TAG, topo, step=0)
    return writer
