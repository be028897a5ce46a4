"""The out-of-memory report (analysis/oom.py, capture/torch_oom.py): real CPU training loops
under the PyTorch hook that raise a simulated CUDA out-of-memory error, and the pure
function on hand-built inputs whose answers are worked out here."""

from __future__ import annotations

import json
import math
import os
import warnings

import pytest

torch = pytest.importorskip("torch")

from tb_gpuprof.analysis import oom  # noqa: E402
from tb_gpuprof.capture import torch_oom  # noqa: E402
from tb_gpuprof.store import layout  # noqa: E402
from tb_gpuprof.torch import GpuProfiler, GpuProfWarning  # noqa: E402

GIB, MIB = 2**30, 2**20
MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.11 GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process has "
           "77.60 GiB memory in use. Of the allocated memory 75.10 GiB is allocated by PyTorch, "
           "and 1.20 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
           "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
BATCH = 48


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _loop(run: str, fail_at: int | None, error: BaseException | None = None, **options):
    """A real training loop under the hook; at iteration ``fail_at`` the step raises
    ``error`` after its optimizer step. Returns (profiler, raised error or None, model, opt,
    warnings)."""
    model, opt = _model_and_optimizer()
    data = [(torch.randn(BATCH, 32), torch.randint(0, 10, (BATCH,))) for _ in range(6)]
    raised = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with GpuProfiler(run, model=model, optimizer=opt, **options) as prof:
                for i, (x, y) in enumerate(prof.wrap(data)):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    if i == fail_at:
                        raise error or torch.cuda.OutOfMemoryError(MESSAGE)
                    prof.step()
        except BaseException as e:
            raised = e
    ours = [w for w in caught if issubclass(w.category, GpuProfWarning)]
    return prof, raised, model, opt, ours


def _sizes(model, opt) -> tuple[int, int]:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(v.untyped_storage().nbytes() for s in opt.state.values() for v in s.values()
                if torch.is_tensor(v))
    return params, state


def test_the_oom_report_is_written_and_the_error_propagates_unchanged(tmp_path) -> None:
    error = torch.cuda.OutOfMemoryError(MESSAGE)
    prof, raised, model, opt, ours = _loop(str(tmp_path / "run"), 3, error)
    assert raised is error and str(raised) == MESSAGE  # the same object, unchanged
    path = layout.oom_report_path(str(tmp_path / "run"))
    assert prof.oom_report_path == path and os.path.isfile(path)
    report = json.load(open(path))
    assert report["error"] == {"type": "torch.OutOfMemoryError", "message": MESSAGE}
    assert report["step"] == 3 and report["batch_size"] == BATCH
    figures = report["message_figures"]
    assert figures["gpu"] == 0 and figures["tried_to_allocate_bytes"] == 2 * GIB
    assert figures["free_bytes"] == round(1.5 * GIB)
    assert figures["pytorch_allocated_bytes"] == round(75.10 * GIB)
    assert report["allocator"]["available"] is False  # no CUDA here
    # what the model and the optimizer hold, counted independently here
    params, state = _sizes(model, opt)
    fixed = report["fixed_bytes"]
    assert fixed["parameters"] == params and fixed["gradients"] == params
    assert fixed["optimizer_state"] == state
    # the failure (75.10 GiB held + 2 GiB asked) dwarfs the model: the largest part is the rest
    assert report["last_peak"]["source"] == "failure"
    assert report["largest_part"] == "activations_and_temporaries"
    budget = round(75.10 * GIB) + round(1.20 * GIB) + round(1.5 * GIB)
    assert report["budget_bytes"] == budget
    per_sample = (round(75.10 * GIB) + 2 * GIB - params * 2 - state) / BATCH
    assert report["per_sample_bytes"] == round(per_sample)
    advice = {a["fix"]: a for a in report["advice"]}
    assert {"batch_size", "bf16_autocast", "optimizer_less_state"} <= set(advice)
    largest = min(math.floor((budget - (2 * params + state)) / per_sample), BATCH - 1)
    assert advice["batch_size"]["largest_batch_size"] == largest
    assert advice["batch_size"]["bound"] == "at_most"  # only the failure was known
    assert advice["optimizer_less_state"]["predicted_saving_bytes"] == round(state / 2)
    # one warning with the summary, naming the largest part and the report
    summary = [w for w in ours if "out of memory" in str(w.message)]
    assert len(summary) == 1 and "activations_and_temporaries" in str(summary[0].message)
    assert path in str(summary[0].message)


