"""Recommendations from NVML telemetry and topology (pure functions; no NVML access).

Inputs are ``report["telemetry"]`` (:meth:`NvmlSampler.window_summary`) and the topology dict
(:func:`tb_gpuprof.nvml.topology.topology`). Outputs follow the report schema's
``recommendations`` items. Thresholds are documented in docs/recommendations.md
("NVML-based rules"); the registry (rules/__init__.py) runs these with the trace-based rules.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from typing import Any

from .build import recommendation
from .rule import Rec, Rule, RuleDoc, RuleInput

MIN_SAMPLES = 5  # fewer samples than this say nothing about a window

# batch_size: memory this job holds and how busy the SMs are
BATCH_MEMORY_PCT = 50.0
BATCH_SM_ACTIVE_PCT = 50.0  # GPM SM activity (share of SMs busy)
BATCH_SM_UTIL_PCT = 60.0  # NVML utilization (time any kernel ran) where GPM is absent
BATCH_HIGH_MEMORY_PCT = 25.0

# throttling: share of samples with clock events of that kind
THROTTLE_PCT = 10.0
THROTTLE_HIGH_PCT = 50.0
HW_SLOWDOWN_HIGH_PCT = 10.0  # hardware slowdown is drastic (clocks halved or worse)


def _gpus(telemetry: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not telemetry:
        return []
    return [g for g in telemetry.get("gpus", []) if (g.get("samples") or 0) >= MIN_SAMPLES]


def _memory_pct(mean: dict[str, float]) -> tuple[float | None, str]:
    """This process's share of device memory, else the whole device's (an upper bound)."""
    own, total = mean.get("process_mem_mib"), mean.get("fb_total_mib")
    if own and total:
        return 100.0 * own / total, "process"
    if mean.get("fb_used_pct") is not None:
        return mean["fb_used_pct"], "device"
    return None, "unknown"


NVML_BATCH_SIZE_FIX: dict[str, str] = {
    "pytorch": ("# raise the batch size until memory is ~80% used; scale the learning rate with "
                "it\n"
                "loader = DataLoader(dataset, batch_size=2 * batch_size, ...)"),
    "keras": "model.fit(x, y, batch_size=2 * batch_size, ...)",
    "jax": "# feed larger per-device batches to the jitted step",
}


def batch_size_advice(telemetry: dict[str, Any] | None) -> dict[str, Any] | None:
    """Memory mostly free and SMs mostly idle on every sampled GPU: a bigger batch would fit."""
    found = []
    for g in _gpus(telemetry):
        mean = g.get("mean", {})
        mem, mem_source = _memory_pct(mean)
        if "sm_active_pct" in mean:
            activity, limit, metric = mean["sm_active_pct"], BATCH_SM_ACTIVE_PCT, "sm_active_pct"
        elif "sm_util_pct" in mean:
            activity, limit, metric = mean["sm_util_pct"], BATCH_SM_UTIL_PCT, "sm_util_pct"
        else:
            return None
        if mem is None or mem >= BATCH_MEMORY_PCT or activity >= limit:
            return None  # one saturated GPU is enough to make the advice wrong for the job
        found.append((g["gpu"], mem, mem_source, metric, activity))
    if not found:
        return None
    worst_mem = max(f[1] for f in found)
    worst_act = max(f[4] for f in found)
    metric = found[0][3]
    high = worst_mem < BATCH_HIGH_MEMORY_PCT and worst_act < limit / 2
    what = "SM activity (GPM)" if metric == "sm_active_pct" else "GPU utilization (NVML)"
    return recommendation(
        "batch_size",
        "high" if high else "medium",
        "Increase the batch size: GPU memory and compute are mostly unused",
        (f"the job uses at most {worst_mem:.0f}% of GPU memory and {what} averages "
         f"at most {worst_act:.0f}% over the window, so each step launches too little "
         "work to fill the GPU"),
        {"gpus": [{"gpu": f[0], "memory_used_pct": round(f[1], 1),
                   "memory_source": f[2], f[3]: round(f[4], 1)} for f in found],
         "memory_threshold_pct": BATCH_MEMORY_PCT, "activity_threshold_pct": limit},
        NVML_BATCH_SIZE_FIX,
        None, None)


def throttling_advice(telemetry: dict[str, Any] | None) -> dict[str, Any] | None:
    """Power or thermal clock events held the clocks down for a significant share of samples."""
    hits = []
    for g in _gpus(telemetry):
        power = g.get("clock_event_power_pct") or 0.0
        thermal = g.get("clock_event_thermal_pct") or 0.0
        hw = (g.get("clock_events_pct") or {}).get("hw_slowdown", 0.0)
        if max(power, thermal, hw) >= THROTTLE_PCT:
            hits.append({"gpu": g["gpu"], "power_pct": power, "thermal_pct": thermal,
                         "hw_slowdown_pct": hw,
                         "sm_clock_mhz": (g.get("mean") or {}).get("sm_clock_mhz"),
                         "power_w": (g.get("mean") or {}).get("power_w"),
                         "power_limit_w": (g.get("mean") or {}).get("power_limit_w"),
                         "gpu_temp_c": (g.get("mean") or {}).get("gpu_temp_c")})
    if not hits:
        return None
    power = max(h["power_pct"] for h in hits)
    thermal = max(h["thermal_pct"] for h in hits)
    hw = max(h["hw_slowdown_pct"] for h in hits)
    kinds = [k for k, v in (("power cap", power), ("thermal", thermal),
                            ("hardware slowdown", hw)) if v >= THROTTLE_PCT]
    high = thermal >= THROTTLE_PCT or hw >= HW_SLOWDOWN_HIGH_PCT or power >= THROTTLE_HIGH_PCT
    gpus = ", ".join(str(h["gpu"]) for h in hits)
    check = ("nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE   # which reason, limits, temps\n"
             "nvidia-smi -pl <watts>   # if an admin lowered the power limit")
    return recommendation(
        "throttling",
        "high" if high else "medium",
        "GPU clocks are being lowered (" + ", ".join(kinds) + ")",
        (f"GPU {gpus}: clocks were held down by {' and '.join(kinds)} for up to "
         f"{max(power, thermal, hw):.0f}% of the samples; every kernel runs slower "
         "than the GPU's rated speed"),
        {"gpus": hits, "threshold_pct": THROTTLE_PCT},
        {"pytorch": check, "keras": check, "jax": check,
         "system": ("thermal: check cooling and airflow, fan/chassis alarms, ambient "
                    "temperature; power cap: compare power.draw with the enforced limit "
                    "(a lowered limit or a shared PSU budget); hardware slowdown: "
                    "check the power brake signal and PSUs with the system vendor")},
        None, None)


def _nvlinked(topo: dict[str, Any], i: int, j: int) -> bool:
    return topo["nvlink_counts"][i][j] > 0


def gpu_placement_advice(topology: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job's GPUs talk over PCIe/SMP while the host has as many NVLink-connected ones."""
    if not topology or not topology.get("gpus") or "nvlink_counts" not in topology:
        return None
    gpus = topology["gpus"]
    job = [k for k, g in enumerate(gpus) if g.get("job")]
    if len(job) < 2:
        return None
    pcie_pairs = [(a, b) for a, b in combinations(job, 2) if not _nvlinked(topology, a, b)]
    if not pcie_pairs:
        return None
    better = None
    if len(gpus) <= 16:  # exact search; hosts have at most 8-16 GPUs
        for combo in combinations(range(len(gpus)), len(job)):
            if all(_nvlinked(topology, a, b) for a, b in combinations(combo, 2)):
                better = combo
                break
    if better is None:
        return None
    job_idx = [gpus[k]["nvml_index"] for k in job]
    new_idx = [gpus[k]["nvml_index"] for k in better]
    labels = [f"GPU{gpus[a]['nvml_index']}-GPU{gpus[b]['nvml_index']}: "
              f"{topology['matrix'][a][b]}" for a, b in pcie_pairs]
    visible = ",".join(str(i) for i in new_idx)
    env = f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={visible}"
    return recommendation(
        "gpu_placement",
        "medium",
        "Run on NVLink-connected GPUs",
        (f"the job's GPUs {job_idx} exchange data over PCIe/CPU links "
         f"({'; '.join(labels)}) while GPUs {new_idx} on this host are all "
         "NVLink-connected; collectives (all-reduce) over PCIe are several times "
         "slower"),
        {"job_gpus": job_idx, "pcie_pairs": labels, "nvlink_gpus": new_idx},
        {"pytorch": f"{env} torchrun --nproc-per-node={len(job)} train.py",
         "keras": f"{env} python train.py",
         "jax": f"{env} python train.py"},
        None, None)


