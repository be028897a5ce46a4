"""What a PyTorch process is set up to do: versions, GPU, and the switches recommendations read.

The result is the ``env`` dict :func:`tb_gpuprof.analysis.report.build_report` merges into
``report["system"]`` (flag names in docs/report-schema.md and docs/recommendations.md).
Every probe is independent and best-effort: a probe that fails leaves its field ``None``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def cudnn_version_string(v: int | None) -> str | None:
    """cuDNN's version int as "M.m.p" (9.x: M*10000+m*100+p; 8.x: M*1000+m*100+p)."""
    if not v:
        return None
    if v >= 10000:
        return f"{v // 10000}.{(v // 100) % 100}.{v % 100}"
    return f"{v // 1000}.{(v // 100) % 10}.{v % 100}"


def autocast_state(torch: Any) -> str | None:
    """The dtype name autocast is enabled with right now (CUDA first, then CPU), else None."""
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return str(torch.get_autocast_dtype(device)).replace("torch.", "")
    return None


def is_compiled_module(torch: Any, model: Any) -> bool:
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(dynamo, "OptimizedModule", None)
    return optimized is not None and isinstance(model, optimized)


def dynamo_compiled_anything() -> bool:
    """True when torch.compile produced at least one graph in this process (no import forced)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        return int(utils.counters["stats"].get("unique_graphs", 0)) > 0
    except Exception:
        return False


def conv_weights_channels_last(torch: Any, modules: Iterable[Any]) -> bool | None:
    """Whether the model's 4-D conv weights are stored channels_last (None: no telling conv).

    1x1 and single-channel kernels satisfy both layouts and are skipped; the majority of
    the others decides.
    """
    votes = [0, 0]  # [contiguous (NCHW), channels_last]
    for m in modules:
        w = getattr(m, "weight", None)
        if not isinstance(m, torch.nn.modules.conv._ConvNd) or w is None or w.dim() != 4:
            continue
        nchw = w.is_contiguous()
        nhwc = w.is_contiguous(memory_format=torch.channels_last)
        if nchw != nhwc:
            votes[nhwc] += 1
    if votes == [0, 0]:
        return None
    return votes[1] > votes[0]


def distributed_info(torch: Any) -> dict[str, Any]:
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return {"rank": int(dist.get_rank()), "world_size": int(dist.get_world_size()),
                    "backend": str(dist.get_backend())}
    except Exception:
        pass
    rank = os.environ.get("RANK", "")
    world = os.environ.get("WORLD_SIZE", "")
    return {"rank": int(rank) if rank.isdigit() else 0,
            "world_size": int(world) if world.isdigit() else 1, "backend": None}


def _new_api_tf32(*settings: Any) -> bool | None:
    """Resolve torch>=2.9 ``fp32_precision`` settings, most specific first ("none" defers)."""
    for value in settings:
        if value == "tf32":
            return True
        if value == "ieee":
            return False
    return None


def tf32_flags(torch: Any) -> dict[str, Any]:
    """TF32 switches through the new ``fp32_precision`` API when set, else the legacy flags.

    Reading a legacy flag raises once the new API was used for the same backend, so the
    new API is consulted first and every read is guarded.
    """
    backends = torch.backends
    top = getattr(backends, "fp32_precision", None)
    matmul = _new_api_tf32(getattr(backends.cuda.matmul, "fp32_precision", None), top)
    if matmul is None:
        matmul = _probe(lambda: bool(backends.cuda.matmul.allow_tf32))
    conv = getattr(getattr(backends.cudnn, "conv", None), "fp32_precision", None)
    cudnn = _new_api_tf32(conv, getattr(backends.cudnn, "fp32_precision", None), top)
    if cudnn is None:
        cudnn = _probe(lambda: bool(backends.cudnn.allow_tf32))
    precision = _probe(torch.get_float32_matmul_precision)
    if precision is None and matmul is not None:
        precision = "high" if matmul else "highest"
    return {"allow_tf32_matmul": matmul, "allow_tf32_cudnn": cudnn,
            "float32_matmul_precision": precision}


def _probe(fn: Any, default: Any = None) -> Any:
    try:
        return fn()
    except Exception:
        return default


def record_env(torch: Any, *, model: Any = None, convs: Iterable[Any] | None = None,
               autocast: str | None = None, compiled: bool | None = None,
               device: int | None = None) -> dict[str, Any]:
    """Snapshot the environment now. ``autocast`` is what the hook saw inside the loop
    (autocast is a context inside the user's code, so it cannot be read from outside);
    ``convs`` are conv modules seen running, used for the layout when ``model`` is unknown."""
    cuda_ok = bool(_probe(torch.cuda.is_available, False))
    env: dict[str, Any] = {
        "framework": "pytorch",
        "framework_version": str(torch.__version__).split("+")[0],
        "cuda_runtime": getattr(torch.version, "cuda", None),
        "cudnn": _probe(lambda: cudnn_version_string(torch.backends.cudnn.version())),
    }
    if cuda_ok:
        dev = torch.cuda.current_device() if device is None else device
        props = _probe(lambda: torch.cuda.get_device_properties(dev))
        if props is not None:
            env["gpu_name"] = props.name
            env["compute_capability"] = f"{props.major}.{props.minor}"
            env["num_sms"] = props.multi_processor_count
            env["gpu_memory_bytes"] = props.total_memory
    if compiled is None:
        compiled = is_compiled_module(torch, model) or dynamo_compiled_anything()
    env["flags"] = {
        **tf32_flags(torch),
        "nvidia_tf32_override": os.environ.get("NVIDIA_TF32_OVERRIDE"),
        "autocast": autocast,
        "cudnn_benchmark": _probe(lambda: bool(torch.backends.cudnn.benchmark)),
        "channels_last": _probe(lambda: conv_weights_channels_last(
            torch, model.modules() if model is not None else (convs or ()))),
        "compiled": bool(compiled),
    }
    env["distributed"] = distributed_info(torch)
    return env


# -- CUPTI teardown after the window --------------------------------------------------------

# Kineto finalizes CUPTI when a trace ends only when this variable is "1" (pytorch#144455);
# otherwise CUPTI stays subscribed and every CUDA launch stays slower for the rest of the run.
TEARDOWN_ENV = "TEARDOWN_CUPTI"
CUDA_GRAPHS_COST = ("CUPTI stays attached after the window, so every CUDA launch stays slower "
                    "for the rest of the run (on an H200, an eager launch-bound loop ran "
                    "20-30% slower; a GPU-bound loop barely notices)")


def export_trace(prof: Any, path: str) -> None:
    """Write a stopped ``torch.profiler.profile``'s trace to ``path``, then free its results.

    Both hold the GIL (torch's C++), so the caller runs this where a stall is expected: at
    the window's stop. Freeing the results here, by dropping the profile's references to
    them, is on purpose: the profile sits in reference cycles of its own (its action map
    holds its bound methods), so dropping the profile frees nothing, and the cyclic GC would
    run the results' destructor later, in whichever thread triggers a full collection,
    usually the training thread, at a random step. Keeping them until training ends was
    measured and not taken: on CPU, the results of an 8 MB GPT-2 window held 300 MB.
    """
    prof.export_chrome_trace(path)
    _release_profiler(prof)


def _release_profiler(prof: Any) -> None:
    """Drop a stopped profile's references to its results and events."""
    inner = getattr(prof, "profiler", None)
    if inner is None:
        return
    for attr in ("kineto_results", "_function_events", "function_events"):
        if getattr(inner, attr, None) is not None:
            try:
                setattr(inner, attr, None)
            except (AttributeError, TypeError):  # a read-only property in some torch
                pass
    try:
        prof.profiler = None
    except (AttributeError, TypeError):
        pass


class CuptiTeardownHold:
    """``TEARDOWN_CUPTI=1`` from a window profiler's stop until Kineto's teardown of CUPTI
    has run, then the environment as it was.

    Why it must outlast the stop call: the stop (``teardownContext``) starts a detached
    Kineto thread that has the next CUDA API call's exit callback run ``cuptiFinalize``, and
    *then* reads the variable again (``cuptiLazyInit_``): set, it leaves CUPTI's callbacks off
    until the next trace; unset, it re-subscribes them at once. Re-subscribed callbacks made
    every launch slower: on the H200 the launch probe of gpu/launch_after_window.py (commit
    65bf7bf) ran
    1.019-1.033x its before-window cost with the variable restored right after the stop,
    0.970x with it set for the whole process and 0.951-0.971x with no window at all.

    So the hook sets it for the stop and restores it from the training thread at the first
    :meth:`release` that comes both ``hold_s`` seconds and ``hold_steps`` iterations later
    (each iteration makes CUDA calls, so the finalize has run by then) or at close.
    """

    def __init__(self, hold_s: float = 2.0, hold_steps: int = 2) -> None:
        self.hold_s, self.hold_steps = hold_s, hold_steps
        self._held = False
        self._prior: str | None = None
        self._since = 0.0
        self._steps = 0

    @property
    def held(self) -> bool:
        return self._held

    def stop(self, stop_fn: Callable[[], Any]) -> None:
        """Run the profiler's ``stop_fn`` with the variable set, and keep it set."""
        if not self._held:
            self._prior = os.environ.get(TEARDOWN_ENV)
            os.environ[TEARDOWN_ENV] = "1"
            self._held = True
        self._since, self._steps = time.monotonic(), 0
        try:
            stop_fn()
        except BaseException:
            self.release(force=True)  # no teardown started: nothing to wait for
            raise

    def step(self) -> None:
        """One training iteration ended: release when due."""
        if self._held:
            self._steps += 1
            self.release()

    def release(self, force: bool = False) -> None:
        if not self._held:
            return
        if not force and (self._steps < self.hold_steps or
                          time.monotonic() - self._since < self.hold_s):
            return
        if self._prior is None:
            os.environ.pop(TEARDOWN_ENV, None)
        else:
            os.environ[TEARDOWN_ENV] = self._prior
        self._held = False


def uses_cuda_graphs(torch: Any) -> bool:
    """Whether this process captures CUDA graphs (torch.compile's cudagraphs, CUDAGraph):
    Kineto's CUPTI teardown crashes the next re-init there (torch's own FIXME)."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None and bool(getattr(getattr(config, "triton", None), "cudagraphs", 0)):
        return True
    if "torch._inductor.cudagraph_trees" in sys.modules:
        trees = sys.modules["torch._inductor.cudagraph_trees"]
        if getattr(getattr(trees, "local", None), "tree_manager_containers", None):
            return True
    # a captured graph owns a private memory pool: its segments carry a non-zero pool id
    try:
        segments = torch.cuda.memory._snapshot().get("segments", [])
    except Exception:
        return False
    return any(tuple(seg.get("segment_pool_id") or (0, 0)) != (0, 0) for seg in segments)


def cupti_teardown_plan(torch: Any) -> tuple[bool, str | None]:
    """(whether the hook sets TEARDOWN_CUPTI=1 around its profiler's start and stop, the
    warning to give once when CUPTI will not be torn down)."""
    value = os.environ.get(TEARDOWN_ENV)
    if value == "1":
        return False, None  # Kineto tears down anyway
    if value is not None:
        return False, (f"{TEARDOWN_ENV}={value} is set in the environment (by you, or by torch "
                       f"for CUDA graphs): {CUDA_GRAPHS_COST}")
    if uses_cuda_graphs(torch):
        return False, ("this process uses CUDA graphs, with which Kineto cannot tear CUPTI "
                       f"down safely: {CUDA_GRAPHS_COST}")
    return True, None


@contextlib.contextmanager
def cupti_teardown_env(on: bool) -> Iterator[None]:
    """``TEARDOWN_CUPTI=1`` (when ``on``) for the duration of one profiler start call, then the
    environment as it was (a stop goes through :class:`CuptiTeardownHold`).

    Kineto reads the variable with getenv() when a trace is prepared (whether to re-create
    the CUPTI subscriber a previous teardown removed), synchronously inside the call this
    wraps, on the training thread that also sets and restores it.

    Variables the start call adds are removed again: torch's ``prepare_trace`` asks
    ``hasattr(torch, "_inductor")``, which imports inductor and dynamo, and their import sets
    ``TORCHINDUCTOR_CACHE_DIR`` (torch sets it again, to the same default, when it compiles).
    """
    before = set(os.environ)
    prior = os.environ.get(TEARDOWN_ENV)
    if on:
        os.environ[TEARDOWN_ENV] = "1"
    try:
        yield
    finally:
        if on and prior is not None:
            os.environ[TEARDOWN_ENV] = prior
        for key in set(os.environ) - before:  # TEARDOWN_CUPTI too, where it was unset
            os.environ.pop(key, None)