def test_after_the_report_training_goes_on_with_the_same_model(tmp_path) -> None:
    _prof, raised, model, opt, _ = _loop(str(tmp_path / "run"), 2)
    assert isinstance(raised, torch.cuda.OutOfMemoryError)
    before = [p.detach().clone() for p in model.parameters()]
    assert all(p.requires_grad for p in model.parameters())
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_window_before_the_failure_gives_its_measured_parts(tmp_path) -> None:
    """A small failure (its figures below the window's peak): the window's decomposition is
    the last known peak and its largest part is named."""
    small = ("CUDA out of memory. Tried to allocate 1.00 KiB. GPU 0 has a total capacity of "
             "79.11 GiB of which 0 bytes is free.")
    prof, raised, _model, _opt, _ = _loop(str(tmp_path / "run"), 4,
                                        torch.cuda.OutOfMemoryError(small),
                                        iter_start=1, iter_stop=3)
    assert isinstance(raised, torch.cuda.OutOfMemoryError)
    assert prof.report is not None
    report = json.load(open(prof.oom_report_path))
    peak = report["last_peak"]
    assert peak["source"] == "window" and peak["batch_size"] == BATCH
    window_parts = next(d for d in prof.report["memory"]["devices"]
                        if d["device"] == "cpu")["peak_parts"]["parts"]
    expected = max((p for p in window_parts if p["bytes"]), key=lambda p: p["bytes"])["part"]
    assert report["largest_part"] == expected


