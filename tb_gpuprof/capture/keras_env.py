"""What a Keras process is set up to do, per backend: versions, GPU, and the switches the
recommendations read (docs/recommendations.md): ``mixed_precision_policy``, ``jit_compile``,
``tf32_enabled``, ``channels_last``, ``compiled``.

Every framework module is taken from ``sys.modules`` or imported only for the backend Keras
runs on (TensorFlow is never imported for the JAX or torch backends). Every probe is
best-effort: one that fails leaves its field ``None``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

# jax_default_matmul_precision values that keep FP32 matmuls/convolutions on TF32 Tensor Cores
# (None and "default" are XLA:GPU's default: TF32 on Ampere and newer).
_JAX_TF32_PRECISIONS = {None, "default", "fastest", "bfloat16", "tensorfloat32",
                        "bfloat16_3x", "ANY_F32"}


def _probe(fn: Callable[[], Any], default: Any = None) -> Any:
    try:
        return fn()
    except Exception:
        return default


def keras_backend(keras: Any) -> str:
    """"tensorflow", "jax", "torch", ... (tf.keras / Keras 2 has only TensorFlow)."""
    config = getattr(keras, "config", None)
    fn = getattr(config, "backend", None) or getattr(keras.backend, "backend", None)
    return str(fn()) if fn is not None else "tensorflow"


def framework_module(backend: str) -> Any:
    """The backend's framework module (imported by Keras already, so this costs nothing)."""
    name = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}.get(backend)
    return importlib.import_module(name) if name else None


def gpu_present(backend: str, fw: Any) -> bool:
    if backend == "tensorflow":
        return bool(_probe(lambda: fw.config.list_physical_devices("GPU"), []))
    if backend == "jax":
        return any(d.platform == "gpu" for d in _probe(fw.local_devices, []))
    if backend == "torch":
        return bool(_probe(fw.cuda.is_available, False))
    return False


def _gpu_info(backend: str, fw: Any) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if backend == "tensorflow":
        gpus = fw.config.list_physical_devices("GPU")
        if gpus:
            d = fw.config.experimental.get_device_details(gpus[0])
            info["gpu_name"] = d.get("device_name")
            cc = d.get("compute_capability")
            if cc:
                info["compute_capability"] = f"{cc[0]}.{cc[1]}"
    elif backend == "jax":
        gpus = [d for d in fw.local_devices() if d.platform == "gpu"]
        if gpus:
            info["gpu_name"] = gpus[0].device_kind
            cc = getattr(gpus[0], "compute_capability", None)
            if cc:
                info["compute_capability"] = str(cc)
    elif backend == "torch" and fw.cuda.is_available():
        props = fw.cuda.get_device_properties(fw.cuda.current_device())
        info.update(gpu_name=props.name, compute_capability=f"{props.major}.{props.minor}",
                    num_sms=props.multi_processor_count, gpu_memory_bytes=props.total_memory)
    return info


def tf32_flags(backend: str, fw: Any) -> dict[str, Any]:
    """``tf32_enabled`` (the flag rule_tf32 reads for Keras) plus the backend's raw setting."""
    if backend == "tensorflow":
        on = _probe(lambda: bool(fw.config.experimental.tensor_float_32_execution_enabled()))
        return {"tf32_enabled": on}
    if backend == "jax":
        prec = _probe(lambda: fw.config.jax_default_matmul_precision)
        prec_s = None if prec is None else str(prec)
        return {"tf32_enabled": prec_s in _JAX_TF32_PRECISIONS or
                (prec_s or "").lower() in _JAX_TF32_PRECISIONS,
                "jax_default_matmul_precision": prec_s}
    if backend == "torch":
        from . import torch_env as _torch_env

        flags = _probe(lambda: _torch_env.tf32_flags(fw), {})
        return dict(flags)
    return {}


def precision_policy(keras: Any, model: Any) -> str | None:
    """The model's dtype policy name ("float32", "mixed_bfloat16", ...), else the global one."""
    policy = getattr(model, "dtype_policy", None) if model is not None else None
    name = getattr(policy, "name", None)
    if name:
        return str(name)
    mp: Any = getattr(keras, "mixed_precision", None)
    return _probe(lambda: str(mp.global_policy().name))


