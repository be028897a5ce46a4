"""What the sampler reads from NVML and how raw answers become metrics.

Raw fields are NVML calls (one name per call, JSON-able answers) so a replay file can hold
exactly what NVML said; metrics are the derived numbers with units in their names, which become
the scalars ``gpuprof/gpu<i>/<metric>``. Pure data and pure functions: no NVML import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Raw NVML calls made per device and tick (see backend.NvmlBackend.read for the NVML function).
RAW_FIELDS: tuple[str, ...] = (
    "utilization",  # nvmlDeviceGetUtilizationRates -> {"gpu": %, "memory": %}
    "encoder_utilization",  # nvmlDeviceGetEncoderUtilization -> [%, period_us]
    "decoder_utilization",  # nvmlDeviceGetDecoderUtilization -> [%, period_us]
    "power_usage",  # nvmlDeviceGetPowerUsage -> mW
    "power_limit",  # nvmlDeviceGetEnforcedPowerLimit -> mW
    "temperature_gpu",  # nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU) -> C
    "temperature_memory",  # nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP) -> C
    "clock_sm",  # nvmlDeviceGetClockInfo(NVML_CLOCK_SM) -> MHz
    "clock_mem",  # nvmlDeviceGetClockInfo(NVML_CLOCK_MEM) -> MHz
    "memory_info",  # nvmlDeviceGetMemoryInfo -> {"used": B, "total": B}
    "pcie_tx",  # nvmlDeviceGetPcieThroughput(TX) -> KB/s, averaged by NVML over 20 ms
    "pcie_rx",  # nvmlDeviceGetPcieThroughput(RX) -> KB/s
    "clock_event_reasons",  # nvmlDeviceGetCurrentClocksEventReasons -> bitmask
    "processes",  # nvmlDeviceGetComputeRunningProcesses -> [[pid, used bytes or null]]
)

# nvmlDeviceGetPcieThroughput blocks ~20 ms per call; GPM gives the same numbers for free, so
# on GPM devices these raw fields are skipped.
RAW_FIELDS_REPLACED_BY_GPM = ("pcie_tx", "pcie_rx")

# GPM metric ids (NVML_GPM_METRIC_*) -> metric name. Values are 0-100 % or MiB/s.
GPM_METRICS: dict[int, str] = {
    2: "sm_active_pct",  # NVML_GPM_METRIC_SM_UTIL: share of SMs busy
    3: "sm_occupancy_pct",  # NVML_GPM_METRIC_SM_OCCUPANCY: resident warps vs. maximum
    5: "tensor_active_pct",  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    6: "dfma_tensor_active_pct",  # NVML_GPM_METRIC_DFMA_TENSOR_UTIL (FP64 tensor)
    7: "hmma_tensor_active_pct",  # NVML_GPM_METRIC_HMMA_TENSOR_UTIL (FP16/BF16/TF32 tensor)
    9: "imma_tensor_active_pct",  # NVML_GPM_METRIC_IMMA_TENSOR_UTIL (INT8 tensor)
    10: "dram_bw_pct",  # NVML_GPM_METRIC_DRAM_BW_UTIL: of theoretical peak
    11: "fp64_active_pct",  # NVML_GPM_METRIC_FP64_UTIL (non-tensor)
    12: "fp32_active_pct",  # NVML_GPM_METRIC_FP32_UTIL (non-tensor)
    13: "fp16_active_pct",  # NVML_GPM_METRIC_FP16_UTIL (non-tensor)
    20: "pcie_tx_mib_s",  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    21: "pcie_rx_mib_s",  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
    60: "nvlink_rx_mib_s",  # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    61: "nvlink_tx_mib_s",  # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
}

# NVML clock-event ("throttle") reason bits -> short names, as nvidia-smi -q lists them.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake_slowdown"})
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})


@dataclass(frozen=True, slots=True)
class Metric:
    """A metric the sampler produces (``raw_to_metrics``/``gpm_to_metrics``): every name they
    return is declared here (tests/test_nvml_protocol.py); docs/metrics.md says what it is."""
    name: str
    unit: str


METRICS: tuple[Metric, ...] = (
    Metric("sm_util_pct", "%"),  # NVML utilization.gpu: time a kernel was running (not SM activity)
    Metric("mem_util_pct", "%"),  # NVML utilization.memory: time device memory was read/written
    Metric("enc_util_pct", "%"),  # video encoder utilization
    Metric("dec_util_pct", "%"),  # video decoder utilization
    Metric("power_w", "W"),  # board power draw
    Metric("power_limit_w", "W"),  # enforced power limit
    Metric("gpu_temp_c", "°C"),  # GPU core temperature
    Metric("mem_temp_c", "°C"),  # HBM temperature
    Metric("sm_clock_mhz", "MHz"),  # SM clock
    Metric("mem_clock_mhz", "MHz"),  # memory clock
    Metric("fb_used_mib", "MiB"),  # device memory in use by all processes
    Metric("fb_total_mib", "MiB"),  # device memory size
    Metric("fb_used_pct", "%"),  # fb_used_mib / fb_total_mib
    Metric("process_mem_mib", "MiB"),  # device memory held by this process
    Metric("pcie_tx_mib_s", "MiB/s"),  # PCIe traffic from the GPU
    Metric("pcie_rx_mib_s", "MiB/s"),  # PCIe traffic to the GPU
    Metric("clock_event_power_pct", "%"),  # share of samples with power-cap/brake clock events
    Metric("clock_event_thermal_pct", "%"),  # share of samples with thermal clock events
    Metric("sm_active_pct", "%"),  # GPM: share of SMs with at least one warp resident
    Metric("sm_occupancy_pct", "%"),  # GPM: resident warps vs. the SMs' maximum
    Metric("tensor_active_pct", "%"),  # GPM: time SMs issued any tensor-core instruction
    Metric("hmma_tensor_active_pct", "%"),  # GPM: FP16/BF16/TF32 tensor-core activity
    Metric("imma_tensor_active_pct", "%"),  # GPM: INT8 tensor-core activity
    Metric("dfma_tensor_active_pct", "%"),  # GPM: FP64 tensor-core activity
    Metric("dram_bw_pct", "%"),  # GPM: DRAM bandwidth used vs. peak
    Metric("fp16_active_pct", "%"),  # GPM: non-tensor FP16 pipe activity
    Metric("fp32_active_pct", "%"),  # GPM: non-tensor FP32 pipe activity
    Metric("fp64_active_pct", "%"),  # GPM: non-tensor FP64 pipe activity
    Metric("nvlink_rx_mib_s", "MiB/s"),  # GPM: NVLink receive bandwidth, all links
    Metric("nvlink_tx_mib_s", "MiB/s"),  # GPM: NVLink transmit bandwidth, all links
)

MIB = 1024 * 1024


def decode_clock_events(mask: int | None) -> list[str]:
    """Bitmask from nvmlDeviceGetCurrentClocksEventReasons -> reason names (unknown bits too)."""
    if not mask:
        return []
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"other_0x{unknown:x}")
    return names


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def raw_to_metrics(raw: Mapping[str, Any], pid: int) -> dict[str, float]:
    """Turn one tick's raw answers (errors already removed) into metric values.

    ``pid`` selects this process's entry of the "processes" answer.
    """
    out: dict[str, float] = {}
    util = raw.get("utilization")
    if isinstance(util, Mapping):
        for key, name in (("gpu", "sm_util_pct"), ("memory", "mem_util_pct")):
            if (v := _num(util.get(key))) is not None:
                out[name] = v
    for field, name in (("encoder_utilization", "enc_util_pct"),
                        ("decoder_utilization", "dec_util_pct")):
        answer = raw.get(field)
        if isinstance(answer, (list, tuple)) and answer and (v := _num(answer[0])) is not None:
            out[name] = v
    for field, name, scale in (("power_usage", "power_w", 1e-3),
                               ("power_limit", "power_limit_w", 1e-3),
                               ("temperature_gpu", "gpu_temp_c", 1.0),
                               ("temperature_memory", "mem_temp_c", 1.0),
                               ("clock_sm", "sm_clock_mhz", 1.0),
                               ("clock_mem", "mem_clock_mhz", 1.0),
                               ("pcie_tx", "pcie_tx_mib_s", 1000.0 / MIB),  # NVML: KB/s
                               ("pcie_rx", "pcie_rx_mib_s", 1000.0 / MIB)):
        if (v := _num(raw.get(field))) is not None:
            out[name] = v * scale
    mem = raw.get("memory_info")
    if isinstance(mem, Mapping):
        used, total = _num(mem.get("used")), _num(mem.get("total"))
        if used is not None:
            out["fb_used_mib"] = used / MIB
        if total:
            out["fb_total_mib"] = total / MIB
            if used is not None:
                out["fb_used_pct"] = 100.0 * used / total
    procs = raw.get("processes")
    if isinstance(procs, list):
        # Our process absent from the list means it holds no device memory (yet); a null
        # usedGpuMemory (NVML_VALUE_NOT_AVAILABLE, e.g. inside containers) means unknown.
        mine = [p for p in procs if isinstance(p, (list, tuple)) and len(p) == 2 and p[0] == pid]
        if not mine:
            out["process_mem_mib"] = 0.0
        elif all(_num(p[1]) is not None for p in mine):
            out["process_mem_mib"] = sum(float(p[1]) for p in mine) / MIB
    return out


def gpm_to_metrics(gpm: Mapping[int, Any]) -> dict[str, float]:
    """GPM metric id -> value (errors removed) into named metrics."""
    out: dict[str, float] = {}
    for metric_id, value in gpm.items():
        name = GPM_METRICS.get(int(metric_id))
        if name is not None and (v := _num(value)) is not None:
            out[name] = v
    return out
