"""In-loop switches: turn one recommended fix on and off inside the user's running training
loop, and put back exactly what was there ("verified savings").

The training hook measures a fix by alternating blocks of iterations with the fix on
(:meth:`InLoopSwitch.apply`) and off (:meth:`InLoopSwitch.restore`), then leaves it off. A
switch is built as ``Cls(model, optimizer)`` (either may be ``None``), checked once with
:meth:`~InLoopSwitch.unavailable` before any trial, and then toggled between iterations, never
inside one (no autograd graph may be alive: parameters change layout, the forward changes).

Contract of every switch here:

- ``apply()`` turns the fix on; calling it again while on does nothing.
- ``restore()`` puts back the state seen by the last ``apply()`` that found the fix off, so
  apply/restore may alternate any number of times. It does nothing while off, undoes only what
  was done (after a partial ``apply()`` too), and is the thing to call from ``finally`` after an
  exception in a trial. It tries every step and re-raises the first error at the end.
- ``warmup_hint_iterations``: iterations after an ``apply()`` (or ``restore()``) to leave out
  of the timing (autotuning, layout caches, compilation).

:func:`snapshot` records everything any switch may touch, so ``snapshot(m, o)`` before a
trial equals ``snapshot(m, o)`` after its ``restore()``.

Fix ids are the recommendation rule ids (analysis/rules). :func:`switch_for` builds the switch
for an id; the ids that cannot be switched in a running process have their reason in
:data:`NOT_VERIFIABLE`.

Only torch-side code imports this module (it imports torch at the top).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "NOT_VERIFIABLE", "AutocastBf16Switch", "ChannelsLastSwitch", "CompileSwitch",
    "CudaGraphsSwitch", "InLoopSwitch", "Tf32Switch", "snapshot", "switch_for",
    "tf32_flags",
]


@runtime_checkable
class InLoopSwitch(Protocol):
    """One fix, switchable between iterations of the user's loop (module docstring)."""

    fix_id: str

    def unavailable(self) -> str | None:
        """Why the fix cannot be switched in this process (None: it can)."""
        ...

    def apply(self) -> None:
        """Turn the fix on (idempotent)."""
        ...

    def restore(self) -> None:
        """Put back exactly what was there before the first apply (idempotent, safe after a
        partial apply or an exception)."""
        ...


class _Undo:
    """Runs every undo step; re-raises the first failure after the last step."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def __call__(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as e:
            if self.error is None:
                self.error = e

    def done(self) -> None:
        if self.error is not None:
            raise self.error


class _Switch:
    fix_id = ""
    warmup_hint_iterations = 1

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self._on = False
        # set while on when the fix broke the loop's own code (or changed nothing): the
        # verifier then fails the trial with it and restores the loop
        self.failure: str | None = None

    @property
    def active(self) -> bool:
        return self._on

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fix_id={self.fix_id!r}, active={self._on})"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _model_device(model: torch.nn.Module | None) -> torch.device | None:
    """The model's device: the first CUDA one among its parameters, else the first one."""
    if model is None:
        return None
    first = None
    for p in model.parameters():
        if p.device.type == "cuda":
            return p.device
        first = first or p.device
    return first


def _is_wrapped_distributed(model: torch.nn.Module) -> str | None:
    names = {c.__name__ for c in type(model).__mro__}
    for name in ("DistributedDataParallel", "FullyShardedDataParallel", "FSDPModule"):
        if name in names:
            return name
    return None


def _is_optimized_module(model: torch.nn.Module) -> bool:
    names = {c.__name__ for c in type(model).__mro__}
    return "OptimizedModule" in names and hasattr(model, "_orig_mod")


# -- TF32 ------------------------------------------------------------------------------------

# (backend, op) pairs of the fp32_precision tree (torch >= 2.9: "none" inherits the parent):
#   generic.all -> cuda.all -> cuda.matmul / cuda.conv / cuda.rnn, and the same for mkldnn
_FP32_KEYS: tuple[tuple[str, str], ...] = (
    ("generic", "all"), ("cuda", "all"), ("mkldnn", "all"),
    ("cuda", "matmul"), ("cuda", "conv"), ("cuda", "rnn"),
    ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"),
)
_GENERIC = ("generic", "all")
_ERR = "error: "  # prefix of a flag whose getter raised (mixed legacy/new API state)


