"""The PyTorch hook on a real (CPU) training loop: scalars, the window report, robustness."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")

from tb_gpuprof.store.reader import event_files, iter_events  # noqa: E402
from tb_gpuprof.torch import GpuProfiler, GpuProfWarning  # noqa: E402
from tests.runs import cli_report, read_scalars  # noqa: E402

HOOK_TAGS = ("gpuprof/iteration_time_ms", "gpuprof/gpu_time_ms", "gpuprof/data_wait_ms",
             "gpuprof/memory_allocated_peak_mb", "gpuprof/memory_reserved_peak_mb")


def tiny_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64, 10))


def batches(n: int = 12) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g))
            for _ in range(n)]


def train(prof: GpuProfiler, model: torch.nn.Module, data: list, *, autocast: bool = False,
          wrap: bool = True) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x, y in (prof.wrap(data) if wrap else data):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        loss = torch.nn.functional.cross_entropy(out.float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        prof.step()
    return losses


def test_training_loop_writes_scalars_and_a_window_report(tmp_path):
    run = str(tmp_path / "cnn")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpuProfWarning)  # the happy path warns about nothing
        with GpuProfiler(run, iter_start=3, iter_stop=8) as prof:
            losses = train(prof, tiny_cnn(), batches(12))
    assert len(losses) == 12 and prof.iteration == 12

    scalars = read_scalars(run)
    assert sorted(scalars["gpuprof/iteration_time_ms"]) == list(range(12))
    assert all(v > 0 for v in scalars["gpuprof/iteration_time_ms"].values())
    # prof.wrap() times the loader: a list hands batches over at once
    waits = scalars["gpuprof/data_wait_ms"]
    assert sorted(waits) == list(range(12))
    assert all(0 <= waits[i] < scalars["gpuprof/iteration_time_ms"][i] for i in waits)
    # CPU only: no CUDA-derived scalars are invented
    for tag in HOOK_TAGS[1:]:
        if tag != "gpuprof/data_wait_ms":
            assert tag not in scalars

    report = cli_report(run)
    assert report["iterations"]["count"] == 5
    assert report["iterations"]["range"] == [3, 7]
    assert report["system"]["framework"] == "pytorch"
    assert report["system"]["flags"]["autocast"] is None
    assert prof.trace_path is not None and prof.trace_path.startswith(run)


def test_window_records_autocast_and_channels_last_without_model_argument(tmp_path):
    model = tiny_cnn().to(memory_format=torch.channels_last)
    with GpuProfiler(str(tmp_path / "amp"), iter_start=1, iter_stop=3) as prof:
        train(prof, model, batches(4), autocast=True)
    flags = prof.env["flags"]
    assert flags["autocast"] == "bfloat16"
    assert flags["channels_last"] is True
    assert flags["compiled"] is False
    assert prof.report["system"]["flags"]["autocast"] == "bfloat16"


def test_model_argument_gives_layout_and_data_wait_without_wrap(tmp_path):
    model = tiny_cnn()  # NCHW
    run = str(tmp_path / "m")
    with GpuProfiler(run, iter_start=0, iter_stop=2, model=model) as prof:
        train(prof, model, batches(3), wrap=False)
    assert prof.env["flags"]["channels_last"] is False
    assert prof.report["iterations"]["count"] == 2
    assert sorted(read_scalars(run)["gpuprof/data_wait_ms"]) == [0, 1, 2]


def test_internal_failure_is_one_warning_and_training_goes_on(tmp_path, monkeypatch):
    from tb_gpuprof.store import writer as writer_mod

    def broken(*a, **k):
        raise OSError("disk on fire")

    monkeypatch.setattr(writer_mod.EventWriter, "add_scalars", broken)
    run = str(tmp_path / "broken")
    with pytest.warns(GpuProfWarning) as caught:
        with GpuProfiler(run, iter_start=2, iter_stop=4, flush_secs=0.01) as prof:
            losses = train(prof, tiny_cnn(), batches(12))
    assert len(losses) == 12
    mine = [w for w in caught if issubclass(w.category, GpuProfWarning)]
    assert len(mine) == 1 and "scalars" in str(mine[0].message)
    assert "disk on fire" in str(mine[0].message)
    # the window is an independent feature: its report still lands
    assert cli_report(run)["iterations"]["count"] == 2


def test_bug_inside_step_disables_the_hook_not_the_loop(tmp_path, monkeypatch):
    from tb_gpuprof import torch as hook

    class Exploding:
        def __init__(self, *a, **k):
            raise ZeroDivisionError("bug")

    monkeypatch.setattr(hook, "_Iter", Exploding)
    with pytest.warns(GpuProfWarning, match="bug") as caught:
        with GpuProfiler(str(tmp_path / "bug"), iter_start=None) as prof:
            losses = train(prof, tiny_cnn(), batches(6))
    assert len(losses) == 6
    assert len([w for w in caught if issubclass(w.category, GpuProfWarning)]) == 1


def test_outer_profiler_already_running(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    run = str(tmp_path / "outer")
    model = tiny_cnn()
    with profile(activities=[ProfilerActivity.CPU]) as outer:
        with pytest.warns(GpuProfWarning, match="another profiler") as caught:
            with GpuProfiler(run, iter_start=2, iter_stop=5) as prof:
                losses = train(prof, model, batches(8))
    assert len(losses) == 8
    assert len([w for w in caught if issubclass(w.category, GpuProfWarning)]) == 1
    assert prof.report is None
    # the user's profiler was left alone and recorded the whole loop
    assert any(e.key == "aten::conv2d" and e.count == 16 for e in outer.key_averages())
    assert sorted(read_scalars(run)["gpuprof/iteration_time_ms"]) == list(range(8))


def test_loop_ending_inside_the_window_reports_what_ran(tmp_path):
    run = str(tmp_path / "short")
    with pytest.warns(GpuProfWarning, match="inside the window"):
        with GpuProfiler(run, iter_start=2, iter_stop=50) as prof:
            train(prof, tiny_cnn(), batches(6))
    assert cli_report(run)["iterations"]["range"][0] == 2
    assert prof.report["iterations"]["count"] >= 3


@pytest.mark.parametrize("start", [0, 1])
def test_window_at_the_first_iterations(tmp_path, start):
    # iter_start >= 1 opens the profiler one iteration early, in warm-up, unrecorded
    with GpuProfiler(str(tmp_path / "early"), iter_start=start, iter_stop=start + 2) as prof:
        train(prof, tiny_cnn(), batches(4))
    assert prof.report["iterations"]["count"] == 2
    assert prof.report["iterations"]["range"] == [start, start + 1]


def test_loop_ending_before_the_window_warns_and_leaves_no_profiler_running(tmp_path):
    from torch.autograd.profiler import _is_profiler_enabled

    with pytest.warns(GpuProfWarning, match="before the window"):
        with GpuProfiler(str(tmp_path / "never"), iter_start=4, iter_stop=6) as prof:
            train(prof, tiny_cnn(), batches(4))  # iteration 3 is the warm-up one
    assert prof.report is None and not _is_profiler_enabled
    assert not torch.nn.modules.module._global_forward_pre_hooks


class FakeEvent:
    """A CUDA event on a simulated GPU that finishes each event `lag` records later."""

    clock = 0.0
    recorded: list[FakeEvent] = []  # noqa: RUF012
    lag = 3
    syncs = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t: float | None = None

    def record(self, stream=None) -> None:
        FakeEvent.clock += 1.5
        self.t = FakeEvent.clock
        FakeEvent.recorded.append(self)

    def query(self) -> bool:
        return self in FakeEvent.recorded[:-FakeEvent.lag]

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time on an unfinished event would block"
        return end.t - self.t

    def synchronize(self) -> None:
        FakeEvent.syncs += 1
        FakeEvent.recorded.extend([None] * FakeEvent.lag)  # the GPU catches up


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as the hook sees it on a GPU, with every device call recorded."""
    calls: list[str] = []
    FakeEvent.recorded, FakeEvent.clock, FakeEvent.syncs = [], 0.0, 0
    peak = {"n": 0}

    def stats(device=None):
        peak["n"] += 1
        mib = 2**20
        return {"allocated_bytes": {"all": {"peak": peak["n"] * mib}},
                "reserved_bytes": {"all": {"peak": 2 * peak["n"] * mib}}}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda m: calls.append(f"push {m}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    return calls


def test_always_on_cuda_path_never_synchronizes_in_the_loop(tmp_path, fake_cuda):
    run = str(tmp_path / "gpu")
    prof = GpuProfiler(run, nvml=False, memory_interval_s=0)  # the peaks at every iteration
    prof.start()
    data = batches(10)
    for i, _ in enumerate(prof.wrap(data)):
        prof.step()
        assert "synchronize" not in fake_cuda and FakeEvent.syncs == 0
        # events are read lazily: iterations whose end event is still in flight wait
        assert len(prof._pending) <= FakeEvent.lag + 1, i
    prof.close()  # after the loop, the last events may be waited for

    scalars = read_scalars(run)
    for tag in HOOK_TAGS:
        assert sorted(scalars[tag]) == list(range(10)), tag
    # batch-ready event -> end event: 1.5 fake ms apart
    assert all(v == pytest.approx(1.5) for v in scalars["gpuprof/gpu_time_ms"].values())
    assert [scalars["gpuprof/memory_allocated_peak_mb"][i] for i in range(10)] == list(
        range(1, 11))
    assert fake_cuda.count("reset") == 10
    pushes = [c for c in fake_cuda if c.startswith("push iteration")]
    assert pushes[:3] == ["push iteration 0", "push iteration 1", "push iteration 2"]
    assert sum(c.startswith("push") for c in fake_cuda) == fake_cuda.count("pop")


def test_memory_peaks_are_read_at_most_every_interval_and_cover_the_iterations_since(
        tmp_path, fake_cuda, monkeypatch):
    clock = {"t": 1000.0}
    run = str(tmp_path / "gpu")
    prof = GpuProfiler(run, nvml=False)  # the default interval, 0.1 s
    prof.start()
    with monkeypatch.context() as m:  # a simulated clock for the loop only (close() waits)
        m.setattr("tb_gpuprof.torch.time.perf_counter", lambda: clock["t"])
        for _ in range(10):
            clock["t"] += 0.03  # 30 ms iterations: a reading every 4th
            prof.step()
    prof.close()
    peaks = read_scalars(run)["gpuprof/memory_allocated_peak_mb"]
    assert sorted(peaks) == [0, 4, 8]  # the first iteration, then each 0.1 s on
    assert fake_cuda.count("reset") == 3  # each reading resets the peaks it read
    assert sorted(read_scalars(run)["gpuprof/iteration_time_ms"]) == list(range(10))
    with pytest.raises(ValueError, match="memory_interval_s"):
        GpuProfiler("x", memory_interval_s=-1)
    # in a window every iteration reads them (the window's own memory figures)
    hook = GpuProfiler("x", memory_interval_s=3600)
    assert hook._memory_due(1.0) and not hook._memory_due(2.0)
    hook._window = object()
    assert hook._memory_due(2.0) and hook._memory_due(2.001)


def test_options_are_checked():
    with pytest.raises(ValueError, match="iter_stop"):
        GpuProfiler("x", iter_start=5, iter_stop=5)
    with pytest.raises(ValueError, match="iter_start"):
        GpuProfiler("x", iter_start=-1)
    assert GpuProfiler("x", iter_start=17).iter_stop == 18


class _LegacyRaises:
    """A backend whose legacy allow_tf32 read raises, as torch does after the new API was used."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    @property
    def allow_tf32(self):
        raise RuntimeError("mix of the legacy and new APIs")


def test_tf32_flags_prefer_the_new_precision_api_and_survive_raising_legacy_reads():
    from types import SimpleNamespace

    from tb_gpuprof.capture.torch_env import tf32_flags

    def fake_torch(matmul, conv, top="none"):
        def precision():
            raise RuntimeError("mix of the legacy and new APIs")
        return SimpleNamespace(
            backends=SimpleNamespace(
                fp32_precision=top,
                cuda=SimpleNamespace(matmul=_LegacyRaises(fp32_precision=matmul)),
                cudnn=_LegacyRaises(fp32_precision="none",
                                    conv=SimpleNamespace(fp32_precision=conv))),
            get_float32_matmul_precision=precision)

    assert tf32_flags(fake_torch("tf32", "ieee")) == {
        "allow_tf32_matmul": True, "allow_tf32_cudnn": False, "float32_matmul_precision": "high"}
    # "none" defers to the global setting
    flags = tf32_flags(fake_torch("none", "none", top="ieee"))
    assert flags["allow_tf32_matmul"] is False and flags["allow_tf32_cudnn"] is False
    # nothing set anywhere and legacy reads raising: unknown, not guessed
    flags = tf32_flags(fake_torch("none", "none"))
    assert flags == {"allow_tf32_matmul": None, "allow_tf32_cudnn": None,
                     "float32_matmul_precision": None}


def test_tf32_flags_read_the_real_legacy_switches():
    from tb_gpuprof.capture.torch_env import cudnn_version_string, tf32_flags

    flags = tf32_flags(torch)
    assert flags["allow_tf32_cudnn"] is bool(torch.backends.cudnn.allow_tf32)
    assert flags["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert cudnn_version_string(91002) == "9.10.2" and cudnn_version_string(8902) == "8.9.2"


def test_each_rank_writes_its_own_files_and_only_rank_0_the_summary(tmp_path, monkeypatch):
    import os

    run = str(tmp_path / "ddp")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        with GpuProfiler(run, iter_start=1, iter_stop=3) as prof:
            train(prof, tiny_cnn(), batches(4))
        assert prof.env["distributed"] == {"rank": rank, "world_size": 2, "backend": None}
    # rank 0 writes into the run, rank r > 0 into its own sub-run <run>/rank<r>
    sub = os.path.join(run, "rank1")
    files = {os.path.basename(p): p for p in event_files(run) + event_files(sub)}
    assert sorted(n.rsplit(".", 1)[-1] for n in files) == ["rank0", "rank1"]
    assert [os.path.basename(p).rsplit(".", 1)[-1] for p in event_files(sub)] == ["rank1"]
    summaries = {}
    for name, path in files.items():
        for event in iter_events(path):
            for v in event.summary.value:
                if v.tag == "gpuprof/run_summary":
                    summaries[name] = v
    assert list(summaries) == [n for n in files if n.endswith("rank0")]
    assert os.listdir(os.path.join(run, "plugins", "gpuprof", "traces")) == ["step_2"]
    assert os.listdir(os.path.join(sub, "plugins", "gpuprof", "traces")) == ["step_2.rank1"]


# -- the true iteration period (host ahead of the GPU or not) ---------------------------------

class SimClock:
    """Simulated time for the hook (its module's ``time``): the loop advances it."""

    now = 0.0

    @staticmethod
    def perf_counter() -> float:
        return SimClock.now

    @staticmethod
    def time() -> float:
        return 1e9 + SimClock.now


class SimGpu:
    """CUDA events on a simulated GPU that needs ``work_s`` per iteration: an event recorded
    at host time t completes at max(t, the GPU's previous finish) + the work queued before it
    (all of it at the end-of-step event, none at batch-ready events)."""

    work_s = 0.0
    busy_until = 0.0
    pending_work = 0.0
    syncs = 0

    def __init__(self, enable_timing: bool = False) -> None:
        self.t: float | None = None

    def record(self, stream=None) -> None:
        SimGpu.busy_until = max(SimClock.now, SimGpu.busy_until) + SimGpu.pending_work
        SimGpu.pending_work = 0.0
        self.t = SimGpu.busy_until

    def query(self) -> bool:
        return self.t is not None and self.t <= SimClock.now

    def elapsed_time(self, end: SimGpu) -> float:
        assert self.query() and end.query(), "elapsed_time on an unfinished event would block"
        return (end.t - self.t) * 1e3

    def synchronize(self) -> None:
        SimGpu.syncs += 1
        SimClock.now = max(SimClock.now, self.t or 0.0)


@pytest.fixture
def sim_gpu(monkeypatch):
    from tb_gpuprof import torch as hook

    SimClock.now, SimGpu.busy_until, SimGpu.pending_work, SimGpu.syncs = 0.0, 0.0, 0.0, 0
    monkeypatch.setattr(hook, "time", SimClock)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Event", SimGpu)
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", lambda d=None: {
        "allocated_bytes": {"all": {"peak": 0}}, "reserved_bytes": {"all": {"peak": 0}}})
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda m: None)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: None)