def _on_telemetry(fn: Callable[[dict[str, Any] | None], Rec | None]
                  ) -> Callable[[RuleInput], Rec | None]:
    return lambda inp: fn(inp.report.get("telemetry")) if inp.report.get("telemetry") else None


_HARDWARE = "the GPUs' clocks, cooling and placement are the machine's, not the training loop's"

THROTTLING_DOC = RuleDoc(
    fires=("on some GPU, clocks held down for ≥ 10% of samples by power (`sw_power_cap`, "
           "`hw_power_brake_slowdown`), thermal (`sw_thermal_slowdown`, `hw_thermal_slowdown`) "
           "or `hw_slowdown` clock events"),
    silent="below 10%; `gpu_idle` and application-clock settings never count",
    estimate=("not estimated; severity high when thermal ≥ 10%, `hw_slowdown` ≥ 10% or power ≥ "
              "50%, else medium"),
    bound="–",
    reads="NVML telemetry",
)

NVML_BATCH_SIZE_DOC = RuleDoc(
    fires=("on **every** sampled GPU: memory used < 50% — this process's memory "
           "(`process_mem_mib / fb_total_mib`), else the whole device's (`fb_used_pct`, an "
           "upper bound) — **and** GPM SM activity (`sm_active_pct`) < 50%, or, without GPM, "
           "NVML utilization (`sm_util_pct`) < 60%"),
    silent=("any GPU above either threshold (one busy GPU makes \"bigger batch\" wrong for the "
            "job), memory or activity unknown"),
    estimate=("not estimated; severity high when memory < 25% and activity < half its "
              "threshold, else medium"),
    bound="–",
    reads="NVML telemetry",
)