def _fp32_api() -> tuple[Callable[[str, str], str], Callable[[str, str, str], None]] | None:
    """torch._C's raw fp32_precision getter/setter (the Python modules route
    ``torch.backends.mkldnn.fp32_precision``'s setter to the generic node), or None."""
    get = getattr(torch._C, "_get_fp32_precision_getter", None)
    set_ = getattr(torch._C, "_set_fp32_precision_setter", None)
    if get is None or set_ is None:
        return None
    return get, set_


def _read(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # torch checks legacy/new consistency in the legacy getters
        return _ERR + type(e).__name__


def tf32_flags() -> dict[str, Any]:
    """The TF32 settings as their getters report them (what "restored" is compared on)."""
    out: dict[str, Any] = {
        "cuda.matmul.allow_tf32": _read(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        "cudnn.allow_tf32": _read(lambda: bool(torch.backends.cudnn.allow_tf32)),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision),
    }
    api = _fp32_api()
    if api is not None:
        get = api[0]
        out["fp32_precision"] = {f"{b}.{op}": _read(functools.partial(get, b, op))
                                 for b, op in _FP32_KEYS}
    return out


def _raw_fp32(get: Callable[[str, str], str],
              set_: Callable[[str, str, str], None]) -> dict[tuple[str, str], str] | None:
    """The stored fp32_precision values, "none" (inherits) told apart from an explicit value
    equal to the parent's: the getters return the inherited value, so where child and parent
    read the same the parent is set to another value for a moment and the child re-read.
    None when this torch does not behave as expected (then only the read values are put back).
    """
    try:
        raw = {_GENERIC: get(*_GENERIC)}
        for key in _FP32_KEYS[1:]:
            parent = _GENERIC if key[1] == "all" else (key[0], "all")
            value = get(*key)
            if value == "none" or get(*parent) != value:
                raw[key] = value  # an explicit value the parent does not have, or "none"
                continue
            alt = "tf32" if value == "ieee" else "ieee"
            try:
                set_(*parent, alt)
                raw[key] = value if get(*key) == value else "none"
            finally:
                set_(*parent, raw[parent])
        return raw
    except Exception:
        return None


class Tf32Switch(_Switch):
    """TF32 Tensor Cores for FP32 matmuls (cuBLAS) and cuDNN convolutions.

    In torch >= 2.9 the legacy flags and the ``fp32_precision`` tree are one state: the legacy
    setters write tree nodes, and the legacy getters raise when the two disagree ("mix of the
    legacy and new APIs"). So the switch uses the legacy setters in a way that keeps every
    legacy getter valid: cuBLAS through ``torch.set_float32_matmul_precision`` ("high", or
    "medium" where oneDNN's matmul node is bf16; it sets ``cuda.matmul`` to "tf32", and its
    write of ``mkldnn.matmul`` is undone at once, CPU matmuls stay as they were), cuDNN
    through the ``cudnn.allow_tf32`` flag (it sets ``cuda.conv``/``cuda.rnn``). Where the
    process already mixes the APIs so that the legacy getter raises, only the ``cuda.matmul``
    / ``cuda.conv`` nodes are set. Only what is not TF32 already is touched. Older torch: the
    two legacy flags.

    Restore: the legacy values (the precision string, the cuDNN flag) through their setters,
    then every stored ``fp32_precision`` node, "none" (inherit) included, so later changes of a
    parent node propagate as before.

    ``require_cuda=False`` skips the device check (CPU tests: the flags exist on CPU builds).
    """

    fix_id = "tf32"
    warmup_hint_iterations = 2  # cudnn.benchmark re-tunes for the new math mode

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *,
                 require_cuda: bool = True) -> None:
        super().__init__(model, optimizer)
        self.require_cuda = require_cuda
        self._flags: dict[str, Any] = {}
        self._raw: dict[tuple[str, str], str] | None = None

    @staticmethod
    def _is_on() -> bool:
        api = _fp32_api()
        if api is not None:
            get = api[0]
            return bool(_read(lambda: get("cuda", "matmul") == "tf32" and
                              get("cuda", "conv") == "tf32") is True)
        return bool(_read(lambda: torch.backends.cuda.matmul.allow_tf32 and
                          torch.backends.cudnn.allow_tf32) is True)

    def unavailable(self) -> str | None:
        if self.require_cuda:
            if not torch.cuda.is_available():
                return "CUDA is not available: TF32 is a Tensor Core mode of NVIDIA GPUs"
            dev = _model_device(self.model)
            index = dev.index if dev is not None and dev.type == "cuda" else None
            cc = torch.cuda.get_device_capability(index)
            if cc[0] < 8:
                return (f"compute capability {cc[0]}.{cc[1]} has no TF32 Tensor Cores "
                        "(Ampere, sm_80, and later)")
        if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
            return "NVIDIA_TF32_OVERRIDE=0 in the environment forces TF32 off in cuBLAS/cuDNN"
        if self._is_on():
            return "TF32 is already on for FP32 matmuls and cuDNN convolutions"
        return None

    def apply(self) -> None:
        if self._on:
            return
        self._flags = tf32_flags()
        api = _fp32_api()
        self._raw = _raw_fp32(*api) if api is not None else None
        self._on = True
        legacy_precision = not str(self._flags["float32_matmul_precision"]).startswith(_ERR)
        legacy_cudnn = not str(self._flags["cudnn.allow_tf32"]).startswith(_ERR)
        if api is None:
            if not torch.backends.cuda.matmul.allow_tf32:
                torch.backends.cuda.matmul.allow_tf32 = True
            if not torch.backends.cudnn.allow_tf32:
                torch._C._set_cudnn_allow_tf32(True)
            return
        get, set_ = api
        if get("cuda", "matmul") != "tf32":
            if legacy_precision:
                # the legacy string that agrees with oneDNN's matmul node, whose write by
                # set_float32_matmul_precision is then undone: the legacy getters stay valid
                mkldnn = get("mkldnn", "matmul")
                mkldnn_raw = self._raw[("mkldnn", "matmul")] if self._raw else mkldnn
                torch.set_float32_matmul_precision(
                    {"bf16": "medium", "tf32": "high"}.get(mkldnn, "high"))
                set_("mkldnn", "matmul", mkldnn_raw)
            else:
                set_("cuda", "matmul", "tf32")
        if get("cuda", "conv") != "tf32":
            if legacy_cudnn:
                torch._C._set_cudnn_allow_tf32(True)
            else:
                set_("cuda", "conv", "tf32")

    def restore(self) -> None:
        if not self._on:
            return
        saved, undo = self._flags, _Undo()
        precision = saved["float32_matmul_precision"]
        if not str(precision).startswith(_ERR):
            undo(lambda: torch.set_float32_matmul_precision(precision))
        cudnn = saved["cudnn.allow_tf32"]
        if isinstance(cudnn, bool):
            undo(lambda: torch._C._set_cudnn_allow_tf32(cudnn))
        api = _fp32_api()
        if api is not None:
            get, set_ = api
            if self._raw is not None:
                for (b, op), value in self._raw.items():
                    undo(functools.partial(set_, b, op, value))
            else:
                for b, op in _FP32_KEYS:
                    value = saved["fp32_precision"][f"{b}.{op}"]
                    if not value.startswith(_ERR) and \
                            _read(functools.partial(get, b, op)) != value:
                        undo(functools.partial(set_, b, op, value))
        self._on = False
        undo.done()