@pytest.mark.parametrize(("host_ms", "gpu_ms"), [(5.0, 40.0), (40.0, 5.0)],
                         ids=["host-runs-ahead", "gpu-waits-for-host"])
def test_iteration_time_is_the_true_period(tmp_path, sim_gpu, host_ms, gpu_ms):
    """Host ahead: the host queues an iteration every 5 ms but the GPU finishes one every
    40 ms; iteration_time_ms must say 40 (the GPU's step-to-step), host_step_time_ms 5.
    GPU waiting for the host: both say the host's 40 ms."""
    run = str(tmp_path / "sim")
    prof = GpuProfiler(run, nvml=False).start()
    for _ in range(30):
        SimClock.now += host_ms / 1e3  # the host's work on this iteration
        SimGpu.pending_work += gpu_ms / 1e3  # the GPU work it queued
        prof.step()
    assert SimGpu.syncs == 0  # the loop itself never waited for the GPU
    prof.close()
    scalars = read_scalars(run)
    steps = range(1, 30)  # iteration 0 starts with an idle GPU
    period = [scalars["gpuprof/iteration_time_ms"][i] for i in steps]
    host = [scalars["gpuprof/host_step_time_ms"][i] for i in steps]
    gpu = [scalars["gpuprof/gpu_step_time_ms"][i] for i in steps]
    true_ms = max(host_ms, gpu_ms)
    assert period == pytest.approx([true_ms] * len(period), rel=1e-3)
    assert host == pytest.approx([host_ms] * len(host), rel=1e-3)
    assert gpu == pytest.approx([true_ms] * len(gpu), rel=1e-3)
    assert [ms for _, ms, _ in prof._periods][1:] == pytest.approx(period, rel=1e-3)


