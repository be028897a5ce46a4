"""Trace-based rules: each reads the report's measurements and the recorded flags.

Each rule is one :class:`~.rule.Rule` (listed in :data:`RULES` at the end): its detection, a
pure function ``report -> recommendation | None`` that never fires when the fix is already in
place (the flags a hook recorded, or the trace itself, say so); its fix per framework (the
``*_FIX`` constants); its estimator, the fix applied to a replay of the window (``fix_*``:
how it changes kernels and host segments, by the factors of ``whatif.SPEEDUPS``); its in-loop
switch or why there is none; and its doc row. Thresholds are module constants; the detection
gives no saving of its own (analysis/savings.py re-times every one), only the bound
``removable_ms``. docs/recommendations.md's rule table is generated from :data:`RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..bottleneck import COMPILED_KERNEL_PREFIXES
from ..memory import gpu_devices
from ..memory_parts import batch_headroom
from ..whatif import PINNED_H2D_BYTES_PER_US, SPEEDUPS, Fix, Replay, SimKernel
from .build import recommendation
from .rule import FixBuilder, Rec, Retiming, Rule, RuleDoc, on_report

# Shares are of total GPU time in the analyzed window unless named otherwise.
TF32_MIN_FP32_ELIGIBLE_PCT = 10.0
AMP_MIN_FP32_FAMILY_PCT = 15.0
CHANNELS_LAST_MIN_LAYOUT_PCT = 3.0
INPUT_PIPELINE_MIN_WAIT_PCT = 5.0  # data-loader wait + host work outside ops, of the iteration
# host work before the forward (bottleneck.input_prep_ms), of the profiled iteration. On the
# H200 loops that prepare nothing in the loop it is 0.1-3.3% (the loop's own Python between
# steps); Lightning's machinery before its forward reads 20%, and the re-timing then drops
# the advice (confirm_min_pct: hidden under a GPU-bound step). A tenth of the step is where
# moving the work to DataLoader workers is worth a change of code.
INPUT_PREP_MIN_PCT = 10.0
PINNED_MIN_COPY_PCT = 5.0  # pageable host-to-device copies, of the iteration
HOST_SYNC_MIN_PCT = 8.0  # host/GPU overlap that per-iteration syncs prevent, of the iteration
BATCH_SIZE_MAX_BUSY_PCT = 60.0  # of wall time
BATCH_SIZE_MAX_MEMORY_FRACTION = 0.5
COMPILE_MIN_HOST_BOUND_PCT = 15.0  # GPU idle while the host dispatches ops, of the iteration
COMPILE_MIN_SMALL_KERNEL_PCT = 30.0  # elementwise + reduction kernels, of GPU time
COMPILE_MIN_KERNELS_PER_ITER = 200


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
    return bool(k.get("tc_eligible") and not k["uses_tensor_cores"]
                and k["precision"] == "fp32"
                and k["category"] in ("gemm", "conv", "attention", "other"))


def _framework(report: dict[str, Any]) -> str | None:
    return (report.get("system") or {}).get("framework")


def _rec(rid: str, severity: str, title: str, problem: str, evidence: dict[str, Any],
         fix: dict[str, str], saving_ms: float | None, report: dict[str, Any],
         removable_ms: float | None = None) -> dict[str, Any]:
    return recommendation(rid, severity, title, problem, evidence, fix, saving_ms,
                          report["iterations"].get("mean_ms") or 0.0, removable_ms)


def _compiled(report: dict[str, Any]) -> bool:
    """torch.compile, XLA or CUDA graphs already run: from the hook's flags or the trace."""
    flags = _flags(report)
    if flags.get("compiled") or flags.get("jit_compile") or _framework(report) == "jax":
        return True
    if report["source"]["format"] == "xplane" and _framework(report) is None:
        return True  # XLA programs are already compiled
    if (report.get("bottleneck") or {}).get("compiled_code"):
        return True  # Inductor's Triton kernels, compiled regions, CUDA graph launches
    # a report stored before compiled_code: its kernel table still names Inductor's kernels
    return any(k["name"].startswith(COMPILED_KERNEL_PREFIXES) for k in report["kernels"])


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


MATH = ("gemm", "conv", "attention")
HALF = ("fp16", "bf16", "fp8")
MEMORY_BOUND = ("norm", "elementwise", "reduction")
REMOVED = 1e9  # a kernel the fix removes runs this many times faster


def _f(name: str, variant: int) -> float:
    return SPEEDUPS[name][variant]


def _math_cat(k: SimKernel) -> str:
    return k.category if k.category in ("gemm", "conv") else "gemm"


def _fp32_simt(k: SimKernel) -> bool:
    return (not k.uses_tc and k.precision == "fp32" and k.eligible
            and k.category in (*MATH, "other"))


TF32_FIX: dict[str, str] = {
    "pytorch": ("torch.backends.cuda.matmul.allow_tf32 = True\n"
                "torch.backends.cudnn.allow_tf32 = True\n"
                "# or: torch.set_float32_matmul_precision('high')"),
    "keras": ("import tensorflow as tf\n"
              "tf.config.experimental.enable_tensor_float_32_execution(True)  # TF backend; on "
              "by default in TF >= 2.4\n"
              "# JAX backend: jax.config.update('jax_default_matmul_precision', 'tensorfloat32')"),
    "jax": ("jax.config.update('jax_default_matmul_precision', 'tensorfloat32')\n"
            "# or per call: jnp.dot(a, b, precision=jax.lax.Precision.DEFAULT)"),
}


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
    removable = _per_iter_ms(report, fp32)  # at best the FP32 matrix kernels take no time
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
                TF32_FIX,
                None, report, removable)


def fix_tf32(v: int) -> Fix:
    def factor(k: SimKernel) -> float:
        return _f(f"fp32_to_tf32_{_math_cat(k)}", v) if _fp32_simt(k) else 1.0
    return Fix(kernel_factor=factor, by_class=True)


