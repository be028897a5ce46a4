"""The memory peak decomposed (analysis/memory_parts.py): real CPU training loops under the
PyTorch hook and under torch.profiler (the CPU allocator's ``profile_memory`` events), the
hook's record of the model's and optimizer's tensors and its failure, and hand-built event
sequences whose parts are worked out by hand."""

from __future__ import annotations

import gzip
import json
import warnings
from collections.abc import Sequence

import pytest

torch = pytest.importorskip("torch")

from tb_gpuprof.analysis.iterations import IterationWindow  # noqa: E402
from tb_gpuprof.analysis.memory import memory_section  # noqa: E402
from tb_gpuprof.analysis.memory_parts import PARTS, training_phases  # noqa: E402
from tb_gpuprof.analysis.report import build_report  # noqa: E402
from tb_gpuprof.capture import torch_memory  # noqa: E402
from tb_gpuprof.model import OPTIMIZER, Annotation, CpuOp, MemoryEvents, Profile  # noqa: E402
from tb_gpuprof.readers import load_profile  # noqa: E402
from tb_gpuprof.torch import GpuProfiler, GpuProfWarning  # noqa: E402

BATCH = 256


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _train_step(model, opt, x, y) -> None:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


class Trained:
    """A finished hooked loop: its report and what the model and optimizer hold."""

    def __init__(self, run: str, batch: int) -> None:
        model, opt = _model_and_optimizer()
        data = [(torch.randn(batch, 64), torch.randint(0, 10, (batch,))) for _ in range(7)]
        with GpuProfiler(run, iter_start=3, iter_stop=5, model=model, optimizer=opt,
                         with_stack=True) as prof:
            for x, y in data:
                _train_step(model, opt, x, y)
                prof.step()
        assert prof.report is not None and prof.trace_path is not None
        self.report, self.trace_path = prof.report, prof.trace_path
        self.param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.state_bytes = sum(v.numel() * v.element_size() for s in opt.state.values()
                               for v in s.values() if torch.is_tensor(v))
        self.modules = {n for n, m in model.named_modules() if list(m.parameters(False))}
        (self.device,) = self.report["memory"]["devices"]
        self.parts = {p["part"]: p for p in self.device["peak_parts"]["parts"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Trained]:
    return {b: Trained(str(tmp_path_factory.mktemp(f"parts{b}") / "run"), b)
            for b in (BATCH, 2 * BATCH)}


def _allocator_peak(trace_path: str, report: dict) -> int:
    """The CPU allocator's highest running total inside the analyzed iterations, read from
    the stored raw trace with the standard library's json."""
    with gzip.open(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    items = report["iterations"]["items"]
    lo, hi = items[0]["start_us"], items[-1]["start_us"] + items[-1]["wall_ms"] * 1e3
    return max(e["args"]["Total Allocated"] for e in events
               if e.get("name") == "[memory]" and lo <= e["ts"] <= hi)


def test_the_parts_sum_to_the_allocators_total(runs) -> None:
    for r in runs.values():
        pp = r.device["peak_parts"]
        assert [p["part"] for p in pp["parts"]] == list(PARTS)
        truth = _allocator_peak(r.trace_path, r.report)
        assert pp["allocated_bytes"] == truth
        total = sum(p["bytes"] for p in pp["parts"])
        # the CPU allocator counts only what it allocated while profiling: the weights and
        # the optimizer state made before the window are in the parts, not in its total
        assert pp["uncounted_bytes"] == r.param_bytes + r.state_bytes
        assert abs(total - pp["uncounted_bytes"] - truth) <= 0.01 * truth
        assert pp["sum_matches_allocated"]
        assert pp["tensors_recorded"] == ["parameters", "gradients", "optimizer_state"]
        assert pp["backward_passes"] >= 2  # one per analyzed iteration
        assert pp["fragmentation"] is None and pp["outside_pytorch"] is None  # CPU: no reserve


def test_parameters_and_optimizer_state_are_the_model_and_optimizers_exactly(runs) -> None:
    for r in runs.values():
        params, state = r.parts["parameters"], r.parts["optimizer_state"]
        assert params["tensor_bytes"] == params["bytes"] == r.param_bytes
        assert state["tensor_bytes"] == state["bytes"] == r.state_bytes
        assert params["allocations"] == 6 and state["allocations"] == 18  # 6 x (2 moments, step)
        assert {h["module"] for h in params["holders"]} == r.modules
        assert {h["module"] for h in state["holders"]} == r.modules
        assert all(h["op"] is None for h in params["holders"] + state["holders"])


def test_activations_are_there_and_grow_with_the_batch(runs) -> None:
    small, large = (runs[b].parts["activations"] for b in (BATCH, 2 * BATCH))
    assert small["bytes"] > 0
    # the saved ReLU outputs alone are 2 x batch x 256 floats
    assert small["bytes"] >= 2 * BATCH * 256 * 4
    assert large["bytes"] >= 1.9 * small["bytes"]
    ops = {h["op"] for h in large["holders"]}
    assert "aten::clamp_min" in ops or "aten::relu" in ops, ops
    assert any(h["source"] and "test_memory_parts.py(" in h["source"]
               for h in large["holders"]), large["holders"]


def test_the_text_report_lists_each_part_with_its_bytes_and_share(runs) -> None:
    from tb_gpuprof.analysis.format import render

    trained = runs[BATCH]
    text = render(trained.report, "text")
    block = text[text.index("Memory at the peak on"):].split("\n\n")[0].splitlines()
    peak = trained.device["peak"]["allocated_bytes"]
    assert f"{peak / 2**20:,.1f} MiB allocated" in block[0]
    rows = {line[2:19].strip(): line[19:] for line in block[1:]}
    whole = trained.device["peak_parts"]["allocated_bytes"] + \
        trained.device["peak_parts"]["uncounted_bytes"]
    for name, part in trained.parts.items():
        row = rows[name.replace("_", " ")]
        assert f"{part['bytes'] / 2**20:,.1f} MiB" in row
        assert f"{100 * part['bytes'] / whole:5.1f}%" in row
    assert f"{trained.param_bytes / 2**20:,.1f} MiB" in rows["parameters"]
    assert rows["parameters"].split("largest: ")[1] in trained.modules


def test_a_trace_read_on_its_own_has_the_events_parts_only(runs) -> None:
    r = runs[BATCH]
    pp = build_report(load_profile(r.trace_path))["memory"]["devices"][0]["peak_parts"]
    parts = {p["part"]: p for p in pp["parts"]}
    assert pp["tensors_recorded"] == [] and pp["uncounted_bytes"] == 0
    assert parts["parameters"]["bytes"] is None and parts["optimizer_state"]["bytes"] is None
    assert parts["activations"] == r.parts["activations"]
    assert sum(p["bytes"] or 0 for p in pp["parts"]) == pp["allocated_bytes"]


def test_tensors_allocated_in_the_trace_are_found_by_address(tmp_path) -> None:
    """Model and optimizer made while torch.profiler records: their allocations are in the
    trace, and the allocator's total counts them."""
    trace = str(tmp_path / "made_inside.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True, record_shapes=True) as prof:
        model, opt = _model_and_optimizer()
        for _ in range(4):
            _train_step(model, opt, torch.randn(BATCH, 64), torch.randint(0, 10, (BATCH,)))
            prof.step()
    prof.export_chrome_trace(trace)
    record = torch_memory.record_tensors(torch, model, opt, None)
    report = build_report(load_profile(trace), memory_record=record)
    (dev,) = report["memory"]["devices"]
    pp = dev["peak_parts"]
    parts = {p["part"]: p for p in pp["parts"]}
    with open(trace) as f:
        truth = max(e["args"]["Total Allocated"] for e in json.load(f)["traceEvents"]
                    if e.get("name") == "[memory]")
    assert pp["allocated_bytes"] <= truth
    assert pp["uncounted_bytes"] == 0  # every recorded tensor was allocated in the trace
    assert pp["sum_matches_allocated"]
    assert sum(p["bytes"] for p in pp["parts"]) == pp["allocated_bytes"]
    assert parts["parameters"]["tensor_bytes"] == sum(
        p.numel() * p.element_size() for p in model.parameters())
    assert parts["optimizer_state"]["tensor_bytes"] == sum(
        v.numel() * v.element_size() for s in opt.state.values() for v in s.values())


def test_a_failing_record_is_one_warning_and_training_goes_on(tmp_path, monkeypatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(torch_memory, "record_tensors", broken)
    model, opt = _model_and_optimizer()
    steps = 0
    with pytest.warns(GpuProfWarning) as caught:
        with GpuProfiler(str(tmp_path / "run"), iter_start=2, iter_stop=4, model=model,
                         optimizer=opt) as prof:
            for _ in range(6):
                _train_step(model, opt, torch.randn(32, 64), torch.randint(0, 10, (32,)))
                prof.step()
                steps += 1
    mine = [str(w.message) for w in caught if issubclass(w.category, GpuProfWarning)]
    assert len(mine) == 1 and "memory_parts" in mine[0] and "injected" in mine[0], mine
    assert steps == 6 and prof.iteration == 6 and prof._on["memory_parts"] is False
    assert prof.report is not None
    pp = prof.report["memory"]["devices"][0]["peak_parts"]
    assert pp["tensors_recorded"] == [] and pp["parts"][0]["bytes"] is None


def test_without_model_the_optimizers_parameters_are_recorded() -> None:
    model, opt = _model_and_optimizer()
    _train_step(model, opt, torch.randn(8, 64), torch.randint(0, 10, (8,)))
    record = torch_memory.record_tensors(torch, None, opt, None)
    kinds = record["kind"]
    assert record["recorded"] == ["parameters", "gradients", "optimizer_state"]
    assert kinds.count("parameters") == kinds.count("gradients") == 6
    assert kinds.count("optimizer_state") == 18
    assert record["param"][0] == "group0.0" and record["allocator"] == {}
    sizes = [b for k, b in zip(kinds, record["tensor_bytes"], strict=True) if k == "parameters"]
    assert sizes == [p.numel() * p.element_size() for p in model.parameters()]


# -- hand-built events: the answers worked out by hand -------------------------------------

GPU = (1, 0)
PARAM_AT, STATE_AT, GRAD_AT, REUSED_AT = 1000, 2000, 3000, 4000
BASE = 400 + 800 + 300  # before the trace: a parameter, its optimizer state, 300 unknown


def _events(rows: Sequence[tuple[float, int, int]], base: int, device: tuple[int, int] = GPU,
            reserved: int = 4096, tid: int = 1) -> MemoryEvents:
    """(time, bytes (+ alloc, - free), address) rows; the running total starts at ``base``."""
    mem = MemoryEvents()
    total = base
    for t, nbytes, addr in rows:
        total += nbytes
        for col, v in ((mem.ts, t), (mem.nbytes, nbytes), (mem.allocated, total),
                       (mem.reserved, reserved), (mem.addr, addr), (mem.device_type, device[0]),
                       (mem.device_id, device[1]), (mem.tid, tid)):
            col.append(v)
    return mem


# one iteration on [0, 60]: forward ops [10, 20], backward [30, 40], optimizer step [45, 50]
ITERATION = [
    (5.0, 100, 10),        # the input's copy, kept until the next iteration: activation
    (12.0, 1000, 20),      # saved for backward, freed in it: activation
    (14.0, 50, 30), (16.0, -50, 30),  # a forward temporary, gone before the peak
    (15.0, 200, 40),       # the model's output, lives into the backward: activation
    (32.0, 400, GRAD_AT),  # a gradient (recorded at the stop)
    (33.0, 300, REUSED_AT),  # a backward temporary, live at the peak (3500 bytes)
    (35.0, -1000, 20), (38.0, -300, REUSED_AT),
    (46.0, 500, REUSED_AT),  # optimizer state made by the step, after the peak, same address
    (55.0, -100, 10), (58.0, -200, 40),
]


def _one_iteration(device: tuple[int, int] = GPU) -> Profile:
    rows = sorted(ITERATION, key=lambda r: r[0])
    ops = [CpuOp("aten::linear", 10.0, 10.0, tid=1), CpuOp("aten::copy_", 4.0, 2.0, tid=1),
           CpuOp("autograd::engine::evaluate_function: AddmmBackward0", 30.0, 10.0, tid=1)]
    return Profile(source="synthetic", format="kineto", cpu_ops=ops,
                   annotations=[Annotation("Optimizer.step#AdamW.step", 45.0, 5.0,
                                           kind=OPTIMIZER)],
                   memory=_events(rows, BASE, device, reserved=4096 if device == GPU else 0))


def _record(device: str = "cuda:0") -> dict:
    rows = [("parameters", "fc.weight", None, PARAM_AT, 400),
            ("optimizer_state", "fc.weight", "exp_avg", STATE_AT, 800),
            ("gradients", "fc.weight", None, GRAD_AT, 400),
            ("optimizer_state", "fc.weight", "exp_avg_sq", REUSED_AT, 500)]
    return {"kind": [r[0] for r in rows], "param": [r[1] for r in rows],
            "key": [r[2] for r in rows], "device": [device] * 4, "ptr": [r[3] for r in rows],
            "storage_bytes": [r[4] for r in rows], "tensor_bytes": [r[4] for r in rows],
            "recorded": ["parameters", "gradients", "optimizer_state"],
            "allocator": {"cuda:0": {"reserved_bytes": 4096, "allocated_bytes": 2200,
                                     "inactive_split_bytes": 96,
                                     "largest_free_block_bytes": 1024}}, "notes": []}


def _parts(profile: Profile, record: dict | None, telemetry: dict | None = None) -> dict:
    (dev,) = memory_section(profile, [IterationWindow(0, 0, 0.0, 60.0)], telemetry,
                            record)["devices"]
    return dev["peak_parts"]


def test_hand_built_peak_splits_into_its_parts() -> None:
    telemetry = {"gpus": [{"gpu": 0, "name": "GPU", "mean": {"fb_used_mib": 1.0},
                           "max": {"fb_used_mib": 2.0, "process_mem_mib": 1.0}}]}
    pp = _parts(_one_iteration(), _record(), telemetry)
    got = {p["part"]: p["bytes"] for p in pp["parts"]}
    assert pp["allocated_bytes"] == 3500
    assert got == {"parameters": 400, "gradients": 400, "optimizer_state": 800,
                   "activations": 100 + 1000 + 200, "temporaries": 300, "before_window": 300}
    assert pp["sum_matches_allocated"] and pp["uncounted_bytes"] == 0
    parts = {p["part"]: p for p in pp["parts"]}
    # exp_avg_sq came after the peak at the temporary's address: not live at the peak
    assert parts["optimizer_state"]["tensor_bytes"] == 800
    assert parts["gradients"]["holders"][0]["module"] == "fc"
    assert parts["temporaries"]["holders"][0]["op"] == \
        "autograd::engine::evaluate_function: AddmmBackward0"
    assert {h["op"] for h in parts["activations"]["holders"]} == {"aten::copy_",
                                                                  "aten::linear"}
    assert pp["fragmentation"] == {"bytes": 4096 - 3500, "at_stop": {
        "reserved_bytes": 4096, "allocated_bytes": 2200, "inactive_split_bytes": 96,
        "largest_free_block_bytes": 1024}}
    assert pp["outside_pytorch"] == {"bytes": 2**20 - 4096, "nvml_used_bytes": 2**20,
                                     "reserved_bytes": 4096, "scope": "process"}


def test_hand_built_without_a_record_puts_the_weights_before_the_window() -> None:
    pp = _parts(_one_iteration(), None)
    got = {p["part"]: p["bytes"] for p in pp["parts"]}
    assert got == {"parameters": None, "gradients": 400, "optimizer_state": None,
                   "activations": 1300, "temporaries": 300, "before_window": BASE}
    assert pp["fragmentation"]["at_stop"] is None


def test_on_the_cpu_recorded_tensors_from_before_are_uncounted() -> None:
    pp = _parts(_one_iteration(device=(0, -1)), _record("cpu"))
    got = {p["part"]: p["bytes"] for p in pp["parts"]}
    # the CPU allocator's total never held the parameter and its state: BASE stays unknown
    assert got["parameters"] == 400 and got["optimizer_state"] == 800
    assert got["before_window"] == BASE and pp["uncounted_bytes"] == 1200
    assert sum(got.values()) == 3500 + 1200 and pp["sum_matches_allocated"]
    assert pp["fragmentation"] is None


def test_parts_that_cannot_fit_the_allocators_total_say_so() -> None:
    profile = _one_iteration()
    profile.memory = _events(sorted(ITERATION, key=lambda r: r[0]), base=0)
    pp = _parts(profile, _record())  # the total lacks the parameter and its state
    assert not pp["sum_matches_allocated"]
    assert pp["uncounted_bytes"] == 0 and pp["parts"][-1]["bytes"] == 0


def _ops(spans: Sequence[tuple[str, float, float, int]]) -> list[CpuOp]:
    return [CpuOp(name, start, end - start, tid=tid) for name, start, end, tid in spans]


BWD = "autograd::engine::evaluate_function: MmBackward0"


def test_gradient_accumulation_splits_backward_passes() -> None:
    """forward [10, 20], backward [30, 40], forward [45, 55], backward [60, 70]: an
    allocation of the second forward freed in the second backward is an activation; one of
    the first backward freed in the second is a gradient (accumulated into)."""
    ops = _ops([("aten::linear", 10, 20, 1), (BWD, 30, 40, 1), ("aten::linear", 45, 55, 1),
                (BWD, 60, 70, 1), ("aten::add", 1, 2, 1)])
    phases = training_phases(Profile(source="s", format="kineto", cpu_ops=ops))
    assert phases.backward == [(30.0, 40.0), (60.0, 70.0)]
    assert phases.part_of(50.0, 65.0) == "activations"
    assert phases.part_of(35.0, 65.0) == "gradients"
    assert phases.part_of(35.0, 38.0) == "temporaries"
    assert phases.part_of(50.0, 52.0) == "temporaries"
    assert phases.part_of(75.0, None) == "temporaries"  # no backward after it


def test_another_threads_ops_do_not_split_a_backward_pass() -> None:
    """As on a GPU: autograd's thread (2) runs the backward and the most ops in all, the
    training thread (1) the most outside the backward; a pin-memory thread (9) between two
    backward ops does not end the pass, the training thread does."""
    main = [("aten::linear", t, t + 1, 1) for t in range(0, 10)]
    backward = [(BWD, 30, 34, 2), (BWD, 36, 40, 2)] + [
        ("aten::mm", 30 + t / 4, 30.2 + t / 4, 2) for t in range(16)]  # inside the backward
    pinned = _ops(main + backward + [("aten::pin_memory", 35, 35.5, 9)])
    split = _ops(main + backward + [("aten::linear", 35, 35.5, 1)])
    assert training_phases(Profile(source="s", format="kineto", cpu_ops=pinned)).backward \
        == [(30.0, 40.0)]
    assert training_phases(Profile(source="s", format="kineto", cpu_ops=split)).backward \
        == [(30.0, 34.0), (36.0, 40.0)]


def test_a_closures_forward_inside_the_optimizer_step_has_activations() -> None:
    """LBFGS / Lightning: step(closure) runs forward [10, 20] and backward [30, 40], then the
    update [45, 50], all inside the step's range [5, 80]."""
    ops = _ops([("aten::linear", 10, 20, 1), (BWD, 30, 40, 1), ("aten::add_", 45, 50, 1)])
    profile = Profile(source="s", format="kineto", cpu_ops=ops,
                      annotations=[Annotation("Optimizer.step#LBFGS.step", 5.0, 75.0,
                                              kind=OPTIMIZER)])
    phases = training_phases(profile)
    assert phases.part_of(12.0, 35.0) == "activations"
    assert phases.part_of(46.0, None) == "temporaries"
    # outside a closure, what an optimizer step made is not the next forward's
    plain = training_phases(Profile(source="s", format="kineto", cpu_ops=ops, annotations=[
        Annotation("Optimizer.step#SGD.step", 0.0, 5.0, kind=OPTIMIZER)]))
    assert plain.part_of(2.0, 35.0) == "temporaries"
    assert plain.part_of(6.0, 35.0) == "activations"


def test_the_record_survives_the_analysis_context() -> None:
    """The record goes through the window job and the stored context unchanged."""
    from tb_gpuprof.analysis.context import context_from_dict
    from tb_gpuprof.capture.window_child import WindowJob, encode, job_context

    record = _record()
    job = WindowJob(trace="x", memory_record=record)
    job = type(job)(**json.loads(encode(job)))
    stored = json.loads(json.dumps(job_context(job).to_dict()))
    assert context_from_dict(stored, "here").memory_record == record
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _parts(_one_iteration(), stored["memory_record"])["sum_matches_allocated"]


def test_batch_headroom_scales_what_grows_with_the_batch_into_what_is_left() -> None:
    from tb_gpuprof.analysis.memory_parts import batch_headroom

    gib = 2**30
    sizes = {"parameters": 2, "gradients": 0, "optimizer_state": 4, "activations": 10,
             "temporaries": 2, "before_window": 2}
    device = {"peak": {"allocated_bytes": 20 * gib, "reserved_bytes": 22 * gib},
              "peak_parts": {"allocated_bytes": 20 * gib, "backward_passes": 1,
                             "parts": [{"part": k, "bytes": v * gib} for k, v in sizes.items()],
                             "outside_pytorch": {"bytes": 1 * gib}}}
    # 99 GiB not held outside PyTorch, 20/22 of it allocatable; 8 GiB fixed, 12 GiB per batch
    assert batch_headroom(device, 100 * gib) == pytest.approx((99 * 20 / 22 - 8) / 12)
    device["peak_parts"]["backward_passes"] = 0  # activations cannot be told from the rest
    assert batch_headroom(device, 100 * gib) is None


def test_batch_headroom_about_halves_when_the_batch_doubles(runs) -> None:
    from tb_gpuprof.analysis.memory_parts import batch_headroom

    total = 2**30  # a 1 GiB device: far more than the fixed parts, so the ratio is the batch's
    small, large = (batch_headroom(runs[b].device, total) for b in (BATCH, 2 * BATCH))
    assert small is not None and large is not None
    # the activations double; the temporaries live at the peak depend on where in the
    # iteration it falls (on this CPU loop: 256 KiB at one batch, 1 MiB at the other)
    assert 1.6 <= small / large <= 3.0
