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
    # a tiny CPU loop on a shared machine may be too noisy for a verdict: then it says so
    assert trials["aa"]["status"] in ("no_change", "measured") or \
        trials["aa"]["verdict"].startswith("inconclusive"), trials["aa"]
    assert trials["tf32"]["status"] == "not_verifiable"  # no CUDA here
    assert trials["batch_size"]["status"] == "not_verifiable" and trials["batch_size"]["reason"]
    for fix in ("amp", "channels_last"):  # switched on and off in blocks, on the CPU
        assert trials[fix]["blocks"] >= 4 and trials[fix]["iterations"] > 0, trials[fix]
    assert section["block_iterations"] >= 3 and section["before_ms"] > 0
    assert section["noise_curve_pct"]["1"] > 0  # the curve the blocks were sized from
    for fix in ("amp", "channels_last"):
        assert 3 <= trials[fix]["block_iterations"] <= section["block_iterations"]
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


class FlagSwitch:
    """A switch that only records whether it is on (the loop reads it)."""
    warmup_hint_iterations = 0

    def __init__(self, fix_id: str) -> None:
        self.fix_id, self.on = fix_id, False

    def unavailable(self) -> None:
        return None

    def apply(self) -> None:
        self.on = True

    def restore(self) -> None:
        self.on = False


def test_a_fix_counted_after_another_is_measured_with_that_one_on_in_both_arms():
    pre, fix = FlagSwitch("pre"), FlagSwitch("fix")
    v = LoopVerifier([_Planned("fix", fix, after_id="pre", after_switch=pre)],
                     sync=lambda: None, snapshot=lambda: (pre.on, fix.on), requested=["fix"],
                     noise_iterations=40)
    seen = set()
    while not v.done:
        if v.phase == "trial":
            seen.add((pre.on, fix.on))
        # the prerequisite alone saves 1 ms; the fix saves 0.5 ms more only on top of it
        sleep_ms = 3.0 - (1.0 if pre.on else 0.0) - (0.5 if pre.on and fix.on else 0.0)
        t = time.perf_counter()
        time.sleep(sleep_ms / 1e3)
        v.on_step((time.perf_counter() - t) * 1e3)
    assert seen == {(True, False), (True, True)}  # never without the prerequisite
    result = v.section()["trials"]["fix"]
    assert result["measured_after"] == "pre"
    # 0.5 of the 2 ms it starts from: 25 %, not 0.5 of 3 (17 %) nor 1.5 of 3 (50 %)
    assert result["status"] == "measured" and 15.0 < result["saving_pct"] < 35.0, result
    assert (pre.on, fix.on) == (False, False) and v.section()["restored"] is True


def test_a_noisy_aa_control_leaves_time_for_the_fixes_after_it():
    import random

    rng = random.Random(0)
    plan = [_Planned("aa", NullSwitch())] + [_Planned(f"f{i}", FlagSwitch(f"f{i}"))
                                              for i in range(3)]
    v = LoopVerifier(plan, sync=lambda: None, snapshot=lambda: None, requested=["f0"],
                     noise_iterations=40, max_seconds=4.0)
    while not v.done:  # iterations of 1-4 ms: too noisy for the A/A to narrow to ±1 point
        t = time.perf_counter()
        time.sleep(rng.uniform(0.001, 0.004))
        v.on_step((time.perf_counter() - t) * 1e3)
    trials = v.section()["trials"]
    assert list(trials) == ["aa", "f0", "f1", "f2"]
    for fix in ("f0", "f1", "f2"):  # each got its share of the cap, none was left untried
        assert trials[fix]["iterations"] > 0, trials


def test_plan_counts_a_fix_after_its_prerequisite_and_leaves_compile_to_verify_compile():
    from tb_gpuprof.capture.verification import plan_fixes

    report = {"recommendations": [{"id": "tf32"}, {"id": "amp"}, {"id": "compile"}]}
    made = []

    def make(fix_id):
        made.append(fix_id)
        return FlagSwitch(fix_id), None

    plan = plan_fixes(report, True, False, make, {"amp": "tf32", "compile": None}.get)
    assert [p.fix_id for p in plan] == ["aa", "tf32", "amp", "compile"]
    assert plan[2].after_id == "tf32" and plan[2].after_switch is not plan[1].switch
    assert plan[1].after_id is None and plan[3].switch is None and "verify_compile" in \
        plan[3].reason