# -- autocast bf16 -----------------------------------------------------------------------------

_AUTOCAST_MARK = "_tb_gpuprof_autocast"


def _autocast_enabled(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


def _autocast_dtype(device_type: str) -> str | None:
    try:
        return str(torch.get_autocast_dtype(device_type)).replace("torch.", "")
    except Exception:
        return None


def _to_float32(out: Any) -> Any:
    """bf16 tensors of a forward's output back to float32 (recursing into tuples, lists and
    dict-like outputs, e.g. transformers' ModelOutput, which is changed in place)."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == torch.bfloat16 else out
    if isinstance(out, tuple):
        vals = [_to_float32(v) for v in out]
        return type(out)(*vals) if hasattr(out, "_fields") else tuple(vals)
    if isinstance(out, list):
        return [_to_float32(v) for v in out]
    if isinstance(out, dict):
        for k in list(out.keys()):
            v = out[k]
            cast = _to_float32(v)
            if cast is not v:
                out[k] = cast
        return out
    return out


class AutocastBf16Switch(_Switch):
    """``torch.autocast(device, dtype=torch.bfloat16)`` around the model's forward.

    On: an instance attribute ``model.forward`` wraps the forward (``nn.Module.__call__``
    calls ``self.forward``, so hooks and ``nn.Module.compile`` still apply). bf16 only: it
    keeps FP32's range, so no GradScaler is needed and the optimizer step is unchanged (fp16
    would need the user's loop to scale the loss). ``cast_outputs`` (default) casts the
    forward's bf16 outputs to float32, as autocast would for a loss computed inside it: the
    loss outside the forward then stays float32. If autocast is already enabled where the
    forward runs, the wrapper leaves it alone and sets :attr:`conflict` and :attr:`failure`
    (the trial measured nothing). A forward that raises under autocast (a loop that is not
    bf16-clean: an fp32 buffer that a bf16 result is added into in place) sets
    :attr:`failure` and runs again without autocast, so that this iteration trains as the
    loop was; the verifier then fails the trial and restores the forward.

    Restore: removes the instance attribute, or puts back the one that was there.
    """

    fix_id = "amp"
    warmup_hint_iterations = 1

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *,
                 cast_outputs: bool = True) -> None:
        super().__init__(model, optimizer)
        self.cast_outputs = cast_outputs
        self.conflict: str | None = None
        self._had_forward = False
        self._prev_forward: Any = None

    def device_type(self) -> str | None:
        dev = _model_device(self.model)
        return dev.type if dev is not None else None

    def unavailable(self) -> str | None:
        model = self.model
        if model is None:
            return "no model: autocast wraps the model's forward"
        floats = [p for p in model.parameters() if p.is_floating_point()]
        if not floats:
            return "the model has no floating-point parameters"
        half = sorted({str(p.dtype).replace("torch.", "") for p in floats
                       if p.dtype in (torch.bfloat16, torch.float16)})
        if half:
            return f"the model already has {'/'.join(half)} parameters"
        if any(p.dtype != torch.float32 for p in floats):
            return "the model's parameters are not float32 (autocast's bf16 targets fp32 math)"
        dev = self.device_type()
        if dev not in ("cuda", "cpu"):
            return f"autocast bf16 is switched on CUDA or CPU models only, not {dev}"
        if dev == "cuda":
            try:
                ok = torch.cuda.is_bf16_supported(including_emulation=False)
            except TypeError:
                ok = torch.cuda.is_bf16_supported()
            if not ok:
                return "this GPU has no native bf16 support (Ampere, sm_80, and later)"
        if _autocast_enabled(dev):
            return f"autocast is already enabled ({_autocast_dtype(dev)}) in this context"
        fwd = model.__dict__.get("forward")
        if fwd is not None and getattr(fwd, _AUTOCAST_MARK, False):
            return "the model's forward is already wrapped in autocast by another switch"
        if hasattr(model, "_original_forward"):
            return "the model's forward is already wrapped (Accelerate mixed precision)"
        return None

    def apply(self) -> None:
        if self._on:
            return
        model = self.model
        if model is None:
            raise RuntimeError(self.unavailable() or "no model")
        dev = self.device_type() or "cpu"
        self._had_forward = "forward" in model.__dict__
        self._prev_forward = model.__dict__.get("forward")
        inner = model.forward
        switch = self

        @functools.wraps(inner)
        def forward(*args: Any, **kwargs: Any) -> Any:
            if _autocast_enabled(dev):
                switch.conflict = switch.failure = (
                    f"autocast was already enabled ({_autocast_dtype(dev)}) around the "
                    "forward: the switch changed nothing")
                return inner(*args, **kwargs)
            if switch.failure is not None:  # broken once: the rest of this block runs as is
                return inner(*args, **kwargs)
            try:
                with torch.autocast(dev, dtype=torch.bfloat16):
                    out = inner(*args, **kwargs)
            except Exception as e:  # not bf16-clean: this iteration runs as the loop was
                switch.failure = f"the forward raised under bf16 autocast: {_first_line(e)}"
                return inner(*args, **kwargs)
            return _to_float32(out) if switch.cast_outputs else out

        setattr(forward, _AUTOCAST_MARK, True)
        self._on = True
        model.__dict__["forward"] = forward

    def restore(self) -> None:
        if not self._on:
            return
        model = self.model
        assert model is not None
        if self._had_forward:
            model.__dict__["forward"] = self._prev_forward
        else:
            model.__dict__.pop("forward", None)
        self._prev_forward = None
        self._on = False


# -- channels_last ---------------------------------------------------------------------------

def _restrided(t: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """``t``'s values in a tensor with exactly ``stride`` (``t`` itself if it has it)."""
    if t.stride() == stride:
        return t
    out = torch.empty_strided(t.size(), stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _set_strides(t: torch.Tensor, stride: tuple[int, ...]) -> None:
    t.data = _restrided(t.data, stride)


def _conv2d_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.modules()
            if isinstance(m, torch.nn.modules.conv._ConvNd)
            and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 4]


def _cl_inputs(module: torch.nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def conv(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point() and \
                not x.is_contiguous(memory_format=torch.channels_last):
            return x.contiguous(memory_format=torch.channels_last)
        return x
    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}


class ChannelsLastSwitch(_Switch):
    """NHWC (channels_last) parameters and inputs.

    On: every 4-D floating parameter and buffer of the model goes channels_last in place
    (``t.data = ...``: the optimizer keeps holding the same Parameter objects), as
    ``model.to(memory_format=torch.channels_last)`` would; with each parameter go its
    ``.grad`` and every optimizer state tensor of the parameter's shape (AdamW's exp_avg,
    exp_avg_sq, ...): fused/foreach optimizers require params, grads and states of one
    layout (observed on an H200: fused AdamW raised "params, grads, exp_avgs, and exp_avg_sqs
    must have same dtype, device, and layout" when only the parameters changed). A forward
    pre-hook turns the model's 4-D floating tensor arguments (top level, positional and
    keyword) channels_last.

    Restore: the hook removed; each parameter and buffer back to its exact original strides,
    each grad / state tensor that existed at apply to its own, those created during the trial
    to their parameter's. The conversions copy: each converted tensor briefly exists twice.
    """

    fix_id = "channels_last"
    warmup_hint_iterations = 2  # cudnn.benchmark tunes the NHWC convolutions

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        super().__init__(model, optimizer)
        self._params: list[tuple[torch.Tensor, tuple[int, ...]]] = []
        self._buffers: list[tuple[torch.Tensor, tuple[int, ...]]] = []
        self._followers: dict[tuple[int, Any], tuple[int, ...]] = {}
        self._hook: Any = None

    def unavailable(self) -> str | None:
        model = self.model
        if model is None:
            return "no model: channels_last converts the model's convolution weights"
        wrapped = _is_wrapped_distributed(model)
        if wrapped:
            return (f"the model is wrapped in {wrapped}: its gradient buckets/shards are laid "
                    "out when it is built, so parameter layouts cannot change in the loop")
        weights = _conv2d_weights(model)
        if not weights:
            return "the model has no 2-D convolutions (4-D conv weights)"
        telling = [w for w in weights if w.is_contiguous() !=
                   w.is_contiguous(memory_format=torch.channels_last)]
        if telling and all(w.is_contiguous(memory_format=torch.channels_last)
                           for w in telling):
            return "the model's convolution weights are already channels_last"
        return None

    def _state_tensors(self, p: torch.Tensor) -> Iterator[tuple[Any, torch.Tensor]]:
        """(role, tensor) of what must follow ``p``'s layout: its grad and optimizer state."""
        if p.grad is not None and p.grad.shape == p.shape:
            yield "grad", p.grad
        opt = self.optimizer
        state = opt.state.get(p) if opt is not None else None
        if isinstance(state, dict):
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and v.shape == p.shape:
                    yield ("state", k), v

    def apply(self) -> None:
        if self._on:
            return
        model = self.model
        if model is None:
            raise RuntimeError(self.unavailable() or "no model")
        self._params, self._buffers, self._followers = [], [], {}
        self._on = True
        cl = torch.channels_last
        for p in model.parameters():
            if p.dim() != 4 or not p.is_floating_point():
                continue
            self._params.append((p, p.stride()))
            p.data = p.data.contiguous(memory_format=cl)
            for role, t in self._state_tensors(p):
                self._followers[(id(p), role)] = t.stride()
                t.data = t.data.contiguous(memory_format=cl)
        for b in model.buffers():
            if b.dim() == 4 and b.is_floating_point():
                self._buffers.append((b, b.stride()))
                b.data = b.data.contiguous(memory_format=cl)
        self._hook = model.register_forward_pre_hook(_cl_inputs, with_kwargs=True)

    def restore(self) -> None:
        if not self._on:
            return
        undo = _Undo()
        if self._hook is not None:
            undo(self._hook.remove)
            self._hook = None
        for p, stride in self._params:
            def back(p: torch.Tensor = p, stride: tuple[int, ...] = stride) -> None:
                p.data = _restrided(p.data, stride)
                for role, t in list(self._state_tensors(p)):
                    t.data = _restrided(t.data, self._followers.get((id(p), role), stride))
            undo(back)
        for b, stride in self._buffers:
            undo(functools.partial(_set_strides, b, stride))
        self._params, self._buffers, self._followers = [], [], {}
        self._on = False
        undo.done()


# -- torch.compile ---------------------------------------------------------------------------

_ABSENT = object()


class CompileSwitch(_Switch):
    """``nn.Module.compile()`` in place (torch >= 2.2), toggled without recompiling.

    ``model.compile(**kwargs)`` sets the instance attribute ``_compiled_call_impl`` (a
    ``torch.compile``'d ``_call_impl``) that ``nn.Module.__call__`` runs instead of the eager
    one. The first ``apply()`` compiles (lazily: dynamo traces on the next call, inductor
    compiles then; the backward compiles on the first backward); the switch keeps that
    callable, so ``restore()`` puts ``_compiled_call_impl`` back exactly as it was (absent,
    None, or the user's) and the eager module runs again, and a later ``apply()`` reinstates
    the cached compiled one without compiling again (unless the inputs change shape).

    Compile time: the first iterations after the first ``apply()`` include compiling;
    :attr:`warmup_hint_iterations` is how many to leave out of the timing (the first call
    compiles forward and backward, a second call may recompile with dynamic shapes). The
    caller times those iterations and stores the excess over a steady compiled iteration in
    :attr:`compile_seconds` (this class measures nothing itself).

    A model whose class is a ``torch.nn`` container (``nn.Sequential`` of torch.nn layers) is
    unavailable: dynamo skips torch.nn's own frames when they are the compiled entry point,
    so ``nn.Module.compile`` compiles nothing there (checked on torch 2.13, where
    ``torch.compile(model)`` would), and the trial would time eager code.

    No ``torch._dynamo.reset()`` anywhere: it would throw away the compiled code of every
    other ``torch.compile``'d function of the user's process (recompiling them, changing
    their timings), and is not needed since OFF just stops calling the compiled callable.
    The cached graphs stay in memory for the rest of the run.

    ``backend``/``mode``/``options``/``dynamic``/``fullgraph`` go to ``model.compile`` (tests
    use ``backend="eager"`` / ``"aot_eager"``, which need no C compiler).
    """

    fix_id = "compile"
    warmup_hint_iterations = 3
    mode: str | None = None

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *,
                 backend: str = "inductor", mode: str | None = None,
                 options: dict[str, Any] | None = None, dynamic: bool | None = None,
                 fullgraph: bool = False) -> None:
        super().__init__(model, optimizer)
        self.backend = backend
        if mode is not None:
            self.mode = mode
        self.options = options
        self.dynamic = dynamic
        self.fullgraph = fullgraph
        self.compile_seconds: float | None = None
        self._compiled: Any = None
        self._prev: Any = _ABSENT

    @property
    def compiled(self) -> bool:
        """Whether the compiled callable exists (the first apply happened)."""
        return self._compiled is not None

    def _compile_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph,
                              "dynamic": self.dynamic}
        if self.mode is not None:
            kw["mode"] = self.mode
        if self.options is not None:
            kw["options"] = self.options
        return kw

    def _precompiled_reason(self, model: torch.nn.Module) -> str | None:
        if model.__dict__.get("_compiled_call_impl") is not None:
            return "the model is already compiled (nn.Module.compile)"
        return None

    def unavailable(self) -> str | None:
        model = self.model
        if model is None:
            return "no model to compile"
        if not hasattr(torch.nn.Module, "compile") or \
                not hasattr(torch.nn.Module, "_compiled_call_impl"):
            return f"nn.Module.compile needs torch >= 2.2 (this is {torch.__version__})"
        if _is_optimized_module(model):
            return "the model is already compiled (a torch.compile wrapper, OptimizedModule)"
        if type(model).__module__.startswith("torch.nn."):
            return (f"the model is a torch.nn {type(model).__name__}: nn.Module.compile "
                    "compiles nothing when torch.nn's own forward is the entry point (dynamo "
                    "skips torch.nn frames), so the trial would time eager code")
        if not self._on:  # while on, the compiled impl is the switch's own
            reason = self._precompiled_reason(model)
            if reason:
                return reason
        try:
            import torch._dynamo as dynamo
            if not dynamo.is_dynamo_supported():
                return "torch.compile (dynamo) is not supported on this Python/platform"
        except Exception as e:
            return f"torch._dynamo cannot be imported: {_first_line(e)}"
        if self.backend == "inductor":
            dev = _model_device(model)
            if dev is not None and dev.type == "cuda":
                try:
                    from torch.utils._triton import has_triton
                    if not has_triton():
                        return "inductor needs Triton for CUDA, which is not installed"
                except Exception:
                    pass
            elif not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
                return "inductor needs a C++ compiler for CPU code and none is on PATH"
        return None

    def apply(self) -> None:
        if self._on:
            return
        model = self.model
        if model is None:
            raise RuntimeError(self.unavailable() or "no model")
        self._prev = model.__dict__.get("_compiled_call_impl", _ABSENT)
        self._on = True
        if self._compiled is None:
            model.compile(**self._compile_kwargs())
            self._compiled = model.__dict__["_compiled_call_impl"]
        else:
            model.__dict__["_compiled_call_impl"] = self._compiled

    def restore(self) -> None:
        if not self._on:
            return
        model = self.model
        assert model is not None
        if self._prev is _ABSENT:
            model.__dict__.pop("_compiled_call_impl", None)
        else:
            model.__dict__["_compiled_call_impl"] = self._prev
        self._prev = _ABSENT
        self._on = False