def jit_compile_state(model: Any) -> bool | None:
    """``model.jit_compile`` after ``compile()`` ("auto" is resolved to a bool by Keras 3)."""
    v = getattr(model, "jit_compile", None) if model is not None else None
    if v is None or v == "auto":
        return None
    return bool(v)


def versions(keras: Any, backend: str, fw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"framework": "keras",
                           "framework_version": str(getattr(keras, "__version__", "")) or None,
                           "keras_backend": backend,
                           "backend_version": str(getattr(fw, "__version__", "")) or None}
    if backend == "tensorflow":
        build = _probe(fw.sysconfig.get_build_info, {}) or {}
        out["cuda_runtime"] = build.get("cuda_version")
        out["cudnn"] = build.get("cudnn_version")
    elif backend == "torch":
        out["cuda_runtime"] = getattr(fw.version, "cuda", None)
    elif backend == "jax":
        out["jaxlib_version"] = _probe(lambda: importlib.import_module("jaxlib").__version__)
    return out


def distributed_info() -> dict[str, Any]:
    rank = os.environ.get("RANK", "")
    world = os.environ.get("WORLD_SIZE", "")
    return {"rank": int(rank) if rank.isdigit() else 0,
            "world_size": int(world) if world.isdigit() else 1, "backend": None}


def record_env(keras: Any, backend: str, fw: Any, model: Any,
               observed: dict[str, Any] | None = None) -> dict[str, Any]:
    """Snapshot the environment now; ``observed`` holds what the callback measured itself
    (batch-end dispatch, steps_per_execution, memory peak)."""
    env = _probe(lambda: versions(keras, backend, fw), {"framework": "keras"})
    env.update(_probe(lambda: _gpu_info(backend, fw), {}))
    jit = jit_compile_state(model)
    data_format = _probe(lambda: str(keras.config.image_data_format()))
    # TF and XLA convolutions are NHWC with channels_last; Keras' torch backend transposes
    # channels_last inputs to NCHW for torch's convolutions, so there it says nothing.
    channels_last = (data_format == "channels_last") if backend in ("tensorflow", "jax") \
        else None
    env["flags"] = {
        "mixed_precision_policy": precision_policy(keras, model),
        "jit_compile": jit,
        "compiled": jit,
        "channels_last": channels_last,
        "image_data_format": data_format,
        "autocast": None,
        "nvidia_tf32_override": os.environ.get("NVIDIA_TF32_OVERRIDE"),
        **_probe(lambda: tf32_flags(backend, fw), {}),
    }
    env["distributed"] = distributed_info()
    for k, v in (observed or {}).items():
        if v is not None:
            env[k] = v
    return env


# -- per-iteration device memory ------------------------------------------------------------

def memory_probe(backend: str, fw: Any) -> Callable[[], tuple[float, float | None]] | None:
    """A function returning (allocated peak MB, reserved peak MB) since its last call, or
    since the process started where the backend cannot reset its peak (JAX); None on CPU."""
    mb = 1.0 / 2**20
    if backend == "tensorflow":
        gpus = fw.config.list_physical_devices("GPU")
        if not gpus:
            return None
        exp = fw.config.experimental

        def tf_mem() -> tuple[float, float | None]:
            peak = exp.get_memory_info("GPU:0")["peak"] * mb
            exp.reset_memory_stats("GPU:0")
            return peak, None

        return tf_mem
    if backend == "jax":
        gpus = [d for d in fw.local_devices() if d.platform == "gpu"]
        if not gpus:
            return None
        dev = gpus[0]

        def jax_mem() -> tuple[float, float | None]:
            st = dev.memory_stats() or {}
            pool = st.get("peak_pool_bytes")
            return st.get("peak_bytes_in_use", 0) * mb, pool * mb if pool else None

        return jax_mem
    if backend == "torch" and fw.cuda.is_available():
        dev = fw.cuda.current_device()

        def torch_mem() -> tuple[float, float | None]:
            st = fw.cuda.memory.memory_stats_as_nested_dict(dev)
            out = (st["allocated_bytes"]["all"]["peak"] * mb,
                   st["reserved_bytes"]["all"]["peak"] * mb)
            fw.cuda.reset_peak_memory_stats(dev)
            return out

        return torch_mem
    return None