AMP_FIX: dict[str, str] = {
    "pytorch": ("scaler = torch.amp.GradScaler('cuda')\n"
                "with torch.autocast('cuda', dtype=torch.float16):  # or bfloat16\n"
                "    loss = loss_fn(model(x), y)\n"
                "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()"),
    "keras": "keras.mixed_precision.set_global_policy('mixed_float16')  # or 'mixed_bfloat16'",
    "jax": ("# compute in bfloat16, keep fp32 master weights:\n"
            "logits = model.apply(jax.tree.map(lambda p: p.astype(jnp.bfloat16), params), "
            "x.astype(jnp.bfloat16))"),
}


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
    # the kernels AMP moves (fix_amp below): FP32/TF32 matrix math, FP32 memory-bound ones
    # (dtype-less ones too where nothing runs in half precision); its autocast casts only
    # add host time
    unknown_is_fp32 = not any(k["precision"] in ("fp16", "bf16", "fp8")
                              for k in report["kernels"])
    moved = _sum(report, lambda k: _is_fp32_simt_eligible(k)
                 or (k["uses_tensor_cores"] and k["precision"] in ("tf32", "fp32")
                     and k["category"] in ("gemm", "conv", "attention"))
                 or ((k["precision"] == "fp32" or (unknown_is_fp32
                                                    and k["precision"] == "unknown"))
                     and k["category"] in ("norm", "elementwise", "reduction")))
    return _rec("amp", "high" if share >= 40 else "medium",
                "Use automatic mixed precision (FP16/BF16 Tensor Cores)",
                f"{share}% of GPU time is matrix math in FP32/TF32 "
                f"({_pct(tf32, gpu)}% TF32 Tensor Core, {_pct(fp32, gpu)}% FP32 CUDA core); "
                "FP16/BF16 Tensor Cores do it at twice the TF32 rate and halve activation memory.",
                {"fp32_family_pct": share, "tf32_pct": _pct(tf32, gpu),
                 "fp32_simt_pct": _pct(fp32, gpu), "half_tc_pct": _pct(half, gpu)},
                AMP_FIX,
                None, report, _per_iter_ms(report, moved))


def fix_amp(v: int, unknown_is_fp32: bool = False) -> Fix:
    """AMP on top of TF32: FP32 math is counted from TF32 speed (the ladder's order), so with
    TF32 off the estimate is what AMP adds after the ``tf32`` fix (see :func:`retime`).

    ``unknown_is_fp32``: no kernel of the window runs in half precision, so kernels whose
    names carry no dtype (XLA's fusions) run in FP32 like everything else."""
    def factor(k: SimKernel) -> float:
        half = "tf32_to_half_" + (k.category if k.category in MATH else "gemm")
        # FP32 math on Tensor Cores (e.g. memory-efficient attention's TF32 MMA) is TF32
        if (k.uses_tc and k.precision in ("tf32", "fp32") and k.category in MATH) or \
                _fp32_simt(k):
            return _f(half, v)
        fp32 = k.precision == "fp32" or (unknown_is_fp32 and k.precision == "unknown")
        if fp32 and k.category == "norm":
            return _f("memory_half_norm", v)
        if fp32 and k.category in ("elementwise", "reduction"):
            return _f("memory_half_elementwise", v)
        return 1.0
    return Fix(kernel_factor=factor, framework_rate=1.0 / _f("amp_dispatch", v),
               by_class=True)


CHANNELS_LAST_FIX: dict[str, str] = {
    "pytorch": ("model = model.to(memory_format=torch.channels_last)\n"
                "x = x.to(memory_format=torch.channels_last)"),
    "keras": ("# Keras/TF default to channels_last; keep data_format='channels_last'\n"
              "keras.config.set_image_data_format('channels_last')"),
    "jax": ("# use NHWC inputs and lax.conv_general_dilated(..., dimension_numbers=('NHWC', "
            "'HWIO', 'NHWC'))"),
}


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
    # what NHWC changes (fix_channels_last below): layout transforms, half-precision
    # norm/pooling and convolutions
    changed = _sum(report, lambda k: k["category"] == "layout" or (
        k["precision"] in ("fp16", "bf16") and (k["category"] in ("norm", "conv")
                                                or "pool" in k["name"].lower())))
    return _rec("channels_last", "high" if share >= 10 else "medium",
                "Use channels_last (NHWC) memory format for convolutions",
                f"{share}% of GPU time goes to layout transforms (NCHW<->NHWC) around "
                "convolutions: Tensor Core convolutions want NHWC, so the NCHW tensors are "
                "converted before and after each one.",
                {"layout_pct": share, "layout_us": round(layout, 1), "conv_pct": _pct(conv, gpu),
                 "layout_kernels": [k["name"] for k in report["kernels"]
                                    if k["category"] == "layout"][:3]},
                CHANNELS_LAST_FIX,
                None, report, _per_iter_ms(report, changed))


def fix_channels_last(v: int) -> Fix:
    def factor(k: SimKernel) -> float:
        if k.category == "layout":
            return REMOVED
        half = k.precision in ("fp16", "bf16")  # where the factor was measured
        if half and (k.category == "norm" or "pool" in k.act.name.lower()):
            return _f("nchw_to_nhwc_norm", v)
        if k.category == "conv" and k.precision in ("fp16", "bf16"):
            return _f("nchw_to_nhwc_half_conv", v)
        return 1.0
    return Fix(kernel_factor=factor, by_class=True)


def _bound_ms(report: dict[str, Any]) -> dict[str, float]:
    """Per-iteration milliseconds of each bottleneck class, on the un-profiled time when the
    run has it (the profiler inflates host time, not GPU time)."""
    b = report.get("bottleneck") or {}
    return b.get("corrected_ms") or b.get("mean_ms") or {}


def _bound_pct(report: dict[str, Any]) -> dict[str, float]:
    ms = _bound_ms(report)
    total = sum(ms.values())
    return {c: round(100.0 * v / total, 1) if total > 0 else 0.0 for c, v in ms.items()}


def _iteration_ms(report: dict[str, Any]) -> float:
    it = report["iterations"]
    return it.get("unprofiled_median_ms") or it.get("mean_ms") or 0.0