def test_true_period_rule():
    from tb_gpuprof.torch import true_period

    assert true_period(5.0, 40.0, host_ahead=True) == (40.0, True)
    assert true_period(40.0, 39.0, host_ahead=False) == (40.0, False)
    assert true_period(5.0, None, host_ahead=True) == (5.0, False)  # events not read (yet)


# -- the window's analysis: off the training process, nothing process-wide changed ---------

def test_unprofiled_timing_reaches_the_report(tmp_path):
    import statistics

    run = str(tmp_path / "unprof")
    with GpuProfiler(run, iter_start=6, iter_stop=8) as prof:
        train(prof, tiny_cnn(), batches(14))
    scalars = read_scalars(run)["gpuprof/iteration_time_ms"]
    unprof = prof.env["unprofiled"]
    # before the window, not 0 (start-up), 4 (the host probe: it leaves 3 iterations) nor 5
    # (the profiler's warm-up)
    assert unprof["source"] == "wall_time" and unprof["count"] == 3
    assert unprof["host_probe"]["steps"] == 1
    used = [scalars[i] for i in (1, 2, 3)]
    assert unprof["median_ms"] == pytest.approx(statistics.median(used), rel=1e-3)
    it = cli_report(run)["iterations"]  # the report is corrected with it
    assert it["unprofiled_median_ms"] == pytest.approx(unprof["median_ms"], abs=1e-3)
    assert it["unprofiled_source"] == "wall_time"
    assert it["profiler_overhead_ratio"] == pytest.approx(
        it["median_ms"] / it["unprofiled_median_ms"], rel=1e-2)


