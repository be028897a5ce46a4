"""Recommendations: each rule reads the report's measurements and the recorded flags.

Rules are pure functions ``report -> recommendation | None``. A rule never fires when its fix is
already in place (the flags a hook recorded say so). Thresholds are module constants and are
documented in docs/recommendations.md; estimated savings are deliberately conservative.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Shares are of total GPU time in the analyzed window unless named otherwise.
TF32_MIN_FP32_ELIGIBLE_PCT = 10.0
AMP_MIN_FP32_FAMILY_PCT = 15.0
CHANNELS_LAST_MIN_LAYOUT_PCT = 3.0
INPUT_PIPELINE_MIN_WAIT_PCT = 5.0  # of wall time
BATCH_SIZE_MAX_BUSY_PCT = 60.0  # of wall time
BATCH_SIZE_MAX_MEMORY_FRACTION = 0.5
COMPILE_MIN_HOST_BOUND_PCT = 15.0  # idle from launch overhead + CPU ops, of wall time
COMPILE_MIN_SMALL_KERNEL_PCT = 30.0  # elementwise + reduction kernels, of GPU time
COMPILE_MIN_KERNELS_PER_ITER = 200

# Conservative speed-ups used for the estimates (measured ResNet-50 on H200 is larger).
TF32_SPEEDUP = 2.5  # FP32 SIMT GEMM/conv -> TF32 Tensor Cores
AMP_SPEEDUP = 2.0  # TF32 -> FP16/BF16 Tensor Cores
AMP_MEMORY_BOUND_SAVING = 0.2  # share of FP32 norm/elementwise time saved by half the bytes
COMPILE_SMALL_KERNEL_SAVING = 0.2  # share of small-kernel time fusion removes
COMPILE_HOST_IDLE_SAVING = 0.5  # share of launch-bound idle that compilation/CUDA graphs remove

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


def _flags(report: dict[str, Any]) -> dict[str, Any]:
    return (report.get("system") or {}).get("flags") or {}


def _cc_major(report: dict[str, Any]) -> int | None:
    cc = (report.get("system") or {}).get("compute_capability")
    try:
        return int(str(cc).split(".")[0]) if cc else None
    except ValueError:
        return None


def _per_iter_ms(report: dict[str, Any], us: float) -> float:
    n = max(report["iterations"]["count"], 1)
    return round(us / n / 1e3, 3)


def _gpu_us(report: dict[str, Any]) -> float:
    return report.get("gpu_time_us") or 0.0


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole > 0 else 0.0


def _sum(report: dict[str, Any], pred: Callable[[dict[str, Any]], bool]) -> float:
    return sum(k["total_us"] for k in report["kernels"] if pred(k))


def _is_fp32_simt_eligible(k: dict[str, Any]) -> bool:
    return (k.get("tc_eligible") and not k["uses_tensor_cores"] and k["precision"] == "fp32"
            and k["category"] in ("gemm", "conv", "attention", "other"))


def _framework(report: dict[str, Any]) -> str | None:
    return (report.get("system") or {}).get("framework")


def _rec(rid: str, severity: str, title: str, problem: str, evidence: dict[str, Any],
         fix: dict[str, str], saving_ms: float | None, report: dict[str, Any]) -> dict[str, Any]:
    mean = report["iterations"].get("mean_ms") or 0.0
    return {
        "id": rid, "severity": severity, "title": title, "problem": problem,
        "evidence": evidence, "fix": fix,
        "estimated_saving_ms": saving_ms,
        "estimated_saving_pct": round(100.0 * saving_ms / mean, 1)
        if saving_ms is not None and mean > 0 else None,
    }


def _tf32_on(flags: dict[str, Any]) -> bool | None:
    if flags.get("nvidia_tf32_override") == "0":
        return False
    if "tf32_enabled" in flags:  # TensorFlow / Keras on TF
        return bool(flags["tf32_enabled"])
    matmul = flags.get("allow_tf32_matmul")
    if flags.get("float32_matmul_precision") in ("high", "medium"):
        matmul = True
    cudnn = flags.get("allow_tf32_cudnn")
    if matmul is None and cudnn is None:
        return None
    return bool(matmul) and bool(cudnn if cudnn is not None else True)


def rule_tf32(report: dict[str, Any]) -> dict[str, Any] | None:
    flags = _flags(report)
    cc = _cc_major(report)
    if (cc is not None and cc < 8) or _tf32_on(flags) or flags.get("autocast"):
        return None
    gpu = _gpu_us(report)
    fp32 = _sum(report, _is_fp32_simt_eligible)
    share = _pct(fp32, gpu)
    if share < TF32_MIN_FP32_ELIGIBLE_PCT:
        return None
    saving = _per_iter_ms(report, fp32 * (1 - 1 / TF32_SPEEDUP))
    override = flags.get("nvidia_tf32_override") == "0"
    problem = (f"{share}% of GPU time is FP32 matrix math (GEMM/convolution) on CUDA cores, "
               "not Tensor Cores: TF32 runs it on Tensor Cores with FP32 range and storage.")
    if override:
        problem += " NVIDIA_TF32_OVERRIDE=0 is set in the environment and forces TF32 off."
    return _rec("tf32", "high", "Enable TF32 Tensor Cores for FP32 matrix math", problem,
                {"fp32_eligible_pct": share, "fp32_eligible_us": round(fp32, 1),
                 "top_fp32_kernels": [k["name"] for k in report["kernels"]
                                      if _is_fp32_simt_eligible(k)][:3],
                 "flags": {k: flags.get(k) for k in ("allow_tf32_matmul", "allow_tf32_cudnn",
                                                     "float32_matmul_precision") if k in flags}},
                {"pytorch": "torch.backends.cuda.matmul.allow_tf32 = True\n"
                            "torch.backends.cudnn.allow_tf32 = True\n"
                            "# or: torch.set_float32_matmul_precision('high')",
                 "keras": "import tensorflow as tf\n"
                          "tf.config.experimental.enable_tensor_float_32_execution(True)"
                          "  # TF backend; on by default in TF >= 2.4\n"
                          "# JAX backend: jax.config.update('jax_default_matmul_precision', "
                          "'tensorfloat32')",
                 "jax": "jax.config.update('jax_default_matmul_precision', 'tensorfloat32')\n"
                        "# or per call: jnp.dot(a, b, precision=jax.lax.Precision.DEFAULT)"},
                saving, report)


def rule_amp(report: dict[str, Any]) -> dict[str, Any] | None:
    flags = _flags(report)
    if flags.get("autocast") or str(flags.get("mixed_precision_policy") or "").startswith(
            ("mixed_", "float16", "bfloat16")):
        return None
    gpu = _gpu_us(report)
    fp32 = _sum(report, _is_fp32_simt_eligible)
    tf32 = _sum(report, lambda k: k["uses_tensor_cores"] and k["precision"] == "tf32")
    half = _sum(report, lambda k: k["uses_tensor_cores"] and k["precision"] in
                ("fp16", "bf16", "fp8", "int8"))
    family = fp32 + tf32
    share = _pct(family, gpu)
    if share < AMP_MIN_FP32_FAMILY_PCT or half > family:
        return None
    # Estimate on top of TF32 (the ladder's order): FP32 work is first counted at TF32 speed.
    cc = _cc_major(report)
    base = tf32 + (fp32 / TF32_SPEEDUP if cc is None or cc >= 8 else fp32)
    # FP32 activations also make the memory-bound kernels (norm, elementwise) move twice the bytes.
    fp32_memory_bound = _sum(report, lambda k: k["precision"] == "fp32" and k["category"] in
                             ("norm", "elementwise", "reduction"))
    saving = _per_iter_ms(report, base * (1 - 1 / AMP_SPEEDUP)
                          + fp32_memory_bound * AMP_MEMORY_BOUND_SAVING)
    return _rec("amp", "high" if share >= 40 else "medium",
                "Use automatic mixed precision (FP16/BF16 Tensor Cores)",
                f"{share}% of GPU time is matrix math in FP32/TF32 "
                f"({_pct(tf32, gpu)}% TF32 Tensor Core, {_pct(fp32, gpu)}% FP32 CUDA core); "
                "FP16/BF16 Tensor Cores do it at twice the TF32 rate and halve activation memory.",
                {"fp32_family_pct": share, "tf32_pct": _pct(tf32, gpu),
                 "fp32_simt_pct": _pct(fp32, gpu), "half_tc_pct": _pct(half, gpu)},
                {"pytorch": "scaler = torch.amp.GradScaler('cuda')\n"
                            "with torch.autocast('cuda', dtype=torch.float16):  # or bfloat16\n"
                            "    loss = loss_fn(model(x), y)\n"
                            "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()",
                 "keras": "keras.mixed_precision.set_global_policy('mixed_float16')"
                          "  # or 'mixed_bfloat16'",
                 "jax": "# compute in bfloat16, keep fp32 master weights:\n"
                        "logits = model.apply(jax.tree.map(lambda p: p.astype(jnp.bfloat16), "
                        "params), x.astype(jnp.bfloat16))"},
                saving, report)


def rule_channels_last(report: dict[str, Any]) -> dict[str, Any] | None:
    flags = _flags(report)
    if flags.get("channels_last"):
        return None
    gpu = _gpu_us(report)
    layout = _sum(report, lambda k: k["category"] == "layout")
    conv = _sum(report, lambda k: k["category"] == "conv")
    share = _pct(layout, gpu)
    if share < CHANNELS_LAST_MIN_LAYOUT_PCT or conv <= 0:
        return None
    return _rec("channels_last", "high" if share >= 10 else "medium",
                "Use channels_last (NHWC) memory format for convolutions",
                f"{share}% of GPU time goes to layout transforms (NCHW<->NHWC) around "
                "convolutions: Tensor Core convolutions want NHWC, so the NCHW tensors are "
                "converted before and after each one.",
                {"layout_pct": share, "layout_us": round(layout, 1), "conv_pct": _pct(conv, gpu),
                 "layout_kernels": [k["name"] for k in report["kernels"]
                                    if k["category"] == "layout"][:3]},
                {"pytorch": "model = model.to(memory_format=torch.channels_last)\n"
                            "x = x.to(memory_format=torch.channels_last)",
                 "keras": "# Keras/TF default to channels_last; keep data_format='channels_last'"
                          "\nkeras.config.set_image_data_format('channels_last')",
                 "jax": "# use NHWC inputs and lax.conv_general_dilated(..., "
                        "dimension_numbers=('NHWC', 'HWIO', 'NHWC'))"},
                _per_iter_ms(report, layout), report)


def rule_input_pipeline(report: dict[str, Any]) -> dict[str, Any] | None:
    if not _gpu_us(report):
        return None  # a CPU-only trace says nothing about a GPU waiting
    wall = report["breakdown"]["wall_us"]
    idle_dl = report["breakdown"]["idle_attribution_us"]["data_loading"]
    wait_ms = (report.get("system") or {}).get("data_wait_mean_ms")
    mean = report["iterations"]["mean_ms"]
    share = _pct(idle_dl, wall)
    wait_share = _pct(wait_ms, mean) if wait_ms else 0.0
    if max(share, wait_share) < INPUT_PIPELINE_MIN_WAIT_PCT:
        return None
    saving = max(_per_iter_ms(report, idle_dl), wait_ms or 0.0)
    return _rec("input_pipeline", "high" if max(share, wait_share) >= 20 else "medium",
                "Feed the GPU faster: the input pipeline stalls training",
                f"The GPU waits for input {max(share, wait_share)}% of each iteration "
                "(data loading / host-side preprocessing while no kernel runs).",
                {"gpu_idle_data_loading_pct": share, "data_wait_pct": wait_share},
                {"pytorch": "DataLoader(ds, batch_size=..., num_workers=8, pin_memory=True,\n"
                            "           persistent_workers=True, prefetch_factor=4)\n"
                            "x = x.cuda(non_blocking=True)",
                 "keras": "ds = ds.map(f, num_parallel_calls=tf.data.AUTOTUNE)"
                          ".cache().prefetch(tf.data.AUTOTUNE)",
                 "jax": "# prefetch batches to the device in a background thread, e.g. "
                        "flax.jax_utils.prefetch_to_device(it, 2), or tf.data/grain with "
                        "prefetch"},
                saving, report)


def rule_batch_size(report: dict[str, Any]) -> dict[str, Any] | None:
    bd = report["breakdown"]
    wall = bd["wall_us"]
    busy_pct = _pct(bd["gpu_busy_us"], wall)
    system = report.get("system") or {}
    peak = system.get("memory_peak_bytes")
    total = system.get("gpu_memory_bytes")
    if not peak or not total or busy_pct >= BATCH_SIZE_MAX_BUSY_PCT:
        return None
    frac = peak / total
    if frac >= BATCH_SIZE_MAX_MEMORY_FRACTION:
        return None
    if _pct(bd["idle_attribution_us"]["data_loading"], wall) >= INPUT_PIPELINE_MIN_WAIT_PCT:
        return None  # a bigger batch would only wait longer for data
    return _rec("batch_size", "medium", "Increase the batch size: the GPU is under-used",
                f"The GPU is busy only {busy_pct}% of each iteration and the job uses "
                f"{round(100 * frac, 1)}% of GPU memory: larger batches amortize launch and "
                "host overhead over more work per kernel.",
                {"gpu_busy_pct": busy_pct, "memory_used_pct": round(100 * frac, 1)},
                {"pytorch": "DataLoader(ds, batch_size=2 * old_batch_size, ...)\n"
                            "# scale the learning rate with the batch (linear scaling + warm-up)",
                 "keras": "model.fit(ds, batch_size=2 * old_batch_size)  # and scale the LR",
                 "jax": "# double the per-device batch; scale the learning rate"},
                None, report)


def rule_compile(report: dict[str, Any]) -> dict[str, Any] | None:
    flags = _flags(report)
    if flags.get("compiled") or flags.get("jit_compile") or _framework(report) == "jax":
        return None
    if not _gpu_us(report):
        return None  # no GPU work in the trace: nothing to say about launch overhead
    if report["source"]["format"] == "xplane" and _framework(report) is None:
        return None  # XLA programs are already compiled
    bd = report["breakdown"]
    wall = bd["wall_us"]
    attr = bd["idle_attribution_us"]
    host_bound = _pct(attr["launch_overhead"] + attr["cpu_ops"], wall)
    gpu = _gpu_us(report)
    small = _sum(report, lambda k: k["category"] in ("elementwise", "reduction", "norm"))
    small_pct = _pct(small, gpu)
    launches = sum(k["count"] for k in report["kernels"] if k.get("kind", "kernel") == "kernel")
    per_iter = launches / max(report["iterations"]["count"], 1)
    fires_host = host_bound >= COMPILE_MIN_HOST_BOUND_PCT
    fires_small = small_pct >= COMPILE_MIN_SMALL_KERNEL_PCT and per_iter >= \
        COMPILE_MIN_KERNELS_PER_ITER
    if not (fires_host or fires_small):
        return None
    saving = _per_iter_ms(report, (attr["launch_overhead"] + attr["cpu_ops"])
                          * COMPILE_HOST_IDLE_SAVING + small * COMPILE_SMALL_KERNEL_SAVING)
    return _rec("compile", "medium",
                "Compile the model: fuse small kernels and cut launch overhead",
                f"{host_bound}% of each iteration the GPU idles while the host launches work, "
                f"and {small_pct}% of GPU time is {round(per_iter)} small elementwise/"
                "reduction/norm kernels per iteration: a compiler fuses them and replays "
                "launches (XLA, torch.compile, CUDA graphs).",
                {"host_bound_idle_pct": host_bound, "small_kernel_pct": small_pct,
                 "kernels_per_iteration": round(per_iter)},
                {"pytorch": "model = torch.compile(model)  # mode='max-autotune' adds CUDA graphs",
                 "keras": "model.compile(..., jit_compile=True)  # XLA",
                 "jax": "step = jax.jit(step)  # jit the whole training step, not pieces"},
                saving, report)


RULES: list[Callable[[dict[str, Any]], dict[str, Any] | None]] = [
    rule_tf32, rule_amp, rule_channels_last, rule_input_pipeline, rule_batch_size, rule_compile,
]


def _extra_rules(report: dict[str, Any]) -> list[dict[str, Any]]:
    """NVML- and distributed-based rules live next to their data; use them when present."""
    from .distributed import distributed_recommendations

    recs = distributed_recommendations(report)
    telemetry = report.get("telemetry")
    if telemetry:
        from ..nvml.advice import nvml_recommendations

        recs.extend(nvml_recommendations(telemetry, telemetry.get("topology")))
    return recs


def recommend(report: dict[str, Any]) -> list[dict[str, Any]]:
    recs = [r for r in (rule(report) for rule in RULES) if r is not None]
    seen = {r["id"] for r in recs}
    if "input_pipeline" in seen:
        seen.add("batch_size")  # a bigger batch would only wait longer for its data
    recs.extend(r for r in _extra_rules(report) if r["id"] not in seen)
    recs.sort(key=lambda r: (-(r["estimated_saving_ms"] or 0.0),
                             SEVERITY_ORDER.get(r["severity"], 3)))
    return recs