class CudaGraphsSwitch(CompileSwitch):
    """CUDA graphs through ``model.compile(mode="reduce-overhead")`` (rule dispatch_overhead).

    Not switched unless the caller opts in (``opt_in=True``), because in general it is not
    safe inside someone else's running loop:

    - CUDA graph trees replay into static output buffers: the next replay overwrites the
      previous iteration's outputs, so training code that keeps an output tensor across
      iterations (a loss appended to a list without ``.item()``, a running metric, an
      activation kept for logging) raises "accessing tensor output of CUDAGraphs that has been
      overwritten by a subsequent run" in the user's code, or needs
      ``torch.compiler.cudagraph_mark_step_begin()`` calls the loop does not have;
    - the graphs' private memory pool stays reserved after switching off; freeing it needs a
      process-wide reset of the cudagraph trees / dynamo caches, which would also drop the
      user's own compiled code: memory after the trial is not what it was;
    - only the module's forward/backward are captured: the optimizer step and the rest of the
      host work per step (what the dispatch_overhead rule measures) stay eager, and a graph
      break, a CPU tensor or a dynamic shape silently skips cudagraphs, so a measured saving
      could be anywhere from the real one to zero.

    With ``opt_in=True`` it is CompileSwitch with ``mode="reduce-overhead"``: it may replace a
    ``_compiled_call_impl`` the user set (restore puts the user's back), since the rule fires on
    already-compiled models; a ``torch.compile`` wrapper (OptimizedModule) is not swapped.
    ``require_cuda=False`` (tests) skips the CUDA checks.
    """

    fix_id = "dispatch_overhead"
    mode: str | None = "reduce-overhead"
    warmup_hint_iterations = 4  # compile, then cudagraph warm-up runs before recording

    REASON = ("CUDA graphs (torch.compile mode='reduce-overhead') are not switched inside a "
              "running loop: replays overwrite the graphs' output tensors, so any output the "
              "training code keeps across iterations raises or needs "
              "torch.compiler.cudagraph_mark_step_begin(); the graphs' private memory pool "
              "stays reserved after switching off (freeing it resets every compiled function "
              "of the process); and only the module's forward/backward are captured, not the "
              "optimizer step or the host work the rule measures, so the measured saving "
              "would not be the recommendation's")

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *, opt_in: bool = False,
                 require_cuda: bool = True, **compile_kwargs: Any) -> None:
        super().__init__(model, optimizer, **compile_kwargs)
        self.opt_in = opt_in
        self.require_cuda = require_cuda
        if self.backend != "inductor" and "mode" not in compile_kwargs:
            self.mode = None  # mode is an inductor option: other backends (tests) take none

    def _precompiled_reason(self, model: torch.nn.Module) -> str | None:
        return None  # the rule fires on compiled models: their compiled impl is swapped

    def unavailable(self) -> str | None:
        if self.require_cuda:
            if not torch.cuda.is_available():
                return "CUDA is not available: CUDA graphs need an NVIDIA GPU"
            dev = _model_device(self.model)
            if self.model is not None and (dev is None or dev.type != "cuda"):
                return "the model is not on a CUDA device: CUDA graphs capture CUDA kernels"
        if self.model is not None:
            wrapped = _is_wrapped_distributed(self.model)
            if wrapped:
                return (f"the model is wrapped in {wrapped}: its gradient communication "
                        "hooks run outside what CUDA graphs capture")
        if not self.opt_in:
            return self.REASON
        return super().unavailable()