def _pageable_h2d(report: dict[str, Any]) -> tuple[float, float]:
    """(microseconds, bytes) of host-to-device copies from pageable memory, whole window."""
    us = nbytes = 0.0
    for k in report["kernels"]:
        name = k["name"]
        if k.get("kind") == "memcpy" and "Pageable" in name and ("HtoD" in name or "H2D" in name):
            us += k["total_us"]
            nbytes += k.get("bytes") or 0
    return us, nbytes


def _input_prep(report: dict[str, Any]) -> tuple[float, float]:
    """(ms, % of the profiled iteration) of host work before each forward: data fetches and
    op-less Python (bottleneck.input_prep), whether or not the GPU idled meanwhile."""
    prep = (report.get("bottleneck") or {}).get("input_prep_ms") or 0.0
    return prep, _pct(prep, report["iterations"].get("mean_ms") or 0.0)


INPUT_PIPELINE_FIX: dict[str, str] = {
    "pytorch": ("# do the per-sample work (decode, augment, tokenise, collate) in a Dataset\n"
                "loader = DataLoader(ds, batch_size=..., num_workers=8, pin_memory=True,\n"
                "                    persistent_workers=True, prefetch_factor=4)\n"
                "x = x.cuda(non_blocking=True)\n"
                "# text: tokenise once ahead of training (datasets.map(..., batched=True)) or in "
                "the workers"),
    "keras": ("ds = ds.map(f, "
              "num_parallel_calls=tf.data.AUTOTUNE).cache().prefetch(tf.data.AUTOTUNE)"),
    "jax": ("# prepare batches in a background thread or grain/tf.data workers and\n"
            "# prefetch them to the device, e.g. flax.jax_utils.prefetch_to_device(it, 2)"),
}


def rule_input_pipeline(report: dict[str, Any]) -> dict[str, Any] | None:
    if not _gpu_us(report):
        return None  # a CPU-only trace says nothing about a GPU waiting
    ms = _bound_ms(report)
    pct = _bound_pct(report)
    wait_ms = (report.get("system") or {}).get("data_wait_mean_ms") or 0.0
    iter_ms = _iteration_ms(report)
    loader = max(ms.get("data_wait", 0.0), 0.0)
    host = ms.get("host", 0.0)
    share = pct.get("data_wait", 0.0) + pct.get("host", 0.0)
    hook_share = _pct(wait_ms, iter_ms) if wait_ms and iter_ms else 0.0
    prep_ms, prep_share = _input_prep(report)
    exposed = max(share, hook_share) >= INPUT_PIPELINE_MIN_WAIT_PCT
    # Host work before the forward delays every launch after it when the host sets the pace,
    # even while the GPU still runs the last step's queue (then the bottleneck shows the GPU
    # busy, not waiting): from INPUT_PREP_MIN_PCT of the iteration it is worth moving, and
    # the re-timed saving decides (evidence confirm_min_pct: a saturated GPU hides it).
    if not exposed and prep_share < INPUT_PREP_MIN_PCT:
        return None
    where = []
    if loader >= host and loader > 0:
        where.append(f"{round(loader, 1)} ms waiting for the data loader")
    if host > 0.05:
        where.append(f"{round(host, 1)} ms of host work outside framework ops (no op runs: "
                     "Python, numpy/PIL preprocessing, tokenisation)")
    if loader < host and loader > 0.05:
        where.append(f"{round(loader, 1)} ms waiting for the data loader")
    copy = ms.get("copy", 0.0)
    if copy > 0.05:
        where.append(f"{round(copy, 1)} ms of host-to-device copies")
    if not exposed or prep_ms > loader + host:
        where.append(f"{round(prep_ms, 1)} ms ({prep_share}%) of host work before each "
                     "forward, in data fetches and Python outside framework ops (collate, "
                     "padding, tokenisation), which delays every launch after it")
    if not where:
        where.append(f"{round(wait_ms, 1)} ms waiting for each batch (hook timing)")
    top = max(share, hook_share, prep_share)
    # the most it can remove: the exposed waits, the hook's measured wait, the prep work
    removable = round(max(loader + host, wait_ms, prep_ms), 3)
    no_loader = host > loader or (not exposed and not loader)
    return _rec("input_pipeline", "high" if top >= 20 else "medium",
                "Feed the GPU faster: preparing the input stalls training",
                f"Preparing the input takes {top}% of each iteration: " + "; ".join(where) + "."
                + (" The batches are prepared in the training loop itself: move that work into "
                   "a Dataset and let DataLoader workers do it ahead of the GPU." if no_loader
                   else ""),
                {"data_loader_wait_ms": round(loader, 3), "host_outside_ops_ms": round(host, 3),
                 "copy_ms": round(copy, 3), "input_bound_pct": round(top, 1),
                 "hook_data_wait_ms": round(wait_ms, 3) if wait_ms else None,
                 "input_prep_ms": round(prep_ms, 3),
                 "confirm_min_pct": None if exposed else INPUT_PIPELINE_MIN_WAIT_PCT},
                INPUT_PIPELINE_FIX,
                None, report, removable)


def fix_input_pipeline(v: int) -> Fix:
    return Fix(outside_rate=0.0, data_rate=0.0)


PINNED_MEMORY_FIX: dict[str, str] = {
    "pytorch": ("DataLoader(ds, ..., pin_memory=True)\n"
                "x = x.to('cuda', non_blocking=True)\n"
                "# tensors made by hand: x = x.pin_memory() once, reuse the buffer"),
    "keras": ("# tf.data: ds.prefetch(tf.data.AUTOTUNE) (+ "
              "tf.data.experimental.prefetch_to_device('/gpu:0'))"),
    "jax": ("# jax.device_put the next batch while this step runs (prefetch ahead), e.g. "
            "flax.jax_utils.prefetch_to_device(it, 2)"),
}


