"""verify= on the PyTorch hook: real CPU training loops, the trials after the window, the
restore of every setting, and the report that keeps what the loop measured."""

from __future__ import annotations

import time
import warnings

import pytest

torch = pytest.importorskip("torch")

from tb_gpuprof.capture import switches  # noqa: E402
from tb_gpuprof.capture.verification import LoopVerifier, NullSwitch, _Planned  # noqa: E402
from tb_gpuprof.torch import GpuProfiler  # noqa: E402

from .runs import cli_report  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _loop(prof: GpuProfiler, model: torch.nn.Module, opt: torch.optim.Optimizer,
          iterations: int) -> list[float]:
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
    losses = []
    for _ in range(iterations):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        prof.step()
        if prof._verify_state == "done":
            break
    return losses


def test_verify_runs_after_the_window_restores_everything_and_stores_it(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    run = str(tmp_path / "run")
    with GpuProfiler(run, iter_start=2, iter_stop=4, model=model, optimizer=opt,
                     verify=["amp", "channels_last", "tf32", "batch_size"]) as prof:
        x = torch.randn(4, 3, 8, 8)
        _loop(prof, model, opt, 5)
        prof.wait()  # the window's report, before the loop goes on
        before = switches.snapshot(model, opt)  # the optimizer's state exists by now
        _loop(prof, model, opt, 20_000)
        assert prof._verify_state == "done"
        # training goes on after verification, with every setting as before it
        assert switches.snapshot(model, opt) == before
        _loop(prof, model, opt, 3)
        assert model(x).dtype == torch.float32
    section = prof.report["verification"]
    assert section["restored"] is True and section["status"] == "done"
    trials = section["trials"]
    assert list(trials) == ["aa", "amp", "channels_last", "tf32", "batch_size"]
    assert trials["aa"]["status"] in ("no_change", "measured")
    assert trials["tf32"]["status"] == "not_verifiable"  # no CUDA here
    assert trials["batch_size"]["status"] == "not_verifiable" and trials["batch_size"]["reason"]
    for fix in ("amp", "channels_last"):  # switched on and off in blocks, on the CPU
        assert trials[fix]["blocks"] >= 4 and trials[fix]["iterations"] > 0, trials[fix]
    assert section["block_iterations"] >= 3 and section["before_ms"] > 0
    assert section["after_ms"] > 0
    # the run's stored report is the verified one, and a re-analysis keeps it
    assert cli_report(run)["verification"]["trials"].keys() == trials.keys()
    again = cli_report_reanalyzed(run)
    assert again["verification"] == cli_report(run)["verification"]


def cli_report_reanalyzed(run: str) -> dict:
    import io
    import json
    from contextlib import redirect_stdout

    from tb_gpuprof import cli

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli.main(["report", run, "--reanalyze", "--format", "json"]) == 0
    return json.loads(buf.getvalue())


class RaisingSwitch:
    """A fix whose switch-on raises on its third use, after changing a real setting."""
    fix_id = "raising"
    warmup_hint_iterations = 0

    def __init__(self) -> None:
        self.uses = 0
        self.saved = torch.backends.cudnn.benchmark

    def unavailable(self) -> None:
        return None

    def apply(self) -> None:
        self.uses += 1
        torch.backends.cudnn.benchmark = not self.saved
        if self.uses == 3:
            raise RuntimeError("boom")

    def restore(self) -> None:
        torch.backends.cudnn.benchmark = self.saved


def _drive(verifier: LoopVerifier) -> None:
    """A real loop whose iteration sleeps 1 ms."""
    while not verifier.done:
        t = time.perf_counter()
        time.sleep(0.001)
        verifier.on_step((time.perf_counter() - t) * 1e3)


def test_a_trial_that_raises_is_failed_restored_and_the_rest_still_run():
    model = Net()
    before = switches.snapshot(model, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        v = LoopVerifier([_Planned("raising", RaisingSwitch()), _Planned("aa", NullSwitch())],
                         sync=lambda: None, snapshot=lambda: switches.snapshot(model, None),
                         requested=["raising"], noise_iterations=40,
                         warn=lambda m: warnings.warn(m, stacklevel=2))
        _drive(v)
    section = v.section()
    assert section["trials"]["raising"]["status"] == "failed"
    assert "boom" in section["trials"]["raising"]["reason"]
    assert section["trials"]["aa"]["status"] in ("no_change", "measured")
    assert section["restored"] is True and switches.snapshot(model, None) == before
    assert any("boom" in str(w.message) for w in caught)


def test_a_fix_that_removes_a_known_sleep_is_verified_and_aa_reads_no_change():
    v = LoopVerifier([_Planned("aa", NullSwitch()), _Planned("sleep", NullSwitch())],
                     sync=lambda: None, snapshot=lambda: None, requested=["sleep"],
                     noise_iterations=60)
    # the "sleep" fix: iterations without it sleep 1 ms more (its switch is the loop's own)
    _drive_sleep(v)
    trials = v.section()["trials"]
    assert trials["aa"]["status"] == "no_change", trials["aa"]
    s = trials["sleep"]
    assert s["status"] == "measured" and 25.0 < s["saving_pct"] < 75.0, s


def _drive_sleep(v: LoopVerifier) -> None:
    while not v.done:
        trial_off = v._current is not None and v._current.fix_id == "sleep" and not v._on
        t = time.perf_counter()
        time.sleep(0.001 + (0.001 if trial_off else 0.0))
        v.on_step((time.perf_counter() - t) * 1e3)


def test_verify_options_are_checked_once():
    with pytest.raises(TypeError, match="verify must be"):
        GpuProfiler("x", verify="tf32")
    with pytest.raises(TypeError, match="verify_compile"):
        GpuProfiler("x", verify=True, verify_compile="yes")
    with pytest.raises(ValueError, match="verify_max_s"):
        GpuProfiler("x", verify=True, verify_max_s=0)
