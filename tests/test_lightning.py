"""GpuProfCallback in a real Lightning fit on CPU."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
try:
    import lightning.pytorch as pl
except ImportError:
    pl = pytest.importorskip("pytorch_lightning")

from tb_gpuprof.lightning import GpuProfCallback  # noqa: E402
from tb_gpuprof.store.reader import load_run_report  # noqa: E402
from tb_gpuprof.torch import GpuProfWarning  # noqa: E402
from tests.runs import read_scalars  # noqa: E402

from .test_torch_hook import tiny_cnn  # noqa: E402


class TinyModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_cnn()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x).float(), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x).float(), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader(n: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(n * 8, 3, 16, 16, generator=g),
                                        torch.randint(0, 10, (n * 8,), generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=8)


def fit(callback, *, epochs: int, batches: int, precision: str = "32-true") -> None:
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback],
                         precision=precision, limit_val_batches=2, num_sanity_val_steps=0)
    trainer.fit(TinyModule(), loader(batches), loader(2))


def test_callback_writes_scalars_and_window_report_across_epochs(tmp_path):
    run = str(tmp_path / "pl")
    cb = GpuProfCallback(run, iter_start=3, iter_stop=8)
    assert isinstance(cb, pl.Callback)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpuProfWarning)
        fit(cb, epochs=2, batches=6, precision="bf16-mixed")

    scalars = read_scalars(run)
    # iterations count training batches across both epochs; validation ran in between
    assert sorted(scalars["gpuprof/iteration_time_ms"]) == list(range(12))
    assert sorted(scalars["gpuprof/data_wait_ms"]) == list(range(12))
    report = load_run_report(run)
    assert report["iterations"]["count"] == 5
    assert report["iterations"]["range"] == [3, 7]
    assert report["system"]["flags"]["autocast"] == "bfloat16"
    assert report["system"]["flags"]["channels_last"] is False
    assert cb.last_profiler is not None and cb.last_profiler.iteration == 12


def test_validation_time_is_left_out_of_the_next_iteration(tmp_path, monkeypatch):
    import time as time_mod

    run = str(tmp_path / "val")
    slow_val = TinyModule.validation_step

    def sleepy(self, batch, batch_idx):
        time_mod.sleep(0.75)
        return slow_val(self, batch, batch_idx)

    monkeypatch.setattr(TinyModule, "validation_step", sleepy)
    cb = GpuProfCallback(run, iter_start=None)
    fit(cb, epochs=2, batches=3)
    walls = read_scalars(run)["gpuprof/iteration_time_ms"]
    # two validation batches (1.5 s of sleep) ran between iterations 2 and 3; without the
    # exclusion iteration 3 would take longer than that
    assert sorted(walls) == list(range(6))
    assert walls[3] < 1000.0


class ForwardModule(TinyModule):
    """A LightningModule whose training_step runs its own forward (autocast wraps that)."""

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x).float(), y)


class StopWhenVerified(pl.Callback):
    """Ends the fit a few batches after the verification (its report comes from the window's
    child process, seconds after the window)."""

    def __init__(self, cb: GpuProfCallback) -> None:
        self.cb, self.after = cb, 0

    def on_train_batch_end(self, trainer, *args) -> None:
        prof = self.cb.profiler
        if prof is not None and prof._verify_state == "done":
            self.after += 1
            trainer.should_stop = self.after >= 3


def endless_loader() -> torch.utils.data.DataLoader:
    class Same(torch.utils.data.Dataset):
        x, y = torch.randn(3, 16, 16), torch.tensor(1)

        def __len__(self) -> int:
            return 10**7

        def __getitem__(self, i: int):
            return self.x, self.y

    return torch.utils.data.DataLoader(Same(), batch_size=8)


def test_verify_runs_inside_the_fit_with_the_trainers_optimizer(tmp_path):
    run = str(tmp_path / "verify")
    cb = GpuProfCallback(run, iter_start=2, iter_stop=4, verify=["amp"], verify_max_s=60)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb], limit_val_batches=0,
                         num_sanity_val_steps=0, max_steps=-1)
    module = ForwardModule()
    trainer.callbacks.append(StopWhenVerified(cb))
    trainer.fit(module, endless_loader())
    prof = cb.last_profiler
    assert prof is not None and prof.optimizer is trainer.optimizers[0]
    section = load_run_report(run)["verification"]
    assert section["restored"] is True, section
    amp = section["trials"]["amp"]
    # a tiny CPU loop on a shared machine may be too noisy for a verdict: then it says so
    assert amp["blocks"] >= 4 and (amp["status"] in ("measured", "no_change")
                                   or amp["verdict"].startswith("inconclusive")), amp
    assert "forward" not in module.__dict__  # the autocast wrapper is gone