def rule_pinned_memory(report: dict[str, Any]) -> dict[str, Any] | None:
    """Host-to-device copies from pageable memory: staged through a driver buffer at a
    fraction of PCIe speed, and they block the host until done."""
    us, nbytes = _pageable_h2d(report)
    per_iter = _per_iter_ms(report, us)
    iter_ms = _iteration_ms(report)
    share = _pct(per_iter, iter_ms)
    if share < PINNED_MIN_COPY_PCT:
        return None
    pinned_ms = _per_iter_ms(report, nbytes / PINNED_H2D_BYTES_PER_US) if nbytes else 0.0
    gbps = round(nbytes / us / 1e3, 1) if us and nbytes else None
    return _rec("pinned_memory", "high" if share >= 20 else "medium",
                "Copy inputs from pinned memory, asynchronously",
                f"{share}% of each iteration is host-to-device copies from pageable memory "
                f"({per_iter} ms, {round(nbytes / 2**20 / max(report['iterations']['count'], 1))}"
                f" MiB per iteration{f' at {gbps} GB/s' if gbps else ''}). Pageable copies are "
                "staged through a driver buffer and block the host until they finish; from "
                "pinned memory they run at full PCIe speed and overlap with compute.",
                {"pageable_copy_ms": per_iter, "pageable_copy_pct": share,
                 "pageable_gbps": gbps, "pinned_estimate_ms": pinned_ms},
                PINNED_MEMORY_FIX,
                None, report, per_iter)


def fix_pinned_memory(v: int) -> Fix:
    def factor(k: SimKernel) -> float:
        a = k.act
        if a.kind != "kernel" and "Pageable" in a.name and ("HtoD" in a.name or "H2D" in a.name):
            pinned_us = (a.bytes or 0) / PINNED_H2D_BYTES_PER_US
            return a.dur_us / pinned_us if pinned_us > 0 else 1.0
        return 1.0
    return Fix(kernel_factor=factor, copy_call_rate=0.0)


HOST_SYNC_FIX: dict[str, str] = {
    "pytorch": ("# accumulate on the device, read every N steps\n"
                "running = running + loss.detach()   # no .item() here\n"
                "if step % 50 == 0: print((running / 50).item()); running.zero_()"),
    "keras": ("# log less often: model.fit(..., steps_per_execution=N); avoid numpy() on tensors "
              "inside train_step"),
    "jax": "# keep metrics as device arrays; jax.device_get them every N steps",
}
# with graph breaks: the forward branches on GPU values
HOST_SYNC_BRANCH_FIX: dict[str, str] = {
    "pytorch": ("# route on the device, no nonzero + Python `if` per branch:\n"
                "# MoE: grouped-GEMM experts, e.g. transformers\n"
                "model = AutoModelForCausalLM.from_pretrained(..., "
                "experts_implementation=\"grouped_mm\")\n"
                "# or torch._grouped_mm over tokens sorted by expert; elsewhere\n"
                "# masks (torch.where, scatter/gather, index_add on all rows) instead of nonzero "
                "+ if"),
    "keras": ("# vectorise the branches: tf.where / masks, tf.math.segment_sum or a grouped "
              "einsum over experts instead of a Python loop on numpy() values"),
    "jax": ("# data-dependent control flow on device: jnp.where, lax.cond/lax.select, "
            "segment_sum or ragged/grouped matmuls over experts (jax.lax.ragged_dot) instead of "
            "host branches"),
}


def rule_host_sync(report: dict[str, Any]) -> dict[str, Any] | None:
    """The host blocks on the device every iteration, so host and GPU work cannot overlap."""
    b = report.get("bottleneck") or {}
    sites = b.get("sync_sites") or []
    if not sites:
        return None
    ms = _bound_ms(report)
    # While blocked the host could have queued the next work; without the sync the exposed host
    # time (GPU idle waiting for the host) overlaps with GPU work, up to the time it was blocked.
    blocked = sum(s["blocked_ms_per_iteration"] for s in sites)
    refill = ms.get("sync", 0.0)  # GPU idle right after a sync: queued work would hide it
    exposed = ms.get("dispatch", 0.0) + ms.get("host", 0.0)
    # the overlap the syncs prevent: what decides whether the rule fires (the re-timing
    # estimates the saving)
    overlap = round(refill + min(blocked, exposed), 3)
    # Without the syncs the host runs ahead: what goes is the GPU's idle after each sync and
    # the host's time blocked in them, no more.
    removable = round(refill + blocked, 3)
    # Syncs inside the forward (graph breaks: nonzero, .item(), `if` on a GPU value) are the
    # host branching on GPU values, one branch at a time: the dispatch between the forward's
    # first and last sync (and its share of the backward, autograd replaying the same ops)
    # exists only because of that, and vectorising the branches (grouped ops, masks) removes
    # most of it (whatif.SPEEDUPS["vectorised_branch_dispatch"]: an op-count model). Scaled
    # to the un-profiled time as the dispatch class is (the profiler inflates host time).
    # Syncs outside the forward (loss.item(), gradient norms) branch nothing: no graph
    # breaks, no change.
    b_dispatch = float(b.get("branch_dispatch_ms") or 0.0) if b.get("graph_breaks") else 0.0
    raw = (b.get("mean_ms") or {}).get("dispatch") or 0.0
    if b_dispatch > 0 and raw > 0 and b.get("corrected_ms"):
        b_dispatch *= min(ms.get("dispatch", raw) / raw, 1.0)
    if b_dispatch > 0:
        typical = SPEEDUPS["vectorised_branch_dispatch"][0]
        overlap = round(overlap + min(b_dispatch * (1.0 - 1.0 / typical),
                                    max(exposed - min(blocked, exposed), 0.0)), 3)
        removable = round(removable + b_dispatch, 3)
    iter_ms = _iteration_ms(report)
    share = _pct(overlap, iter_ms)
    if share < HOST_SYNC_MIN_PCT:
        return None
    per_iter = sum(s["count_per_iteration"] for s in sites)
    named = ", ".join(f"{s['op']} x{s['count_per_iteration']:g}"
                      + (f" at {s['source']}" if s.get("source") else "") for s in sites[:3])
    evidence = {"blocked_ms": round(blocked, 3), "refill_ms": round(refill, 3),
                "exposed_host_ms": round(exposed, 3),
                "syncs_per_iteration": round(per_iter, 2), "sites": sites[:5]}
    problem = (f"The host blocks on the GPU {round(per_iter, 1)} times per iteration ({named}): "
               f"{round(blocked, 2)} ms per iteration it waits instead of queuing work, and "
               f"afterwards the GPU idles {round(refill, 2)} ms while the host launches the "
               "next work from an empty queue. Reading a value on the host (.item(), float(t), "
               "print(t), .cpu(), .tolist(), np.asarray) waits for every kernel queued before "
               "it.")
    fix = HOST_SYNC_FIX
    title = "Stop synchronizing with the GPU every iteration"
    if b_dispatch > 0:
        breaks = ", ".join(f"{g['op']} x{g['count_per_iteration']:g}"
                           for g in b["graph_breaks"][:4])
        evidence.update(branch_dispatch_ms=round(b_dispatch, 3),
                        branch_share=b.get("branch_share"))
        title = "Keep the forward's data-dependent branches on the GPU, vectorised"
        problem = (f"Inside the forward the host reads GPU values and branches on them "
                   f"({breaks} per iteration: nonzero/where on a mask, `if` on a tensor, "
                   ".item()), then issues each branch's ops one branch at a time (an MoE's "
                   "per-expert loop, say); autograd replays the same per-branch ops in the "
                   f"backward. About {round(b_dispatch, 1)} ms per iteration of host dispatch "
                   "(the forward from its first to its last sync, and the backward's share) "
                   "comes from that, besides the waits. " + problem)
        fix = HOST_SYNC_BRANCH_FIX
    return _rec("host_sync", "high" if share >= 20 else "medium", title, problem, evidence,
                fix, None, report, removable)


