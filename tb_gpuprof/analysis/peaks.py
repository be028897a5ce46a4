"""The one table of GPU ceilings: dense peak TFLOP/s per precision and memory bandwidth.

Used by MFU and the utilisation of the precision in use (throughput.py) and the roofline
(roofline.py). Every number is from NVIDIA's
datasheet for that GPU; docs/roofline.md lists the source of each row. Tensor Core figures are
**dense** (datasheets print them "with sparsity", twice these). Rows are matched on the
NVML/CUDA device name the report's ``system.gpu_name`` carries; the first row whose pattern
matches wins, so more specific names come first ("H100 NVL" before "H100", "L40S" before
"L4", "A100 80GB PCIe" before "A100").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Precisions the table knows. "fp32" and "fp64" are the CUDA-core (SIMT) rates; "tf32",
# "bf16", "fp16", "fp8", "int8" (TOPS) and "fp64_tc" are Tensor Core rates.
PRECISIONS = ("fp64", "fp64_tc", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True, slots=True)
class GpuPeaks:
    label: str
    pattern: str  # regular expression on the device name, case-insensitive
    tflops: dict[str, float]  # precision -> dense peak TFLOP/s (TOPS for int8)
    hbm_gbps: float | None  # device memory bandwidth, GB/s (10^9 bytes/s)
    memory: str = ""  # what memory the bandwidth is of (HBM3e 141 GB, GDDR6 24 GB)
    notes: tuple[str, ...] = field(default=())

    def peak(self, precision: str | None) -> float | None:
        return self.tflops.get(precision) if precision else None


def _hopper(fp64: float, fp32: float, tf32: float, bf16: float, fp8: float) -> dict[str, float]:
    # On every Hopper datasheet the FP64 Tensor Core rate equals the FP32 rate and INT8 (TOPS)
    # the FP8 rate.
    return {"fp64": fp64, "fp64_tc": fp32, "fp32": fp32,
            "tf32": tf32, "bf16": bf16, "fp16": bf16, "fp8": fp8, "int8": fp8}


_A100 = {"fp64": 9.7, "fp64_tc": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0,
         "fp16": 312.0, "int8": 624.0}

GPU_PEAKS: tuple[GpuPeaks, ...] = (
    GpuPeaks("H200 NVL", r"\bH200 NVL\b", _hopper(30.0, 60.0, 417.5, 835.5, 1670.5), 4800.0,
             "HBM3e 141 GB"),
    GpuPeaks("H200 SXM", r"\bH200\b", _hopper(34.0, 67.0, 494.5, 989.5, 1979.0), 4800.0,
             "HBM3e 141 GB"),
    # GH200 ships with 96 GB HBM3 (4.0 TB/s) or 144 GB HBM3e (4.9 TB/s): the name does not
    # say which, so no bandwidth (the roofline then has no memory ceiling).
    GpuPeaks("GH200", r"\bGH200\b", _hopper(34.0, 67.0, 494.5, 989.5, 1979.0), None,
             "HBM3 96 GB or HBM3e 144 GB"),
    GpuPeaks("H100 NVL", r"\bH100 NVL\b", _hopper(30.0, 60.0, 417.5, 835.5, 1670.5), 3900.0,
             "HBM3 94 GB"),
    GpuPeaks("H100 PCIe", r"\bH100\b.*\bPCIe\b", _hopper(26.0, 51.0, 378.0, 756.5, 1513.0),
             2000.0, "HBM2e 80 GB"),
    GpuPeaks("H100 SXM", r"\bH100\b", _hopper(34.0, 67.0, 494.5, 989.5, 1979.0), 3350.0,
             "HBM3 80 GB"),
    GpuPeaks("A100 80GB PCIe", r"\bA100\b.*80\s?GB.*PCIe|\bA100\b.*PCIe.*80\s?GB", _A100, 1935.0,
             "HBM2e 80 GB"),
    GpuPeaks("A100 80GB SXM", r"\bA100\b.*80\s?GB", _A100, 2039.0, "HBM2e 80 GB"),
    GpuPeaks("A100 40GB", r"\bA100\b.*40\s?GB", _A100, 1555.0, "HBM2 40 GB"),
    # A name without the memory size: the compute peaks hold, the bandwidth is unknown.
    GpuPeaks("A100", r"\bA100\b", _A100, None, "40 or 80 GB"),
    GpuPeaks("L40S", r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "bf16": 366.5, "fp16": 366.5,
                                   "fp8": 733.0, "int8": 733.0}, 864.0, "GDDR6 48 GB"),
    GpuPeaks("L4", r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0,
                               "fp8": 242.5, "int8": 242.5}, 300.0, "GDDR6 24 GB"),
    GpuPeaks("A10", r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0,
                                 "int8": 250.0}, 600.0, "GDDR6 24 GB"),
    GpuPeaks("V100", r"\bV100\b", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, 900.0,
             "HBM2 16/32 GB (SXM2)"),
    GpuPeaks("T4", r"\bT4\b", {"fp32": 8.1, "fp16": 65.0, "int8": 130.0}, 320.0,
             "GDDR6 16 GB"),
)


def gpu_peaks(gpu_name: str | None) -> GpuPeaks | None:
    """The table's row for a device name, or None when no row matches."""
    if not gpu_name:
        return None
    for row in GPU_PEAKS:
        if re.search(row.pattern, gpu_name, re.IGNORECASE):
            return row
    return None


def peak_for(gpu_name: str | None, precision: str | None) -> tuple[float | None, str]:
    """(dense peak TFLOP/s, where it came from) for a GPU name and a precision."""
    if not gpu_name:
        return None, "unknown GPU: pass peak_tflops="
    row = gpu_peaks(gpu_name)
    if row is None:
        return None, f"{gpu_name!r} is not in the peak table: pass peak_tflops="
    peak = row.peak(precision)
    if peak is not None:
        return peak, f"{row.label} datasheet, dense {precision}"
    return None, f"no {precision} peak for {row.label} in the table: pass peak_tflops="


# MFU's denominator: the GPU's dense BF16 Tensor Core peak, whatever precision the run computes
# in (the convention of PaLM, Megatron-LM and torchtitan), so that MFU rises when a run gets
# faster: against the peak of the precision in use, an FP32 run on CUDA cores reads a higher
# MFU than the same model twice as fast in TF32. GPUs without BF16 (V100, T4) use their FP16
# Tensor Core peak, the same 16-bit rate.
MFU_REFERENCE_PRECISIONS = ("bf16", "fp16")


def mfu_reference_peak(gpu_name: str | None) -> tuple[float | None, str | None, str]:
    """(dense peak TFLOP/s MFU is measured against, its precision, where it came from)."""
    for precision in MFU_REFERENCE_PRECISIONS:
        peak, source = peak_for(gpu_name, precision)
        if peak is not None:
            return peak, precision, source + " Tensor Core (the MFU reference)"
    return None, None, peak_for(gpu_name, MFU_REFERENCE_PRECISIONS[0])[1]


__all__ = ["GPU_PEAKS", "MFU_REFERENCE_PRECISIONS", "PRECISIONS", "GpuPeaks", "gpu_peaks",
           "mfu_reference_peak", "peak_for"]