GPU_PLACEMENT_DOC = RuleDoc(
    fires=("the job uses ≥ 2 GPUs, some pair of them has no NVLink (`PIX`…`SYS` in the "
           "topology), and the host has as many GPUs that are pairwise NVLink-connected "
           "(directly or through NVSwitch); the fix names them (`CUDA_DEVICE_ORDER=PCI_BUS_ID "
           "CUDA_VISIBLE_DEVICES=…`) — the seed's \"use NVLink-connected GPUs\" advice"),
    silent=("single-GPU jobs, all job pairs NVLinked, or no NVLink-connected set of that size "
            "on the host"),
    estimate="not estimated; severity medium",
    bound="–",
    reads="the GPU topology (NVML)",
)

# NVML's rules judge the GPUs' own telemetry and topology, not the trace: a trace without GPU
# activity (CUDA activity not recorded) does not silence them
RULES: tuple[Rule, ...] = (
    Rule("throttling", _on_telemetry(throttling_advice), THROTTLING_DOC,
         {"system": "nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE"},
         not_verifiable=_HARDWARE, needs_gpu=False),
    # the recommendation's id is batch_size, as the trace's rule gives the same advice
    Rule("nvml_batch_size", _on_telemetry(batch_size_advice), NVML_BATCH_SIZE_DOC,
         NVML_BATCH_SIZE_FIX,
         not_verifiable=("the batch size is the data's shape and the optimisation's "
                         "hyper-parameter: changing it mid-run changes what is trained"),
         needs_gpu=False),
    Rule("gpu_placement", lambda inp: gpu_placement_advice(inp.topology), GPU_PLACEMENT_DOC,
         {"pytorch": "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=<NVLinked GPUs> torchrun"},
         not_verifiable=_HARDWARE, needs_gpu=False),
)