def fix_host_sync(v: int, branch_share: float = 0.0) -> Fix:
    """No host waits on the GPU. ``branch_share``: with syncs inside the forward (graph
    breaks), the share of the forward's dispatch where it branches on GPU values
    (bottleneck.branch_share): the fix vectorises those branches, so that dispatch falls by
    the ``vectorised_branch_dispatch`` factor, and the same share of the backward's (autograd
    replays the forward's per-branch ops)."""
    if branch_share <= 0.0:
        return Fix(syncs_wait=False)
    rate = 1.0 / _f("vectorised_branch_dispatch", v)
    share = min(branch_share, 1.0)
    return Fix(syncs_wait=False, branch_rate=rate, backward_rate=1.0 - share * (1.0 - rate))


BATCH_SIZE_FIX: dict[str, str] = {
    "pytorch": ("DataLoader(ds, batch_size=2 * old_batch_size, ...)\n"
                "# scale the learning rate with the batch (linear scaling + warm-up)"),
    "keras": "model.fit(ds, batch_size=2 * old_batch_size)  # and scale the LR",
    "jax": "# double the per-device batch; scale the learning rate",
}


def rule_batch_size(report: dict[str, Any]) -> dict[str, Any] | None:
    pct = _bound_pct(report)
    busy_pct = pct.get("gpu", 0.0) + pct.get("copy", 0.0) + pct.get("communication", 0.0)
    if not pct:
        bd = report["breakdown"]
        busy_pct = _pct(bd["gpu_busy_us"], bd["wall_us"])
    system = report.get("system") or {}
    peak = system.get("memory_peak_bytes")
    total = system.get("gpu_memory_bytes")
    if not peak or not total or busy_pct >= BATCH_SIZE_MAX_BUSY_PCT:
        return None
    frac = peak / total
    if frac >= BATCH_SIZE_MAX_MEMORY_FRACTION:
        return None
    input_bound = pct.get("data_wait", 0.0) + pct.get("host", 0.0)
    if input_bound >= INPUT_PIPELINE_MIN_WAIT_PCT or pct.get("sync", 0.0) >= HOST_SYNC_MIN_PCT:
        return None  # a bigger batch would only wait longer for its data, or sync as often
    spe = system.get("steps_per_execution")
    fix = BATCH_SIZE_FIX
    evidence: dict[str, Any] = {"gpu_busy_pct": round(busy_pct, 1),
                                "memory_used_pct": round(100 * frac, 1)}
    problem = (f"The GPU is busy only {round(busy_pct, 1)}% of each iteration and the job uses "
               f"{round(100 * frac, 1)}% of GPU memory: larger batches amortize launch and "
               "host overhead over more work per kernel.")
    gpus = gpu_devices(report.get("memory"))
    fits = batch_headroom(gpus[0], total) if len(gpus) == 1 else None
    if fits is not None and fits >= 1.0:
        evidence["batch_fits_times"] = round(fits, 2)
        problem += (f" From what fills memory at the peak (activations and temporaries grow with "
                    f"the batch; weights and optimizer state do not), about {fits:.1f}x the "
                    "current batch fits: a prediction, not yet run.")
    if spe == 1:
        fix = dict(fix, keras=fix["keras"] + "\nmodel.compile(..., steps_per_execution=32)"
                   "  # fewer host round trips")
    return _rec("batch_size", "medium", "Increase the batch size: the GPU is under-used",
                problem, evidence, fix, None, report)