def test_window_too_early_waits_for_iterations_after_it(tmp_path):
    run = str(tmp_path / "early")
    with GpuProfiler(run, iter_start=1, iter_stop=3) as prof:
        train(prof, tiny_cnn(), batches(12))
    unprof = prof.env["unprofiled"]
    # nothing before the window counts (0 is start-up, the window opens at 0): the analysis
    # waited for iterations after it (9..11 minus the teardown one) and used some of them
    assert unprof is not None and unprof["count"] >= 3, unprof


def test_analysis_runs_in_a_child_and_training_keeps_gc_env_and_signals(tmp_path):
    import gc
    import signal

    model, data = tiny_cnn(), batches(4)
    # before the snapshot: the first optimizer imports dynamo, which sets TORCHINDUCTOR_CACHE_DIR
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    env_before = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    policy, niceness = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)
    gc_during: list[bool] = []
    with GpuProfiler(str(tmp_path / "gc"), iter_start=2, iter_stop=4) as prof:
        for i in range(400):
            x, y = data[i % 4]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
            if prof._analysis is not None:
                if not prof._analysis.is_alive():
                    break
                gc_during.append(gc.isenabled())
                # TEARDOWN_CUPTI alone is held set from the stop for 2 s (CuptiTeardownHold);
                # nothing else, not even what torch's imports in the window's start set
                assert {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"} == {
                    k: v for k, v in env_before.items() if k != "TEARDOWN_CUPTI"}
    assert prof.report is not None, "the window was analyzed"
    assert len(gc_during) >= 3, "training iterations ran while the analysis ran"
    assert all(gc_during)
    assert dict(os.environ) == env_before
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    # the child ran at the lowest priority; this process's own priority is as it was
    assert prof.analysis_niceness == min(niceness + 19, 19)
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)) == (policy, niceness)