# -- registry --------------------------------------------------------------------------------

_SWITCHES: dict[str, Callable[[torch.nn.Module | None, torch.optim.Optimizer | None],
                               InLoopSwitch]] = {
    "tf32": Tf32Switch,
    "amp": AutocastBf16Switch,
    "channels_last": ChannelsLastSwitch,
    "compile": CompileSwitch,
    "dispatch_overhead": CudaGraphsSwitch,
}

NOT_VERIFIABLE: dict[str, str] = {
    "input_pipeline": (
        "DataLoader workers are created with the loader's iterator (num_workers, "
        "prefetch_factor, persistent_workers are fixed once iteration starts): a faster input "
        "pipeline is a new DataLoader in the user's code, not a setting of the running loop"),
    "pinned_memory": (
        "pin_memory is a DataLoader argument (its pinning thread starts with the iterator) and "
        "non_blocking=True belongs to the user's .to() calls: neither can be switched from "
        "outside the loop"),
    "batch_size": (
        "the batch size is fixed by the DataLoader/sampler and tied to the learning rate and "
        "the schedule: changing it in the loop changes the training, not only its speed"),
    "host_sync": (
        "the syncs are the user's code (.item(), .cpu(), printing or branching on GPU values): "
        "removing them is an edit of the loop, not a setting"),
    "communication": (
        "gradient communication is set up by DDP/FSDP when the model is wrapped (bucket size, "
        "overlap, compression hooks): changing it needs a new wrapper, on every rank at once"),
    "distributed_backend": (
        "the process group's backend is chosen at init_process_group on every rank and cannot "
        "change in a running job"),
    "straggler": (
        "a slow rank is a property of the job's placement, data or hardware, not a setting of "
        "the process"),
    "throttling": (
        "GPU clocks are set by the driver and the administrator (power/thermal limits), "
        "outside the training process"),
    "gpu_placement": (
        "which GPUs a job runs on is fixed at launch (CUDA_VISIBLE_DEVICES, the launcher)"),
}


