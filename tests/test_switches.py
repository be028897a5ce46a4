"""The in-loop switches (tb_gpuprof/capture/switches.py) on real torch, CPU.

Each switch: snapshot -> apply -> a real training step -> restore -> the same snapshot, the
model's outputs as before, training goes on; restore after an exception mid-trial and after a
partial apply; apply/restore idempotent and alternating. TF32 is exercised with the device
check off (the flags exist on CPU builds); compile with the "eager"/"aot_eager" backends
(no C compiler) and once with inductor (slow).
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tb_gpuprof.capture import switches
from tb_gpuprof.capture.switches import (
    NOT_VERIFIABLE,
    AutocastBf16Switch,
    ChannelsLastSwitch,
    CompileSwitch,
    CudaGraphsSwitch,
    InLoopSwitch,
    Tf32Switch,
    snapshot,
    switch_for,
    tf32_flags,
)

GET = torch._C._get_fp32_precision_getter
SET = torch._C._set_fp32_precision_setter
FP32_KEYS = [("generic", "all"), ("cuda", "all"), ("mkldnn", "all"), ("cuda", "matmul"),
             ("cuda", "conv"), ("cuda", "rnn"), ("mkldnn", "matmul"), ("mkldnn", "conv"),
             ("mkldnn", "rnn")]


@pytest.fixture(autouse=True)
def _default_flags() -> Iterator[None]:
    """Every test starts and ends with torch's default precision flags, set here without the
    code under test (a broken restore must not leak into other tests)."""
    def reset() -> None:
        torch.set_float32_matmul_precision("highest")
        torch._C._set_cudnn_allow_tf32(True)
        for key in FP32_KEYS:
            SET(*key, "tf32" if key in (("cuda", "conv"), ("cuda", "rnn")) else "none")
        torch.backends.cudnn.benchmark = False
    reset()
    yield
    reset()
    # torch.compile's graph counters are process-wide: the hook reads them to tell a compiled
    # run (capture/torch_env.dynamo_compiled_anything), so the compile tests leave none behind
    from torch._dynamo.utils import counters
    counters.clear()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)
        self.eager_calls = 0  # forwards that ran eagerly (dynamo folds the test to False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            self.eager_calls += 1
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.head(x.mean(dim=(2, 3)))


def make(kind: str = "mlp", opt: str = "foreach", seed: int = 0) -> tuple[nn.Module, Any]:
    torch.manual_seed(seed)
    model: nn.Module = MLP() if kind == "mlp" else CNN()
    kw = {"foreach": True} if opt == "foreach" else {"fused": True}
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, **kw)


def data(kind: str = "mlp") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)


def step(model: nn.Module, opt: Any, kind: str = "mlp", set_to_none: bool = True) -> float:
    x, y = data(kind)
    opt.zero_grad(set_to_none=set_to_none)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def out(model: nn.Module, kind: str = "mlp") -> torch.Tensor:
    with torch.no_grad():
        return model(data(kind)[0]).float()


def raw_fp32() -> dict[tuple[str, str], str]:
    return {k: GET(*k) for k in FP32_KEYS}


# -- the shared contract, every switch ---------------------------------------------------------

def _tf32() -> tuple[InLoopSwitch, nn.Module, Any, str]:
    m, o = make("mlp")
    return Tf32Switch(m, o, require_cuda=False), m, o, "mlp"


def _amp() -> tuple[InLoopSwitch, nn.Module, Any, str]:
    m, o = make("mlp")
    return AutocastBf16Switch(m, o), m, o, "mlp"


def _cl() -> tuple[InLoopSwitch, nn.Module, Any, str]:
    m, o = make("cnn")
    return ChannelsLastSwitch(m, o), m, o, "cnn"


def _compile() -> tuple[InLoopSwitch, nn.Module, Any, str]:
    m, o = make("mlp")
    return CompileSwitch(m, o, backend="aot_eager"), m, o, "mlp"


SWITCHES: dict[str, Callable[[], tuple[InLoopSwitch, nn.Module, Any, str]]] = {
    "tf32": _tf32, "amp": _amp, "channels_last": _cl, "compile": _compile}
# how far one step with the fix on may move the outputs from a twin trained without it
STEP_TOL = {"tf32": 0.0, "amp": 5e-2, "channels_last": 1e-4, "compile": 1e-5}


@pytest.mark.parametrize("name", SWITCHES)
def test_trial_restores_exactly_and_training_continues(name: str) -> None:
    sw, model, opt, kind = SWITCHES[name]()
    assert isinstance(sw, InLoopSwitch) and sw.fix_id == name
    assert sw.unavailable() is None
    step(model, opt, kind)  # the optimizer has state, as in a running loop
    twin = copy.deepcopy((model, opt))
    before, y0 = snapshot(model, opt), out(model, kind)

    sw.apply()
    assert snapshot(model, opt) != before or name == "compile"  # compile: see below
    step(model, opt, kind)
    sw.restore()

    assert snapshot(model, opt) == before
    step(*twin, kind)
    y1, y_twin = out(model, kind), out(twin[0], kind)
    assert not torch.equal(y1, y0)  # it trained
    torch.testing.assert_close(y1, y_twin, atol=STEP_TOL[name] + 1e-6, rtol=STEP_TOL[name])
    step(model, opt, kind)  # and keeps training
    assert snapshot(model, opt) == before


@pytest.mark.parametrize("name", SWITCHES)
def test_outputs_after_restore_equal_before(name: str) -> None:
    sw, model, opt, kind = SWITCHES[name]()
    step(model, opt, kind)
    y0 = out(model, kind)
    for _ in range(3):  # alternating, as a trial does
        sw.apply()
        torch.testing.assert_close(out(model, kind), y0, atol=5e-2, rtol=5e-2)
        sw.restore()
        assert torch.equal(out(model, kind), y0) or name == "channels_last"
        torch.testing.assert_close(out(model, kind), y0, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SWITCHES)
def test_restore_after_an_exception_mid_step(name: str) -> None:
    sw, model, opt, kind = SWITCHES[name]()
    step(model, opt, kind)
    before = snapshot(model, opt)
    x, y = data(kind)
    with pytest.raises(RuntimeError, match="user code failed"):
        try:
            sw.apply()
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            raise RuntimeError("user code failed")
        finally:
            sw.restore()
    assert snapshot(model, opt) == before
    step(model, opt, kind)
    assert snapshot(model, opt) == before


@pytest.mark.parametrize("name", SWITCHES)
def test_apply_and_restore_are_idempotent(name: str) -> None:
    sw, model, opt, kind = SWITCHES[name]()
    step(model, opt, kind)
    before = snapshot(model, opt)
    sw.restore()  # before any apply: nothing
    assert snapshot(model, opt) == before
    sw.apply()
    on = snapshot(model, opt)
    sw.apply()
    assert snapshot(model, opt) == on
    sw.restore()
    sw.restore()
    assert snapshot(model, opt) == before


# -- partial apply ------------------------------------------------------------------------

def test_tf32_restore_after_partial_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    torch._C._set_cudnn_allow_tf32(False)
    before = tf32_flags()
    sw = Tf32Switch(require_cuda=False)

    def fail(b: bool) -> None:
        raise RuntimeError("cudnn setter failed")
    monkeypatch.setattr(torch._C, "_set_cudnn_allow_tf32", fail)
    with pytest.raises(RuntimeError, match="cudnn setter failed"):
        sw.apply()
    assert GET("cuda", "matmul") == "tf32"  # the matmul half was done
    monkeypatch.undo()
    sw.restore()
    assert tf32_flags() == before


def test_channels_last_restore_after_partial_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = make("cnn")
    step(model, opt, "cnn")
    before = snapshot(model, opt)
    sw = ChannelsLastSwitch(model, opt)

    def fail(*a: Any, **k: Any) -> None:
        raise RuntimeError("hook failed")
    monkeypatch.setattr(model, "register_forward_pre_hook", fail)
    with pytest.raises(RuntimeError, match="hook failed"):
        sw.apply()
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    sw.restore()
    monkeypatch.undo()
    assert snapshot(model, opt) == before
    step(model, opt, "cnn")


def test_compile_restore_after_failed_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = make("mlp")
    before = snapshot(model, opt)
    sw = CompileSwitch(model, opt, backend="eager")

    def fail(*a: Any, **k: Any) -> None:
        raise RuntimeError("compile failed")
    monkeypatch.setattr(model, "compile", fail)
    with pytest.raises(RuntimeError, match="compile failed"):
        sw.apply()
    sw.restore()
    monkeypatch.undo()
    assert snapshot(model, opt) == before
    step(model, opt)


# -- TF32 --------------------------------------------------------------------------------

def test_tf32_turns_on_the_flags_and_keeps_legacy_getters_valid() -> None:
    before = tf32_flags()
    assert before["cuda.matmul.allow_tf32"] is False
    sw = Tf32Switch(require_cuda=False)
    sw.apply()
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cudnn.allow_tf32 is True
    assert torch.get_float32_matmul_precision() == "high"
    assert GET("cuda", "matmul") == "tf32" and GET("cuda", "conv") == "tf32"
    assert GET("mkldnn", "matmul") == before["fp32_precision"]["mkldnn.matmul"]  # CPU as was
    assert not any(str(v).startswith("error") for v in tf32_flags().values())
    sw.restore()
    assert tf32_flags() == before
    assert raw_fp32() == {k: before["fp32_precision"][f"{k[0]}.{k[1]}"] for k in FP32_KEYS}


def test_tf32_off_in_cudnn_too() -> None:
    torch.backends.cudnn.allow_tf32 = False
    before = tf32_flags()
    assert before["fp32_precision"]["cuda.conv"] == "none"
    sw = Tf32Switch(require_cuda=False)
    sw.apply()
    assert torch.backends.cudnn.allow_tf32 is True and GET("cuda", "conv") == "tf32"
    sw.restore()
    assert tf32_flags() == before
    assert torch.backends.cudnn.allow_tf32 is False


@pytest.mark.parametrize("explicit", [False, True])
def test_tf32_restores_inherit_versus_explicit(explicit: bool) -> None:
    """cuda.matmul "none" (inherits cuda.all) and an explicit value equal to cuda.all read
    the same; restore must give back the one that was there: it shows when the parent
    changes afterwards."""
    SET("cuda", "all", "ieee")
    SET("cuda", "matmul", "ieee" if explicit else "none")
    SET("cuda", "conv", "none")
    before = tf32_flags()
    sw = Tf32Switch(require_cuda=False)
    sw.apply()
    assert GET("cuda", "matmul") == "tf32" and GET("cuda", "conv") == "tf32"
    sw.restore()
    assert tf32_flags() == before
    SET("cuda", "all", "tf32")
    assert GET("cuda", "matmul") == ("ieee" if explicit else "tf32")
    assert GET("cuda", "conv") == "tf32"  # it inherited before the trial, and still does


def test_tf32_in_a_mixed_api_state_where_a_legacy_getter_raises() -> None:
    SET("mkldnn", "matmul", "bf16")  # new API: oneDNN bf16 with the legacy string "highest"
    before = tf32_flags()
    assert str(before["float32_matmul_precision"]).startswith("error")
    sw = Tf32Switch(require_cuda=False)
    assert sw.unavailable() is None
    sw.apply()
    assert GET("cuda", "matmul") == "tf32"
    sw.restore()
    assert tf32_flags() == before
    assert raw_fp32()[("mkldnn", "matmul")] == "bf16"


def test_tf32_with_medium_precision_but_cuda_matmul_off() -> None:
    torch.set_float32_matmul_precision("medium")
    SET("cuda", "matmul", "ieee")  # cuBLAS TF32 off by the new API, oneDNN bf16 kept
    before = tf32_flags()
    sw = Tf32Switch(require_cuda=False)
    sw.apply()
    after = tf32_flags()
    assert GET("cuda", "matmul") == "tf32" and GET("mkldnn", "matmul") == "bf16"
    assert after["float32_matmul_precision"] == "medium"
    assert after["cuda.matmul.allow_tf32"] is True
    sw.restore()
    assert tf32_flags() == before


def test_tf32_unavailable() -> None:
    if not torch.cuda.is_available():
        assert "CUDA" in (Tf32Switch().unavailable() or "")
    torch.set_float32_matmul_precision("high")
    assert "already" in (Tf32Switch(require_cuda=False).unavailable() or "")


def test_tf32_unavailable_under_nvidia_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    assert "NVIDIA_TF32_OVERRIDE" in (Tf32Switch(require_cuda=False).unavailable() or "")


# -- autocast bf16 -----------------------------------------------------------------------

def test_autocast_runs_the_matmuls_in_bf16_while_on() -> None:
    model, opt = make("mlp")
    seen: list[torch.dtype] = []
    model.fc1.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    sw = AutocastBf16Switch(model, opt)
    assert "forward" not in model.__dict__
    sw.apply()
    assert "forward" in model.__dict__
    assert model(data()[0]).dtype == torch.float32  # outputs cast back for the loss
    assert seen == [torch.bfloat16]
    step(model, opt)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
    sw.restore()
    assert "forward" not in model.__dict__
    seen.clear()
    model(data()[0])
    assert seen == [torch.float32]
    assert sw.conflict is None


def test_autocast_keeps_a_users_instance_forward() -> None:
    model, opt = make("mlp")
    calls: list[int] = []
    inner = model.forward

    def user_forward(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return inner(x)
    model.forward = user_forward  # type: ignore[method-assign]
    before = snapshot(model, opt)
    sw = AutocastBf16Switch(model, opt)
    sw.apply()
    model(data()[0])
    assert calls == [1]
    sw.restore()
    assert model.__dict__["forward"] is user_forward
    assert snapshot(model, opt) == before


def test_autocast_does_not_override_a_users_autocast() -> None:
    model, opt = make("mlp")
    sw = AutocastBf16Switch(model, opt)
    with torch.autocast("cpu", dtype=torch.float16):
        assert "already enabled" in (sw.unavailable() or "")
    sw.apply()
    seen: list[torch.dtype] = []
    model.fc1.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.float16):
        model(data()[0])
    assert seen == [torch.float16] and sw.conflict is not None
    sw.restore()


def test_autocast_unavailable() -> None:
    assert AutocastBf16Switch(None, None).unavailable() is not None
    model, opt = make("mlp")
    model.to(torch.bfloat16)
    assert "bfloat16" in (AutocastBf16Switch(model, opt).unavailable() or "")
    model, opt = make("mlp")
    sw = AutocastBf16Switch(model, opt)
    sw.apply()
    assert "already wrapped" in (AutocastBf16Switch(model, opt).unavailable() or "")
    sw.restore()


# -- channels_last -----------------------------------------------------------------------

def _follows(model: nn.Module, opt: Any, fmt: torch.memory_format) -> None:
    for p in model.parameters():
        if p.dim() != 4:
            continue
        assert p.is_contiguous(memory_format=fmt)
        if p.grad is not None:
            assert p.grad.stride() == p.stride()
        for k in ("exp_avg", "exp_avg_sq"):
            assert opt.state[p][k].stride() == p.stride(), k


@pytest.mark.parametrize("opt_kind", ["foreach", "fused"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_channels_last_optimizer_state_follows_the_layout(opt_kind: str,
                                                         set_to_none: bool) -> None:
    model, opt = make("cnn", opt_kind)
    step(model, opt, "cnn", set_to_none)
    params_before = [id(p) for p in model.parameters()]
    inputs: list[bool] = []
    model.conv1.register_forward_pre_hook(
        lambda m, a: inputs.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    before = snapshot(model, opt)
    sw = ChannelsLastSwitch(model, opt)
    assert sw.unavailable() is None
    sw.apply()
    _follows(model, opt, torch.channels_last)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            step(model, opt, "cnn", set_to_none)
    assert not [w for w in caught if "layout contract" in str(w.message)]
    _follows(model, opt, torch.channels_last)
    assert inputs[-1] is True
    assert [id(p) for p in model.parameters()] == params_before
    assert all(p is q for p, q in zip(model.parameters(), opt.param_groups[0]["params"],
                                      strict=True))
    sw.restore()
    _follows(model, opt, torch.contiguous_format)
    assert snapshot(model, opt) == before
    step(model, opt, "cnn", set_to_none)
    assert inputs[-1] is False


def test_channels_last_state_created_during_the_trial_follows_back() -> None:
    model, opt = make("cnn")  # no step yet: AdamW creates its state inside the trial
    sw = ChannelsLastSwitch(model, opt)
    sw.apply()
    step(model, opt, "cnn")
    _follows(model, opt, torch.channels_last)
    sw.restore()
    _follows(model, opt, torch.contiguous_format)
    step(model, opt, "cnn")


def test_channels_last_restores_odd_original_strides() -> None:
    model, opt = make("cnn")
    w = model.conv2.weight
    w.data = w.data.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # already NHWC
    w.data = w.data.transpose(2, 3).contiguous().transpose(2, 3)  # and something else
    step(model, opt, "cnn")
    before = snapshot(model, opt)
    sw = ChannelsLastSwitch(model, opt)
    sw.apply()
    step(model, opt, "cnn")
    sw.restore()
    assert snapshot(model, opt) == before


def test_channels_last_unavailable() -> None:
    assert ChannelsLastSwitch(None, None).unavailable() is not None
    model, opt = make("mlp")
    assert "no 2-D convolutions" in (ChannelsLastSwitch(model, opt).unavailable() or "")
    model, opt = make("cnn")
    model.to(memory_format=torch.channels_last)
    assert "already channels_last" in (ChannelsLastSwitch(model, opt).unavailable() or "")


# -- compile -----------------------------------------------------------------------------

def _graphs() -> int:
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def test_compile_toggles_without_recompiling() -> None:
    model, opt = make("mlp")
    assert isinstance(model, MLP)
    assert "_compiled_call_impl" not in model.__dict__
    sw = CompileSwitch(model, opt, backend="aot_eager")
    assert sw.unavailable() is None and not sw.compiled
    sw.apply()
    compiled = model.__dict__["_compiled_call_impl"]
    step(model, opt)
    step(model, opt)
    assert model.eager_calls == 0  # the compiled code ran, not the Python forward
    graphs = _graphs()
    sw.restore()
    assert "_compiled_call_impl" not in model.__dict__
    step(model, opt)
    assert model.eager_calls == 1  # eager again
    sw.apply()
    assert model.__dict__["_compiled_call_impl"] is compiled and sw.compiled
    step(model, opt)
    assert model.eager_calls == 1 and _graphs() == graphs  # no recompilation
    sw.restore()
    assert sw.warmup_hint_iterations >= 1 and sw.compile_seconds is None


def test_compile_restores_a_users_none() -> None:
    model, opt = make("mlp")
    model._compiled_call_impl = None
    assert "_compiled_call_impl" in model.__dict__
    sw = CompileSwitch(model, opt, backend="eager")
    sw.apply()
    sw.restore()
    assert "_compiled_call_impl" in model.__dict__ and model._compiled_call_impl is None


def test_compile_unavailable() -> None:
    assert CompileSwitch(None, None).unavailable() is not None
    model, opt = make("mlp")
    model.compile(backend="eager")
    assert "already compiled" in (CompileSwitch(model, opt).unavailable() or "")
    model, opt = make("mlp")
    wrapped = torch.compile(model, backend="eager")
    assert "already compiled" in (CompileSwitch(wrapped, opt).unavailable() or "")
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert "compiles nothing" in (CompileSwitch(seq, None).unavailable() or "")


@pytest.mark.slow
def test_compile_with_inductor_on_cpu() -> None:
    model, opt = make("mlp")
    sw = CompileSwitch(model, opt)  # the default backend, inductor (needs a C++ compiler)
    assert sw.unavailable() is None
    step(model, opt)
    twin = copy.deepcopy((model, opt))
    before, y0 = snapshot(model, opt), out(model)
    sw.apply()
    torch.testing.assert_close(out(model), y0, atol=1e-5, rtol=1e-5)
    step(model, opt)
    assert isinstance(model, MLP) and model.eager_calls == 2  # out() twice, then compiled
    sw.restore()
    assert snapshot(model, opt) == before
    step(*twin)
    torch.testing.assert_close(out(model), out(twin[0]), atol=1e-5, rtol=1e-5)


# -- CUDA graphs -------------------------------------------------------------------------

def test_cuda_graphs_are_not_switched_by_default() -> None:
    model, opt = make("mlp")
    reason = CudaGraphsSwitch(model, opt).unavailable() or ""
    if not torch.cuda.is_available():
        assert "CUDA" in reason
    reason = CudaGraphsSwitch(model, opt, require_cuda=False).unavailable() or ""
    assert "overwrite" in reason and "memory pool" in reason and "optimizer step" in reason


def test_cuda_graphs_opt_in_swaps_and_restores_a_users_compiled_impl() -> None:
    model, opt = make("mlp")
    model.compile(backend="eager")  # the rule fires on compiled models
    step(model, opt)
    users = model.__dict__["_compiled_call_impl"]
    before = snapshot(model, opt)
    sw = CudaGraphsSwitch(model, opt, opt_in=True, require_cuda=False, backend="aot_eager")
    assert sw.unavailable() is None
    sw.apply()
    assert model.__dict__["_compiled_call_impl"] is not users
    step(model, opt)
    sw.restore()
    assert model.__dict__["_compiled_call_impl"] is users
    assert snapshot(model, opt) == before


# -- registry and snapshot ---------------------------------------------------------------

def _rule_ids() -> set[str]:
    rules = Path(switches.__file__).resolve().parents[1] / "analysis" / "rules"
    text = "\n".join(p.read_text() for p in rules.glob("*.py"))
    return set(re.findall(r"\b(?:_rec|recommendation)\(\s*\"([a-z_0-9]+)\"", text))


def test_every_rule_id_has_a_switch_or_a_reason() -> None:
    ids = _rule_ids()
    assert {"tf32", "amp", "channels_last", "compile", "dispatch_overhead",
            "input_pipeline", "pinned_memory", "batch_size", "host_sync"} <= ids
    model, opt = make("cnn")
    for fix_id in ids:
        sw = switch_for(fix_id, model, opt)
        if sw is None:
            assert NOT_VERIFIABLE.get(fix_id), fix_id
        else:
            assert fix_id not in NOT_VERIFIABLE
            assert isinstance(sw, InLoopSwitch) and sw.fix_id == fix_id
    assert switch_for("no_such_rule", model, opt) is None
    assert isinstance(switch_for("tf32", model, opt), Tf32Switch)
    assert isinstance(switch_for("dispatch_overhead", model, opt), CudaGraphsSwitch)
    assert "DataLoader" in NOT_VERIFIABLE["input_pipeline"]


def test_snapshot_sees_every_kind_of_change() -> None:
    model, opt = make("cnn")
    step(model, opt, "cnn")
    base = snapshot(model, opt)
    assert snapshot(model, opt) == base

    def changed(do: Callable[[], Any], undo: Callable[[], Any]) -> None:
        do()
        assert snapshot(model, opt) != base
        undo()
        assert snapshot(model, opt) == base

    changed(lambda: setattr(torch.backends.cudnn, "benchmark", True),
            lambda: setattr(torch.backends.cudnn, "benchmark", False))
    changed(lambda: SET("cuda", "matmul", "ieee"), lambda: SET("cuda", "matmul", "none"))
    handle: list[Any] = []
    changed(lambda: handle.append(model.register_forward_pre_hook(lambda m, a: None)),
            lambda: handle.pop().remove())
    changed(lambda: model.__dict__.__setitem__("forward", model.forward),
            lambda: model.__dict__.pop("forward"))
    changed(lambda: model.__dict__.__setitem__("_compiled_call_impl", None),
            lambda: model.__dict__.pop("_compiled_call_impl"))
    w = model.conv1.weight
    changed(lambda: setattr(w, "data", w.data.contiguous(memory_format=torch.channels_last)),
            lambda: setattr(w, "data", w.data.contiguous()))
    s = opt.state[w]["exp_avg"]
    changed(lambda: setattr(s, "data", s.data.contiguous(memory_format=torch.channels_last)),
            lambda: setattr(s, "data", s.data.contiguous()))
    ac = torch.autocast("cpu", dtype=torch.bfloat16)
    changed(ac.__enter__, lambda: ac.__exit__(None, None, None))