def _graph_breaks(report: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """The forward's host syncs (bottleneck.graph_breaks: ``.item()``, ``nonzero``, DtoH
    copies inside the forward) and the share of the work torch.compile can capture.

    Discount model: each break inside the forward ends a graph, so n breaks make n + 1
    graphs; after a data-dependent break (routing by ``nonzero``, a value read by ``.item()``)
    the shapes change from step to step and the later graphs recompile or fall back to
    eager, so only the first graph counts as compiled. Breaks of per-layer syncs come once
    per layer, so the graphs are taken as equal in time: the compilable share is the
    forward's time before its first break, 1 / (n + 1) of it."""
    breaks = (report.get("bottleneck") or {}).get("graph_breaks") or []
    n = sum(b["count_per_iteration"] for b in breaks)
    return breaks, round(1.0 / (1.0 + n), 3)


COMPILE_FIX: dict[str, str] = {
    "pytorch": "model = torch.compile(model)  # mode='max-autotune' adds CUDA graphs",
    "keras": "model.compile(..., jit_compile=True)  # XLA",
    "jax": "step = jax.jit(step)  # jit the whole training step, not pieces",
}


def rule_compile(report: dict[str, Any]) -> dict[str, Any] | None:
    if _compiled(report):
        return None  # torch.compile, XLA or CUDA graphs already run (flags or the trace)
    if not _gpu_us(report):
        return None  # no GPU work in the trace: nothing to say about launch overhead
    ms = _bound_ms(report)
    pct = _bound_pct(report)
    dispatch_pct = pct.get("dispatch", 0.0)
    gpu = _gpu_us(report)
    small = _sum(report, lambda k: k["category"] in ("elementwise", "reduction", "norm"))
    small_pct = _pct(small, gpu)
    launches = sum(k["count"] for k in report["kernels"] if k.get("kind", "kernel") == "kernel")
    per_iter = launches / max(report["iterations"]["count"], 1)
    gpu_bound = pct.get("gpu", 0.0) >= 50.0
    fires_host = dispatch_pct >= COMPILE_MIN_HOST_BOUND_PCT
    # small kernels matter only where they are the critical path: a GPU-bound iteration
    fires_small = (gpu_bound and small_pct >= COMPILE_MIN_SMALL_KERNEL_PCT
                   and per_iter >= COMPILE_MIN_KERNELS_PER_ITER)
    if not (fires_host or fires_small):
        return None
    breaks, compilable = _graph_breaks(report)
    # at best the GPU's idle while the host dispatches and the fusable kernels both go
    removable = round(ms.get("dispatch", 0.0) + _per_iter_ms(report, small), 3)
    problem = (f"{dispatch_pct}% of each iteration the GPU idles while the host dispatches "
               "ops and launches kernels one by one, "
               f"and {small_pct}% of GPU time is {round(per_iter)} small elementwise/"
               "reduction/norm kernels per iteration: a compiler fuses them and replays "
               "launches (XLA, torch.compile, CUDA graphs).")
    if breaks:
        named = ", ".join(f"{b['op']} x{b['count_per_iteration']:g}"
                          + (f" at {b['source']}" if b.get("source") else "")
                          for b in breaks[:3])
        problem += (f" The forward synchronizes with the host ({named} per iteration): each "
                    "is a graph break, data-dependent control flow that torch.compile cannot "
                    f"capture, so the estimate counts {round(100 * compilable)}% of the work "
                    "as compilable; keep routing and values on the device to compile more.")
    evidence: dict[str, Any] = {"dispatch_pct": dispatch_pct, "small_kernel_pct": small_pct,
                                "kernels_per_iteration": round(per_iter)}
    if breaks:  # shown only where there are some: "graph breaks: none" is no evidence
        evidence.update(graph_breaks=[b["op"] for b in breaks[:5]], compilable_share=compilable)
    return _rec("compile", "medium",
                "Compile the model: fuse small kernels and cut launch overhead", problem,
                evidence,
                COMPILE_FIX,
                None, report, removable)


def fix_compile(v: int, compilable: float = 1.0) -> Fix:
    """``compilable``: the share of the work torch.compile can capture (graph breaks,
    rule_compile): fusion and cheaper dispatch apply to that share only."""
    fusion, rate = _f("fusion_small_kernels", v), 1.0 / _f("compile_dispatch", v)
    if compilable < 1.0:
        fusion = 1.0 + max(compilable, 0.0) * (fusion - 1.0)
        rate = 1.0 - max(compilable, 0.0) * (1.0 - rate)

    def factor(k: SimKernel) -> float:
        return fusion if k.category in MEMORY_BOUND else 1.0
    return Fix(kernel_factor=factor, framework_rate=rate, by_class=True)


DISPATCH_OVERHEAD_FIX: dict[str, str] = {
    "pytorch": ("model = torch.compile(model, mode='reduce-overhead')  # CUDA graphs\n"
                "# or a larger batch per step"),
    "keras": "model.compile(..., steps_per_execution=32)  # run 32 steps per host round trip",
    "jax": ("# scan several micro-steps inside one jitted call:\n"
            "params = jax.lax.fori_loop(0, 8, lambda i, p: step(p, batches[i]), params)"),
}


def rule_dispatch_overhead(report: dict[str, Any]) -> dict[str, Any] | None:
    """Dispatch-bound where a compiler already runs (XLA, torch.compile): each step is one or
    a few launches, and the host's per-step work is what the GPU waits for."""
    compiled = _compiled(report)
    pct = _bound_pct(report)
    share = pct.get("dispatch", 0.0)
    if not compiled or not _gpu_us(report) or share < COMPILE_MIN_HOST_BOUND_PCT:
        return None
    ms = _bound_ms(report)
    spe = (report.get("system") or {}).get("steps_per_execution")
    fix = DISPATCH_OVERHEAD_FIX
    if spe and spe > 1:
        fix = dict(fix, keras=f"# steps_per_execution is {spe}: raise it, or the batch size")
    return _rec("dispatch_overhead", "high" if share >= 50 else "medium",
                "Give the GPU more work per host round trip",
                f"{share}% of each iteration the GPU waits while the host dispatches the step "
                f"({round(ms.get('dispatch', 0.0), 2)} ms per iteration against "
                f"{round(ms.get('gpu', 0.0), 2)} ms of GPU work): the step is already compiled, "
                "so run several steps per dispatch, or make each step larger.",
                {"dispatch_pct": share, "dispatch_ms": round(ms.get("dispatch", 0.0), 3),
                 "gpu_ms": round(ms.get("gpu", 0.0), 3), "steps_per_execution": spe},
                fix, None, report, ms.get("dispatch", 0.0))


def fix_dispatch_overhead(v: int) -> Fix:
    return Fix(framework_rate=1.0 / _f("compile_dispatch", v))


# -- the rules --------------------------------------------------------------------------------

def _evidence(rec: Rec | None) -> dict[str, Any]:
    return (rec or {}).get("evidence") or {}


def _amp_fix(rec: Rec | None, replay: Replay) -> FixBuilder:
    # no kernel of the window runs in half precision: the dtype-less ones (XLA's fusions)
    # run in FP32 like everything else
    no_half = not any(k.precision in HALF for k in replay.kernels)
    return partial(fix_amp, unknown_is_fp32=no_half)


def _compile_fix(rec: Rec | None, replay: Replay) -> FixBuilder:
    share = _evidence(rec).get("compilable_share")
    return fix_compile if share is None else partial(fix_compile, compilable=float(share))


def _host_sync_fix(rec: Rec | None, replay: Replay) -> FixBuilder:
    branch = _evidence(rec).get("branch_share")
    return partial(fix_host_sync, branch_share=float(branch)) if branch else fix_host_sync


def _host_sync_what(rec: Rec) -> str:
    return "no host waits on the GPU" + (
        "; the forward's per-branch dispatch and the backward's share vectorised"
        if _evidence(rec).get("branch_share") else "")


def _plain(build: FixBuilder) -> Callable[[Rec | None, Replay], FixBuilder]:
    return lambda rec, replay: build


def _says(text: str) -> Callable[[Rec], str]:
    return lambda rec: text


# the in-loop switches verification uses (capture/switches.py: torch only)
_SWITCHES = "tb_gpuprof.capture.switches"
_NEEDS_LOADER = ("DataLoader workers and their prefetching are set when the loader is built: "
                 "they cannot be switched between blocks of the running loop")

TF32_DOC = RuleDoc(
    fires=("FP32 matrix math (GEMM/conv/attention kernels, or kernels of Tensor-Core-eligible "
           "ops, classified FP32 and not Tensor Core) ≥ 10%"),
    silent=("TF32 already on (`allow_tf32_matmul` and `allow_tf32_cudnn`, or "
            "`float32_matmul_precision` high/medium, or TF's `tf32_enabled`); autocast on; GPU "
            "older than Ampere (no TF32)"),
    estimate="re-timed: FP32 SIMT GEMM/conv kernels ÷ `fp32_to_tf32_*`",
    bound="the FP32 matrix kernels' time",
)

AMP_DOC = RuleDoc(
    fires="FP32 + TF32 matrix math ≥ 15% and more than FP16/BF16 Tensor Core time",
    silent="autocast on, or a Keras `mixed_*` policy",
    estimate=("re-timed: TF32 (and FP32) matrix kernels ÷ `tf32_to_half_*`; FP32 norm ÷ "
              "`memory_half_norm`, elementwise/reduction ÷ `memory_half_elementwise`; host "
              "framework time ÷ `amp_dispatch` (autocast's cast ops)"),
    bound=("the time of the kernels it moves: FP32/TF32 matrix math, FP32 "
           "norm/elementwise/reduction (dtype-less kernels too where nothing runs in half "
           "precision)"),
)

CHANNELS_LAST_DOC = RuleDoc(
    fires=("layout-transform kernels (`nchwToNhwcKernel`, `nhwcToNchwKernel`, …) ≥ 3% and the "
           "window has convolutions"),
    silent="`channels_last` recorded true",
    estimate=("re-timed: layout transforms removed; FP16/BF16 norm and pooling ÷ "
              "`nchw_to_nhwc_norm`; FP16/BF16 convs ÷ `nchw_to_nhwc_half_conv`"),
    bound="layout transforms + half-precision norm/pooling/convolution kernels",
)

INPUT_PIPELINE_DOC = RuleDoc(
    fires=("data-loader wait + host work outside framework ops (bottleneck `data_wait` + "
           "`host`) ≥ 5% of the iteration, or the hook's measured data wait ≥ 5%; or the host's "
           "input preparation before each forward (`bottleneck.input_prep_ms`: data fetches and "
           "op-less Python, short stretches included, whether or not the GPU idled meanwhile) ≥ "
           "10% of the profiled iteration, with or without a DataLoader and whatever the "
           "largest share"),
    silent=("below thresholds; on the input-preparation path, a re-timed saving below 5% (the "
            "work hides under a saturated GPU)"),
    estimate=("re-timed: op-less host work, data-loader waits, and the op-less stretches of the "
              "input preparation before the forward however short, take no time (moved to "
              "workers)"),
    bound=("max(data-loader wait + host work outside ops, the hook's data wait, the input "
           "preparation before the forward)"),
)

PINNED_MEMORY_DOC = RuleDoc(
    fires=("host-to-device copies from pageable memory (`Memcpy HtoD (Pageable -> Device)`) ≥ "
           "5% of the iteration"),
    silent="copies from pinned memory",
    estimate="re-timed: pageable H2D copies at 50 GB/s, their host calls no longer block",
    bound="the pageable host-to-device copies' time",
)

HOST_SYNC_DOC = RuleDoc(
    fires=("the host blocks on the device every iteration (sync calls under `.item()`, "
           "`float(t)`, `.cpu()`, `torch.cuda.synchronize`, pageable device-to-host copies, XLA "
           "`BlockHostUntilReady`) and the overlap it prevents is ≥ 8% of the iteration; names "
           "the op and its source line when stacks were recorded. Listed before `compile` when "
           "the syncs are the largest share of the iteration, or when `compile`'s graph breaks "
           "are syncs (its estimate is then counted after `host_sync`: torch.compile cannot "
           "capture a sync inside the forward, CUDA graphs cannot hold one), with `compile`'s "
           "severity and `evidence.prerequisite_of`; syncs outside the model (`loss.item()`, "
           "gradient norms) leave `compile` to its own estimate and the savings' order. When "
           "the syncs are graph breaks (inside the forward: the host branches on GPU values, "
           "e.g. an MoE's per-expert `nonzero` + `if` loop), the advice is to keep the "
           "data-dependent branches on the device, vectorised (grouped-GEMM experts, "
           "`experts_implementation=\"grouped_mm\"`, `torch._grouped_mm`, masks and "
           "scatter/gather instead of `nonzero` + `if`), and it counts the per-branch dispatch "
           "that removes (`bottleneck.branch_dispatch_ms`)"),
    silent="no sync in the window, or a sync that costs little (the GPU was busy anyway)",
    estimate=("re-timed: host syncs do not wait; with graph breaks, the model's framework time "
              "from the forward's first to its last sync ÷ `vectorised_branch_dispatch`, and "
              "the backward's framework time at 1 − share × (1 − 1/factor), share being that "
              "span's part of the forward's framework time"),
    bound=("the GPU's idle after syncs (`sync`) + the time the host was blocked in them; with "
           "graph breaks, + the branch dispatch (the forward's framework time from its first to "
           "its last sync, + the same share of the backward's: autograd replays the forward's "
           "per-branch ops), scaled to the un-profiled time as the `dispatch` class"),
)

BATCH_SIZE_DOC = RuleDoc(
    fires=("GPU busy (bottleneck `gpu` + `copy` + `communication`) < 60% of the iteration, peak "
           "memory < 50% of the GPU's, and the iteration is not input- or sync-bound"),
    silent="memory unknown (imported trace), or above thresholds",
    estimate="not estimated",
    bound="–",
)

COMPILE_DOC = RuleDoc(
    fires=("op dispatch (bottleneck `dispatch`) ≥ 15% of the iteration, or a GPU-bound "
           "iteration (`gpu` ≥ 50%) with elementwise/reduction/norm kernels ≥ 30% of GPU time "
           "at ≥ 200 kernels per iteration. Host syncs inside the forward "
           "(`bottleneck.graph_breaks`: `.item()`, `nonzero`, device-to-host copies between two "
           "forward kernel launches, before the backward) are named as graph breaks and "
           "discount the estimate"),
    silent=("compiled code, from the hook's flags (`compiled`, `jit_compile`) **or from the "
            "trace** (`bottleneck.compiled_code`: Inductor's `triton_*` kernels, "
            "`Torch-Compiled Region` / `CompiledFunction` / `## Call CompiledFxGraph` ops, "
            "`cudaGraphLaunch`/`cuGraphLaunch`); JAX programs, XLA-compiled XPlane traces; host "
            "work outside ops or data waits (not dispatch)"),
    estimate=("re-timed: elementwise/reduction/norm ÷ `fusion_small_kernels`; host framework "
              "time inside the model's forward and backward ÷ `compile_dispatch` (both scaled "
              "to the compilable share); framework time outside them (the optimizer step, "
              "gradient norms, `.item()`) stays eager; counted after `host_sync` when the graph "
              "breaks are syncs"),
    bound=("the GPU's idle while the host dispatches (`dispatch`) + the "
           "elementwise/reduction/norm kernels' time"),
)

DISPATCH_OVERHEAD_DOC = RuleDoc(
    fires=("op dispatch ≥ 15% of the iteration where a compiler already runs (JAX, XLA, Keras "
           "`jit_compile`, torch.compile: flags or the trace, as for `compile`)"),
    silent="not dispatch-bound",
    estimate=("re-timed: host framework time ÷ `compile_dispatch` (inside the model's forward "
              "and backward when phases are known)"),
    bound="the `dispatch` time",
)

RULES: tuple[Rule, ...] = (
    Rule("tf32", on_report(rule_tf32), TF32_DOC, TF32_FIX,
         Retiming(_plain(fix_tf32),
                  _says("FP32 GEMM/conv kernels at TF32 Tensor Core speed")),
         applied_flags=("allow_tf32_matmul", "allow_tf32_cudnn", "float32_matmul_precision",
                        "tf32_enabled", "nvidia_tf32_override", "trainer_tf32"),
         switch=f"{_SWITCHES}:Tf32Switch"),
    Rule("amp", on_report(rule_amp), AMP_DOC, AMP_FIX,
         Retiming(_amp_fix,
                  _says("matrix kernels at half-precision Tensor Core speed, FP32 "
                        "memory-bound kernels moving half the bytes, autocast's extra "
                        "dispatch"),
                  after="tf32"),
         applied_flags=("autocast", "mixed_precision_policy", "trainer_bf16", "trainer_fp16"),
         switch=f"{_SWITCHES}:AutocastBf16Switch"),
    Rule("channels_last", on_report(rule_channels_last), CHANNELS_LAST_DOC, CHANNELS_LAST_FIX,
         Retiming(_plain(fix_channels_last),
                  _says("layout transforms removed, NHWC norm/pool and half-precision "
                        "convolutions faster")),
         applied_flags=("channels_last",), switch=f"{_SWITCHES}:ChannelsLastSwitch"),
    Rule("input_pipeline", on_report(rule_input_pipeline), INPUT_PIPELINE_DOC,
         INPUT_PIPELINE_FIX,
         Retiming(_plain(fix_input_pipeline),
                  _says("host work outside ops and data-loader waits moved off the critical "
                        "path")),
         not_verifiable=_NEEDS_LOADER, supersedes=("nvml_batch_size",)),
    Rule("pinned_memory", on_report(rule_pinned_memory), PINNED_MEMORY_DOC, PINNED_MEMORY_FIX,
         Retiming(_plain(fix_pinned_memory),
                  _says("pageable copies at pinned speed, not blocking the host")),
         not_verifiable=("pinned host buffers are made by the DataLoader (pin_memory) or the "
                         "user's code: the hook cannot re-allocate the batches it is given")),
    Rule("host_sync", on_report(rule_host_sync), HOST_SYNC_DOC, HOST_SYNC_FIX,
         Retiming(_host_sync_fix, _host_sync_what),
         not_verifiable=("the syncs are the training code's own reads (.item(), nonzero + "
                         "if): removing them is a change of code, not a setting")),
    Rule("batch_size", on_report(rule_batch_size), BATCH_SIZE_DOC, BATCH_SIZE_FIX,
         not_verifiable=("the batch size is the data's shape and the optimisation's "
                         "hyper-parameter: changing it mid-run changes what is trained"),
         supersedes=("nvml_batch_size",)),
    Rule("compile", on_report(rule_compile), COMPILE_DOC, COMPILE_FIX,
         Retiming(_compile_fix, _says("small kernels fused, host dispatch cheaper"),
                  after="host_sync",
                  after_when=lambda rec: bool(_evidence(rec).get("graph_breaks")),
                  after_when_syncs_bound=True),
         applied_flags=("compiled", "jit_compile", "trainer_torch_compile"),
         switch=f"{_SWITCHES}:CompileSwitch"),
    Rule("dispatch_overhead", on_report(rule_dispatch_overhead), DISPATCH_OVERHEAD_DOC,
         DISPATCH_OVERHEAD_FIX,
         Retiming(_plain(fix_dispatch_overhead),
                  _says("host dispatch per iteration cheaper")),
         switch=f"{_SWITCHES}:CudaGraphsSwitch"),
)