def switch_for(fix_id: str, model: torch.nn.Module | None,
               optimizer: torch.optim.Optimizer | None) -> InLoopSwitch | None:
    """The switch for a recommendation id, or None (reason in :data:`NOT_VERIFIABLE` for
    the known ones). The switch may still be :meth:`~InLoopSwitch.unavailable` here."""
    cls = _SWITCHES.get(fix_id)
    if cls is None:
        return None
    return cls(model, optimizer)


# -- process state ---------------------------------------------------------------------------

def _tensor_layout(t: torch.Tensor) -> dict[str, Any]:
    return {
        "shape": tuple(t.shape), "stride": tuple(t.stride()), "dtype": str(t.dtype),
        "device": str(t.device), "contiguous": t.is_contiguous(),
        "channels_last": t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last),
    }


def snapshot(model: torch.nn.Module | None,
             optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Everything a switch may touch, comparable with ``==``: backend flags (TF32 legacy and
    new, cudnn.benchmark/deterministic/enabled), autocast state, the model's instance
    ``forward`` and ``_compiled_call_impl`` (by identity), forward pre-hooks, every parameter's
    identity and layout (and whether its grad has the same strides), buffers' layouts, and the
    optimizer state tensors' layouts. Values of tensors and whether grads exist are training
    state, not settings, and are left out."""
    out: dict[str, Any] = {
        "tf32": tf32_flags(),
        "cudnn": {"benchmark": bool(torch.backends.cudnn.benchmark),
                  "deterministic": bool(torch.backends.cudnn.deterministic),
                  "enabled": bool(torch.backends.cudnn.enabled)},
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "autocast": {d: (_autocast_enabled(d), _autocast_dtype(d)) for d in ("cpu", "cuda")},
    }
    if model is not None:
        d = model.__dict__
        params = []
        for name, p in model.named_parameters():
            entry = _tensor_layout(p)
            entry.update(name=name, id=id(p),
                         grad_follows=p.grad is None or p.grad.stride() == p.stride())
            params.append(entry)
        out["model"] = {
            "training": model.training,
            "forward": ("forward" in d, d.get("forward")),
            "compiled_call_impl": ("_compiled_call_impl" in d, d.get("_compiled_call_impl")),
            "forward_pre_hooks": sum(len(m._forward_pre_hooks) for m in model.modules()),
            "forward_pre_hooks_with_kwargs": sum(len(m._forward_pre_hooks_with_kwargs)
                                                 for m in model.modules()),
            "forward_hooks": sum(len(m._forward_hooks) for m in model.modules()),
            "parameters": params,
            "buffers": [dict(_tensor_layout(b), name=n) for n, b in model.named_buffers()],
        }
    if optimizer is not None:
        index = {id(q): i for i, q in enumerate(
            q for g in optimizer.param_groups for q in g["params"])}
        state = []
        for owner, st in optimizer.state.items():
            if not isinstance(st, dict):
                continue
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    state.append((index.get(id(owner), -1), str(k), _tensor_layout(v)))
        out["optimizer"] = {"param_ids": sorted(index.items(), key=lambda kv: kv[1]),
                            "state": sorted(state, key=lambda e: (e[0], e[1]))}
    return out