def test_an_error_that_is_no_oom_writes_nothing_and_costs_nothing(tmp_path, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(GpuProfiler, "_oom_capture", lambda self: calls.append(1))
    for fail_at, error in ((None, None), (2, ValueError("not memory"))):
        run = str(tmp_path / f"run{fail_at}")
        prof, raised, *_ = _loop(run, fail_at, error)
        assert raised is error
        assert not os.path.exists(layout.oom_report_path(run))
        assert prof.oom_report_path is None
    assert calls == []


def test_a_failing_report_is_one_warning_and_the_error_still_propagates(tmp_path,
                                                                         monkeypatch) -> None:
    def broken(**kwargs):
        raise KeyError("broken")

    monkeypatch.setattr(oom, "oom_report", broken)
    error = torch.cuda.OutOfMemoryError(MESSAGE)
    _prof, raised, *_, ours = _loop(str(tmp_path / "run"), 1, error)
    assert raised is error
    failed = [w for w in ours if "out-of-memory report failed" in str(w.message)]
    assert len(failed) == 1 and len(ours) == 1
    assert not os.path.exists(layout.oom_report_path(str(tmp_path / "run")))


def test_an_old_torchs_runtime_error_is_recognised() -> None:
    assert torch_oom.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2 MiB"))
    assert torch_oom.is_out_of_memory(torch.cuda.OutOfMemoryError("anything"))
    assert not torch_oom.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not torch_oom.is_out_of_memory(MemoryError())
    assert not torch_oom.is_out_of_memory(None)


def test_the_batch_size_is_read_from_the_batch() -> None:
    t = torch.zeros(7, 3)
    assert torch_oom.batch_size_of(t) == 7
    assert torch_oom.batch_size_of((t, torch.zeros(7))) == 7
    assert torch_oom.batch_size_of({"input_ids": torch.zeros(5, 9)}) == 5
    assert torch_oom.batch_size_of([]) is None and torch_oom.batch_size_of(3) is None


def test_a_model_called_with_keywords_gives_its_batch_size(tmp_path) -> None:
    """HF models take their batch as keywords (``model(input_ids=..., labels=...)``): the
    report still knows the failing step's batch size and predicts from it."""

    class Keywords(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(50, 16)
            self.head = torch.nn.Linear(16, 50)

        def forward(self, *, input_ids, labels):
            logits = self.head(self.embed(input_ids))
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())

    model = Keywords()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(torch.cuda.OutOfMemoryError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with GpuProfiler(str(tmp_path / "run"), model=model, optimizer=opt) as prof:
            for i in range(3):
                ids = torch.randint(0, 50, (13, 5))
                loss = model(input_ids=ids, labels=ids)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if i == 2:
                    raise torch.cuda.OutOfMemoryError(MESSAGE)
                prof.step()
    report = json.load(open(prof.oom_report_path))
    assert report["batch_size"] == 13
    assert torch_oom.batch_size_of_keywords({"return_dict": True, "x": torch.zeros(4, 2)}) == 4
    assert torch_oom.batch_size_of_keywords({"return_dict": True}) is None


# -- the pure function, by hand -----------------------------------------------------------------

def _tensors(params: int, grads: int, state: int) -> dict:
    """A record of three storages on cuda:0 (the capture's columns)."""
    rows = [("parameters", params, 1), ("gradients", grads, 2), ("optimizer_state", state, 3)]
    rows = [r for r in rows if r[1]]
    return {"kind": [r[0] for r in rows], "param": ["w"] * len(rows), "key": [None] * len(rows),
            "device": ["cuda:0"] * len(rows), "ptr": [r[2] for r in rows],
            "storage_bytes": [r[1] for r in rows], "tensor_bytes": [r[1] for r in rows],
            "recorded": ["parameters", "gradients", "optimizer_state"]}


def test_a_measured_peak_predicts_the_largest_batch() -> None:
    """1 GiB parameters, AdamW; at batch 8 the step peaked at 12 GiB: per sample
    (12 - 4) / 8 = 1 GiB; the budget is 20 GiB reserved + 2 GiB free: (22 - 4) / 1 = 18."""
    report = oom.oom_report(
        error_type="torch.OutOfMemoryError", message="CUDA out of memory. Tried to allocate "
        "3.00 GiB.", step=5, device="cuda:0",
        allocator={"reserved_bytes": 20 * GIB, "allocated_bytes": 19 * GIB,
                   "inactive_split_bytes": 0, "largest_free_block_bytes": 512 * MIB,
                   "segments": 40, "device_free_bytes": 2 * GIB,
                   "device_total_bytes": 24 * GIB},
        tensors=_tensors(GIB, GIB, 2 * GIB),
        model={"trainable_parameter_bytes": GIB, "parameter_dtypes": ["torch.float32"],
               "optimizer": "AdamW", "parametrized_modules": 16},
        batch_size=24, history=[{"step": 3, "batch_size": 8, "allocated_bytes": 12 * GIB}])
    assert report["budget_bytes"] == 22 * GIB
    assert report["fixed_bytes"]["total"] == 4 * GIB
    assert report["per_sample_bytes"] == GIB and report["per_sample_basis"] == "iteration_peaks"
    advice = {a["fix"]: a for a in report["advice"]}
    assert advice["batch_size"]["largest_batch_size"] == 18
    assert advice["batch_size"]["bound"] == "measured"
    assert advice["batch_size"]["predicted_saving_bytes"] == 6 * GIB  # 24 - 18 samples
    # demand at 24: 4 + 24 = 28 GiB; bf16 halves the 24 GiB of activations -> 16 GiB: fits
    assert report["predicted_demand_bytes"] == 28 * GIB
    assert advice["bf16_autocast"]["predicted_saving_bytes"] == 12 * GIB
    assert advice["bf16_autocast"]["fits"] is True
    # 16 layers: checkpointing keeps 2 * 4 / 16 = 1/2 of them
    assert advice["activation_checkpointing"]["predicted_saving_bytes"] == 12 * GIB
    assert advice["optimizer_less_state"]["predicted_saving_bytes"] == GIB
    assert advice["optimizer_less_state"]["fits"] is False  # 27 GiB > 22 GiB
    assert "expandable_segments" not in advice  # 1 GiB unallocated < the 3 GiB asked
    assert report["allocator"]["segments"] == 40
    assert report["allocator"]["largest_free_block_bytes"] == 512 * MIB


def test_a_window_peak_predicts_from_its_own_parts_at_the_allocators_packing() -> None:
    """The window at batch 4 peaked at 10 GiB allocated, 12.5 GiB reserved (packing 0.8):
    1 GiB parameters, 2 GiB optimizer state, no gradients live at that peak (the forward
    after zero_grad), 6 GiB activations + 1 GiB temporaries (7 / 4 = 1.75 GiB per sample).
    Usable: (20 reserved + 2 free) * 0.8 = 17.6 GiB; (17.6 - 3) / 1.75 = 8.34 -> 8. Steady
    gradients, counted as fixed with the per-iteration peak alone, say 12, capped at 11."""
    parts = {"allocated_bytes": 10 * GIB, "uncounted_bytes": 0,
             "fragmentation": {"bytes": 5 * GIB // 2},
             "parts": [{"part": "parameters", "bytes": GIB}, {"part": "gradients", "bytes": 0},
                       {"part": "optimizer_state", "bytes": 2 * GIB},
                       {"part": "activations", "bytes": 6 * GIB},
                       {"part": "temporaries", "bytes": GIB}]}
    report = oom.oom_report(
        error_type="torch.OutOfMemoryError", message="CUDA out of memory. Tried to allocate "
        "3.00 GiB.", step=9, device="cuda:0",
        allocator={"reserved_bytes": 20 * GIB, "allocated_bytes": 19 * GIB,
                   "inactive_split_bytes": 0, "largest_free_block_bytes": 512 * MIB,
                   "segments": 40, "device_free_bytes": 2 * GIB,
                   "device_total_bytes": 24 * GIB},
        tensors=_tensors(GIB, GIB, 2 * GIB),
        model={"trainable_parameter_bytes": GIB, "parameter_dtypes": ["torch.float32"],
               "optimizer": "AdamW", "parametrized_modules": 16},
        batch_size=12, window={"peak_parts": parts, "batch_size": 4, "step": 3})
    assert report["per_sample_basis"] == "window_peak"
    assert report["per_sample_bytes"] == round(1.75 * GIB)
    assert report["prediction_fixed_bytes"] == 3 * GIB
    assert report["allocator_packing"] == 0.8
    assert report["usable_bytes"] == round(22 * GIB * 0.8)
    advice = {a["fix"]: a for a in report["advice"]}
    assert advice["batch_size"]["largest_batch_size"] == 8
    assert report["predicted_demand_bytes"] == 3 * GIB + 12 * round(1.75 * GIB)
    # without the window: the steady fixed parts (1 + 1 + 2 GiB), no packing: (22 - 4) / 1.5
    history = [{"step": 3, "batch_size": 4, "allocated_bytes": 10 * GIB}]
    plain = oom.oom_report(
        error_type="torch.OutOfMemoryError", message=report["error"]["message"], step=9,
        device="cuda:0", allocator={"reserved_bytes": 20 * GIB, "allocated_bytes": 19 * GIB,
                                    "device_free_bytes": 2 * GIB},
        tensors=_tensors(GIB, GIB, 2 * GIB), model={"trainable_parameter_bytes": GIB,
                                                     "optimizer": "AdamW"},
        batch_size=12, history=history)
    # (10 - 4) / 4 = 1.5 GiB per sample, (22 - 4) / 1.5 = 12: yet 12 failed, so 11 (a note)
    assert {a["fix"]: a for a in plain["advice"]}["batch_size"]["largest_batch_size"] == 11
    assert plain["allocator_packing"] == 1.0 and any("yet it failed" in n for n in plain["notes"])


def test_fragmentation_as_large_as_the_request_advises_expandable_segments() -> None:
    report = oom.oom_report(
        error_type="torch.OutOfMemoryError", message="CUDA out of memory. Tried to allocate "
        "1.00 GiB.", step=0, device="cuda:0",
        allocator={"reserved_bytes": 10 * GIB, "allocated_bytes": 7 * GIB,
                   "inactive_split_bytes": 2 * GIB, "largest_free_block_bytes": 700 * MIB,
                   "segments": 90, "device_free_bytes": 0, "device_total_bytes": 10 * GIB},
        tensors=None, model=None, batch_size=None)
    advice = {a["fix"]: a for a in report["advice"]}
    assert advice["expandable_segments"]["predicted_saving_bytes"] == 3 * GIB
    assert "batch_size" not in advice  # no batch size known
    assert report["largest_part"] == "activations_and_temporaries"  # 7 GiB held, nothing named


def test_an_optimizer_without_state_yet_is_counted_as_its_first_step_makes_it() -> None:
    """Failure in the first forward: no gradients, no Adam state yet; both are counted."""
    report = oom.oom_report(
        error_type="torch.OutOfMemoryError", message="", step=0, device="cuda:0",
        allocator={"reserved_bytes": 8 * GIB, "allocated_bytes": 7 * GIB,
                   "device_free_bytes": GIB},
        tensors=_tensors(GIB, 0, 0),
        model={"trainable_parameter_bytes": GIB, "optimizer": "Adam",
               "parameter_dtypes": ["torch.float32"], "parametrized_modules": 2},
        batch_size=12)
    assert report["fixed_bytes"] == {"parameters": GIB, "gradients": GIB,
                                     "optimizer_state": 2 * GIB, "total": 4 * GIB,
                                     "held_now": {"parameters": GIB, "gradients": 0,
                                                  "optimizer_state": 0}}
    # at least (7 - 1) / 12 GiB per sample; (9 - 4) / 0.5 = 10 at most
    assert report["per_sample_bytes"] == GIB // 2
    advice = {a["fix"]: a for a in report["advice"]}
    assert advice["batch_size"]["largest_batch_size"] == 10
    assert advice["batch_size"]["bound"] == "at_most"
    assert "activation_checkpointing" not in advice  # two layers: nothing to say


def test_the_message_is_parsed_in_its_units() -> None:
    parsed = oom.parse_message("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a "
                               "total capacity of 15.77 GiB of which 512.00 KiB is free.")
    assert parsed["gpu"] == 3 and parsed["tried_to_allocate_bytes"] == 20 * MIB
    assert parsed["free_bytes"] == 512 * 1024
    assert parsed["total_capacity_bytes"] == round(15.77 * GIB)
    assert parsed["pytorch_allocated_bytes"] is None


def test_lightnings_exception_hook_writes_the_report(tmp_path) -> None:
    L = pytest.importorskip("lightning.pytorch")
    from tb_gpuprof.lightning import GpuProfCallback

    error = torch.cuda.OutOfMemoryError(MESSAGE)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(32, 10)

        def training_step(self, batch, i):
            if i == 2:
                raise error
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 10, (64,))),
        batch_size=16)
    callback = GpuProfCallback(str(tmp_path / "run"))
    trainer = L.Trainer(max_epochs=1, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(torch.cuda.OutOfMemoryError) as info:
            trainer.fit(Module(), data)
    assert info.value is error
    report = json.load(open(layout.oom_report_path(str(tmp_path / "run"))))
    assert report["error"]["message"] == MESSAGE and report["step"] == 2


# -- the CLI ------------------------------------------------------------------------------------

def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tb_gpuprof", *args], capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_report_command_shows_the_out_of_memory_report(tmp_path) -> None:
    """`tb-gpuprof report RUN` after a loop that ran out of memory: before any window, the
    out-of-memory report alone (text), or one line naming it (JSON, which has no report to
    give); after a window, its summary above the window's report."""
    early = str(tmp_path / "early")
    _loop(early, 1)
    text = _cli("report", early)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("tb_gpuprof: out of memory at iteration 1")
    assert layout.oom_report_path(early) in text.stdout
    as_json = _cli("report", early, "--format", "json")
    assert as_json.returncode != 0 and as_json.stdout == ""
    assert len(as_json.stderr.strip().splitlines()) == 1
    assert layout.oom_report_path(early) in as_json.stderr

    late = str(tmp_path / "late")
    _loop(late, 4, iter_start=1, iter_stop=3)
    text = _cli("report", late)
    assert text.returncode == 0, text.stderr
    first, rest = text.stdout.split("\n", 1)
    assert first.startswith("tb_gpuprof: out of memory at iteration 4")
    assert "Report: " + layout.oom_report_path(late) in first and len(rest) > 200
    assert json.loads(_cli("report", late, "--format", "json").stdout)["iterations"]

    broken = str(tmp_path / "broken")
    _loop(broken, 1)
    with open(layout.oom_report_path(broken), "w") as f:
        f.write("{not json")
    text = _cli("report", broken)
    assert text.returncode == 0 and "unreadable out-of-memory report" in text.stdout


def test_the_oom_route_gives_a_runs_reports_and_nothing_outside_the_logdir(tmp_path) -> None:
    from tests.conftest import wsgi_client

    _loop(str(tmp_path / "logs" / "late"), 4, iter_start=1, iter_stop=3)
    _loop(str(tmp_path / "logs" / "fine"), None)
    outside = tmp_path / "elsewhere"
    _loop(str(outside), 1)
    client = wsgi_client(tmp_path / "logs")

    def oom(run: str):
        response = client.get("/data/plugin/gpuprof/oom?run=" + run)
        return response.status_code, json.loads(response.get_data())

    status, body = oom("late")
    assert status == 200 and body["run"] == "late" and len(body["reports"]) == 1
    on_disk = json.load(open(layout.oom_report_path(str(tmp_path / "logs" / "late"))))
    assert body["reports"][0] == on_disk and body["reports"][0]["step"] == 4
    assert oom("fine") == (200, {"run": "fine", "reports": []})
    assert oom("../elsewhere")[1]["reports"] == []  # a run name never leaves the log directory
    response = client.get("/data/plugin/gpuprof/oom")
    assert response.status_code == 400