def test_a_failing_analysis_child_is_one_warning(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    run = str(tmp_path / "nochild")
    with pytest.warns(GpuProfWarning) as caught:
        with GpuProfiler(run, iter_start=2, iter_stop=4) as prof:
            losses = train(prof, tiny_cnn(), batches(8))
    assert len(losses) == 8 and prof.report is None
    mine = [str(w.message) for w in caught if issubclass(w.category, GpuProfWarning)]
    assert len(mine) == 1 and "analysis" in mine[0], mine
    assert sorted(read_scalars(run)["gpuprof/iteration_time_ms"]) == list(range(8))


def test_cupti_teardown_env_is_scoped_to_the_call(monkeypatch):
    import os

    from tb_gpuprof.capture import torch_env as _torch_env

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    with _torch_env.cupti_teardown_env(True):
        assert os.environ["TEARDOWN_CUPTI"] == "1"
    assert "TEARDOWN_CUPTI" not in os.environ
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    assert _torch_env.cupti_teardown_plan(torch) == (False, None)  # Kineto tears down anyway
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # e.g. torch's own CUDA-graph workaround
    on, warning = _torch_env.cupti_teardown_plan(torch)
    assert not on and "TEARDOWN_CUPTI=0" in warning and "slower" in warning
    with _torch_env.cupti_teardown_env(False):
        assert os.environ["TEARDOWN_CUPTI"] == "0"
    monkeypatch.delenv("TEARDOWN_CUPTI")
    assert _torch_env.cupti_teardown_plan(torch)[0] is (not _torch_env.uses_cuda_graphs(torch))


def test_cupti_teardown_hold_outlasts_the_stop(monkeypatch):
    """Kineto's teardown thread reads TEARDOWN_CUPTI again after the finalize, which runs in
    a later CUDA call: the variable stays set through the stop until both the time and the
    iterations have passed, then is restored as it was (also on force and on a failed stop)."""
    import os
    import time

    from tb_gpuprof.capture import torch_env as _torch_env

    for prior in (None, "0"):
        if prior is None:
            monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
        else:
            monkeypatch.setenv("TEARDOWN_CUPTI", prior)
        hold = _torch_env.CuptiTeardownHold(hold_s=0.05, hold_steps=2)
        seen: list[str | None] = []
        hold.stop(lambda seen=seen: seen.append(os.environ.get("TEARDOWN_CUPTI")))
        assert seen == ["1"] and hold.held and os.environ["TEARDOWN_CUPTI"] == "1"
        hold.step()
        hold.step()  # enough iterations, not yet enough time
        assert os.environ["TEARDOWN_CUPTI"] == "1"
        time.sleep(0.06)
        hold.step()
        assert not hold.held and os.environ.get("TEARDOWN_CUPTI") == prior
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    hold = _torch_env.CuptiTeardownHold()
    hold.stop(lambda: None)
    hold.release(force=True)
    assert "TEARDOWN_CUPTI" not in os.environ

    def failing_stop() -> None:
        raise RuntimeError("stop failed")

    with pytest.raises(RuntimeError):
        hold.stop(failing_stop)
    assert not hold.held and "TEARDOWN_CUPTI" not in os.environ


def test_window_keeps_teardown_set_until_it_is_due_then_restores(tmp_path, monkeypatch):
    """The hook's wiring, on CPU: the window's stop goes through the hold (forced on here,
    CUPTI is only attached on a GPU), the variable is restored at a later step, and a run
    that closes while it is held leaves the environment as it found it."""
    import os

    from tb_gpuprof.capture import torch_env as _torch_env

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)

    def plan(self: GpuProfiler) -> None:
        self._cupti_hold.release(force=True)
        self._teardown_cupti = True

    monkeypatch.setattr(GpuProfiler, "_plan_cupti_teardown", plan)
    seen: list[str | None] = []
    model = tiny_cnn()
    with GpuProfiler(str(tmp_path / "run"), iter_start=2, iter_stop=4) as prof:
        prof._cupti_hold = _torch_env.CuptiTeardownHold(hold_s=0.0, hold_steps=3)
        for x, y in batches(10):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            prof.step()
            seen.append(os.environ.get("TEARDOWN_CUPTI"))
    assert seen[:3] == [None, None, None], seen  # set only inside the start call
    assert seen[3:7] == ["1", "1", "1", None], seen  # the stop at step 4, then 3 held
    assert "TEARDOWN_CUPTI" not in os.environ and prof.report is not None

    with GpuProfiler(str(tmp_path / "run2"), iter_start=2, iter_stop=4) as prof:
        prof._cupti_hold = _torch_env.CuptiTeardownHold(hold_s=60.0)
        for x, y in batches(5):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            prof.step()
        assert os.environ.get("TEARDOWN_CUPTI") == "1"
    assert "TEARDOWN_CUPTI" not in os.environ  # close released it


