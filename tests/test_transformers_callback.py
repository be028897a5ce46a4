"""GpuProfCallback in a real transformers.Trainer on CPU, and GpuProfiler in an Accelerate loop."""

from __future__ import annotations

import os
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tb_gpuprof.store.reader import find_runs, load_run_report  # noqa: E402
from tb_gpuprof.torch import GpuProfiler, GpuProfWarning  # noqa: E402
from tb_gpuprof.transformers import GpuProfCallback  # noqa: E402
from tests.runs import cli_report, read_scalars  # noqa: E402

SEQ = 16


def tiny_gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2,
                                     n_head=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(tmp_path, callback, *, steps: int, accumulation: int = 1, **extra) -> None:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulation, learning_rate=1e-3, use_cpu=True,
        save_strategy="no", logging_steps=4, dataloader_num_workers=0, disable_tqdm=True,
        **{"report_to": [], **extra})
    transformers.Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(64),
                         eval_dataset=Tokens(8), callbacks=[callback]).train()


def test_trainer_run_writes_per_step_scalars_and_a_window_report(tmp_path):
    run = str(tmp_path / "gpt2")
    cb = GpuProfCallback(run, iter_start=4, iter_stop=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpuProfWarning)
        # two micro-batches per optimizer step: 20 micro-batches, 10 iterations
        train(tmp_path, cb, steps=10, accumulation=2, bf16=True)

    scalars = read_scalars(run)
    assert sorted(scalars["gpuprof/iteration_time_ms"]) == list(range(10))
    assert sorted(scalars["gpuprof/data_wait_ms"]) == list(range(10))
    report = load_run_report(run)
    assert report["iterations"]["count"] == 3 and report["iterations"]["range"] == [4, 6]
    flags = report["system"]["flags"]
    assert flags["trainer_bf16"] is True and flags["trainer_fp16"] is False
    assert flags["trainer_torch_compile"] is False and flags["autocast"] == "bfloat16"
    assert cli_report(run)["iterations"]["count"] == 3  # what a user gets from the CLI
    assert "throughput" in report
    assert cb.last_profiler is not None and cb.last_profiler.iteration == 10
    assert cb.last_profiler.env["flags"]["trainer_bf16"] is True  # the run summary's env
    # the Trainer's optimizer is the hook's (verify= moves its state with channels_last)
    assert isinstance(cb.last_profiler.optimizer, torch.optim.Optimizer)


def test_default_run_dir_sits_beside_the_trainers_tensorboard_run(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    cb = GpuProfCallback(iter_start=1, iter_stop=2, peak_tflops=1.0)
    train(tmp_path, cb, steps=3, report_to=["tensorboard"])
    logdir = tmp_path / "out" / "runs"
    runs = find_runs(str(logdir))
    ours = [r for r in runs if r.endswith("_gpuprof")]
    theirs = [r for r in runs if not r.endswith("_gpuprof")]
    assert len(ours) == 1 and len(theirs) == 1  # HF's own run and ours, side by side
    assert os.path.dirname(cb.run_dir) == str(logdir)
    assert load_run_report(cb.run_dir)["throughput"]["peak_source"] == "peak_tflops argument"

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = GpuProfCallback(iter_start=None)
    train(tmp_path / "second", cb, steps=2)
    assert cb.run_dir == str(tmp_path / "tb" / "gpuprof")
    assert sorted(read_scalars(cb.run_dir)["gpuprof/iteration_time_ms"]) == [0, 1]


def test_evaluation_is_left_out_of_the_next_iteration(tmp_path):
    pause_s = 1.0

    def slow_metrics(_eval_pred):
        time.sleep(pause_s)
        return {"slow": 1.0}

    run = str(tmp_path / "eval")
    cb = GpuProfCallback(run, iter_start=None)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4,
        use_cpu=True, save_strategy="no", eval_strategy="steps", eval_steps=2,
        report_to=[], disable_tqdm=True)
    transformers.Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(32),
                         eval_dataset=Tokens(4), compute_metrics=slow_metrics,
                         callbacks=[cb]).train()
    walls = read_scalars(run)["gpuprof/iteration_time_ms"]
    assert sorted(walls) == list(range(6))
    # evaluations (1 s each) ran after iterations 1, 3 and 5; without the exclusion iterations
    # 2 and 4 would each take a pause longer than any plain iteration (compared with those,
    # not with a fixed time, so a loaded machine does not fail it)
    plain = min(walls[1], walls[3], walls[5])
    assert max(walls[2], walls[4]) < plain + 1e3 * pause_s, walls


def test_accelerate_loop_with_gradient_accumulation(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    # the Trainers above left their process-wide AcceleratorState (fp32) behind
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2,
                                         mixed_precision="bf16")
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Tokens(48), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    run = str(tmp_path / "acc")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpuProfWarning)
        # the two lines docs/transformers.md shows: the profiler around the loop, and one
        # step() per optimizer step
        with GpuProfiler(run, iter_start=2, iter_stop=4) as prof:
            for batch in prof.wrap(loader):
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                if accelerator.sync_gradients:
                    prof.step()
    assert sorted(read_scalars(run)["gpuprof/iteration_time_ms"]) == list(range(6))
    report = load_run_report(run)
    assert report["iterations"]["count"] == 2 and report["iterations"]["range"] == [2, 3]
    # autocast is entered inside accelerate's wrapped forward; the window's probe sees it
    assert report["system"]["flags"]["autocast"] == "bfloat16"