class ScatterNet(torch.nn.Module):
    """Messages summed into a float32 buffer in place: under bf16 autocast ``index_add_``
    refuses the bf16 messages (a loop that is not bf16-clean)."""

    def __init__(self) -> None:
        super().__init__()
        self.msg = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        agg = torch.zeros(x.shape[0], 8)
        agg.index_add_(0, dst, self.msg(x)[src])
        return agg


def test_a_fix_that_breaks_the_loops_forward_is_failed_and_training_goes_on(tmp_path):
    torch.manual_seed(0)
    model = ScatterNet()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, src, dst = torch.randn(32, 8), torch.randint(0, 32, (64,)), torch.randint(0, 32, (64,))
    steps = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GpuProfiler(str(tmp_path / "run"), iter_start=2, iter_stop=4, model=model,
                         optimizer=opt, verify=["amp"]) as prof:
            while prof._verify_state != "done" and steps < 50_000:
                loss = model(x, src, dst).square().mean()  # raises under autocast
                opt.zero_grad()
                loss.backward()
                opt.step()
                prof.step()
                steps += 1
                if steps == 5:
                    prof.wait()
            assert model(x, src, dst).dtype == torch.float32  # the loop as it was
    amp = prof.report["verification"]["trials"]["amp"]
    assert amp["status"] == "failed" and "index_add_" in amp["reason"], amp
    assert prof.report["verification"]["restored"] is True
    assert "forward" not in model.__dict__
    assert any("verifying amp failed" in str(w.message) for w in caught)


def test_a_slow_loop_keeps_its_noise_and_after_runs_to_a_share_of_the_cap():
    # an SD-UNet at 446 ms/iteration spent a 90 s cap on 200 noise iterations, then as many
    # after the trials: 179 s, no trial run. Iteration times are given, not slept.
    from tb_gpuprof.analysis import verify as stats

    fix = FlagSwitch("fix")
    v = LoopVerifier([_Planned("aa", NullSwitch()), _Planned("fix", fix)], sync=lambda: None,
                     snapshot=lambda: fix.on, requested=["fix"], max_seconds=90.0)
    spent_ms = 0.0
    while not v.done:
        ms = 300.0 if fix.on else 446.0
        v.on_step(ms)
        spent_ms += ms
    section = v.section()
    assert len(v.before) == stats.MIN_NOISE_ITERATIONS == len(v.after)
    assert spent_ms <= 1.1 * 90_000, spent_ms  # the cap, with at most one block's overrun
    assert section["trials"]["fix"]["status"] == "measured", section["trials"]
    assert 25.0 < section["trials"]["fix"]["saving_pct"] < 40.0


def test_a_compile_is_not_counted_against_the_trial_that_measures_what_it_made():
    # the H100 LoRA: a compile of ~20 s in a 22 s share left 7 iterations and no verdict
    fix = FlagSwitch("compile")
    fix.warmup_hint_iterations = 3
    v = LoopVerifier([_Planned("aa", NullSwitch()), _Planned("compile", fix)],
                     sync=lambda: None, snapshot=lambda: fix.on, requested=["compile"],
                     noise_iterations=40, max_seconds=30.0)
    compiled = False
    while not v.done:
        if fix.on and not compiled:
            compiled = True
            v.on_step(40_000.0)  # the first compiled iteration, longer than the trial's share
            continue
        v.on_step(70.0 if fix.on else 100.0)
    trial = v.section()["trials"]["compile"]
    assert trial["status"] == "measured" and 25.0 < trial["saving_pct"] < 35.0, trial
    assert trial["warmup_seconds"] is not None


def test_a_fix_the_report_left_out_is_measured_after_its_prerequisite():
    # an FP32 loop whose report advises TF32 and leaves bf16 autocast out (re-timed after TF32
    # it adds too little): verify=["tf32", "amp"] measures amp after tf32, the claim the
    # report made, not amp from FP32, about which it said nothing
    from tb_gpuprof.capture.verification import counted_after

    report = {"recommendations": [{"id": "tf32"}]}
    assert counted_after(report, "amp") == "tf32"
    assert counted_after(report, "tf32") is None
    assert counted_after({"recommendations": []}, "amp") is None  # no prerequisite advised
    assert counted_after(report, "no_such_fix") is None