def test_the_window_is_exported_and_its_results_freed_at_its_stop_not_left_to_the_gc(
        tmp_path):
    # torch's export and the results' destructor both hold the GIL: both run in the stop's
    # iteration (from the analysis thread they stalled training at a random later step).
    # The profile sits in reference cycles: dropped, its results would wait for a full
    # collection, which runs their destructor in whichever thread triggers it.
    import gc

    from torch.autograd.profiler import profile as autograd_profile

    def live_results() -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, autograd_profile)
                   and getattr(o, "kineto_results", None) is not None)

    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # so only what the hook frees itself is freed (the test's own process)
    try:
        model, data = tiny_cnn(), batches(8)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with GpuProfiler(str(tmp_path / "free"), iter_start=2, iter_stop=4) as prof:
            for i, (x, y) in enumerate(data):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                prof.step()
                if i == 3:  # the step that closed the window: exported and freed already
                    assert prof.export_seconds is not None and prof.export_seconds > 0
                    assert live_results() == 0
            assert prof.wait(120)
            assert prof.report is not None
    finally:
        if was_enabled:
            gc.enable()


def run_fresh(script: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    """``script`` (dedented) in a fresh Python process: one that imported nothing before."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=300, env=env)


def test_the_window_leaves_no_variable_that_torchs_imports_set(tmp_path):
    """torch.profiler's start imports inductor and dynamo (``hasattr(torch, "_inductor")``),
    which sets TORCHINDUCTOR_CACHE_DIR; a fresh process that never imported them before the
    window has, after it, exactly the environment it had."""
    script = f"""
        import os, sys, torch
        from tb_gpuprof.torch import GpuProfiler
        before = dict(os.environ)
        model = torch.nn.Linear(8, 8)
        with GpuProfiler({str(tmp_path / "run")!r}, iter_start=2, iter_stop=4) as prof:
            for _ in range(8):
                model(torch.randn(4, 8)).sum().backward()
                prof.step()
            assert prof.wait(120)
        assert "torch._dynamo" in sys.modules, "the window's start imported dynamo"
        added = sorted(set(os.environ) - set(before))
        assert dict(os.environ) == before, added
        print("same environment")
    """
    out = run_fresh(script, env={k: v for k, v in os.environ.items()
                                 if not k.startswith("TORCHINDUCTOR_")})
    assert out.returncode == 0 and "same environment" in out.stdout, out.stderr[-2000:]


def test_after_a_window_the_training_process_imports_no_analysis_module(tmp_path):
    """The report is built in the child; in the training process the flush thread needs only
    the per-iteration throughput scalars, from a leaf module. Importing the analysis (its
    classifier compiles its patterns) there held the GIL for 32-35 ms once."""
    script = f"""
        import sys, time, torch
        from tb_gpuprof.torch import GpuProfiler
        model = torch.nn.Linear(8, 8)
        with GpuProfiler({str(tmp_path / "run")!r}, iter_start=2, iter_stop=4,
                         flush_secs=0.05) as prof:
            for _ in range(6):
                model(torch.randn(4, 8)).sum().backward()
                prof.step()
            assert prof.wait(120) and prof.report is not None
            for _ in range(4):  # iterations after the report: their scalars are flushed
                model(torch.randn(4, 8)).sum().backward()
                prof.step()
                time.sleep(0.1)
        print(sorted(m for m in sys.modules if m.startswith("tb_gpuprof.analysis")))
    """
    out = run_fresh(script)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(
        ["tb_gpuprof.analysis", "tb_gpuprof.analysis.live_throughput"])


def _stored_context(run: str) -> dict:
    import glob
    import json

    (path,) = glob.glob(os.path.join(run, "**", "context.json"), recursive=True)
    with open(path) as f:
        return json.load(f)


def _sleepy_loop(prof: GpuProfiler, slow: set[int], n: int = 14) -> None:
    import time

    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    for i in range(n):
        time.sleep(0.03 if i in slow else 0.002)
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()


def test_the_three_steps_before_the_window_are_the_host_probe(tmp_path):
    # window [9, 11): the profiler's warm-up opens at 8, so 5, 6 and 7 are probed; only they
    # sleep 30 ms, so the probe must hold them and the un-profiled median must not
    run = str(tmp_path / "probe")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpuProfWarning)
        with GpuProfiler(run, iter_start=9, iter_stop=11, nvml=False) as prof:
            _sleepy_loop(prof, slow={5, 6, 7})
    unprofiled = _stored_context(run)["env"]["unprofiled"]
    probe = unprofiled["host_probe"]
    assert probe["steps"] == 3 and len(probe["host_ms_each"]) == 3
    assert all(h >= 30.0 for h in probe["host_ms_each"])
    assert probe["gpu_ms"] is None  # no CUDA: no GPU time is invented
    assert unprofiled["count"] == 4 and unprofiled["median_ms"] < 30.0  # iterations 1-4


def test_a_failing_host_probe_is_one_warning_and_the_report_still_lands(tmp_path, monkeypatch):
    def broken(self, step):
        raise RuntimeError("probe on fire")

    monkeypatch.setattr(GpuProfiler, "_begin_probe", broken)
    run = str(tmp_path / "probe_fails")
    with pytest.warns(GpuProfWarning) as caught:
        with GpuProfiler(run, iter_start=9, iter_stop=11, nvml=False) as prof:
            _sleepy_loop(prof, slow=set())
    mine = [str(w.message) for w in caught if issubclass(w.category, GpuProfWarning)]
    assert len(mine) == 1 and "host_probe" in mine[0] and "probe on fire" in mine[0]
    assert prof.iteration == 14
    assert "host_probe" not in (_stored_context(run)["env"]["unprofiled"] or {})
    assert cli_report(run)["iterations"]["count"] == 2
