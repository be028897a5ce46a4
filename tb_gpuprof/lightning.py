"""PyTorch Lightning callback around :class:`tb_gpuprof.torch.GpuProfiler`.

    from tb_gpuprof.lightning import GpuProfCallback
    trainer = L.Trainer(callbacks=[GpuProfCallback("runs/resnet50", iter_start=20, iter_stop=40)])

Iterations are training batches counted from the start of ``fit`` across epochs (not
``trainer.global_step``, which counts optimizer steps). Data wait is the time from one batch's
end to the next batch's start, with validation runs taken out. Works with ``lightning`` and
``pytorch_lightning`` (the callback base class is taken from whichever is imported).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import warnings
from typing import Any

from .torch import GpuProfiler, GpuProfWarning, close_or_warn

# Lightning precision flags -> the autocast dtype they train under.
_PRECISION_AUTOCAST = {"16-mixed": "float16", "bf16-mixed": "bfloat16", "16": "float16",
                       "bf16": "bfloat16", "transformer-engine": None}


def _lightning_callback_base() -> type:
    """Lightning's Callback class: the package already imported wins, else whichever exists."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if name in sys.modules:
            return sys.modules[name].Callback
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(name).Callback
        except ImportError:
            continue
    raise ImportError("tb_gpuprof.lightning needs `lightning` or `pytorch_lightning` installed")


class GpuProfCallback(_lightning_callback_base()):  # type: ignore[misc]
    """Profile a Lightning ``fit``: ``GpuProfCallback(logdir, iter_start, iter_stop, **options)``.

    ``logdir`` defaults to the trainer's log directory; ``options`` are
    :class:`tb_gpuprof.torch.GpuProfiler`'s (``nvml``, ``with_stack``, ``record_shapes``,
    ``with_flops``, ``key``, ``nvtx``, ``verify``, ...; ``model`` defaults to the LightningModule,
    ``optimizer`` to the trainer's first optimizer: ``verify=True`` tries the report's top fixes
    inside this fit, docs/verify.md). The
    autocast dtype is taken from ``Trainer(precision=...)``. After ``fit``,
    ``callback.last_profiler`` is the finished :class:`GpuProfiler` (its ``report``, ``env``).
    """

    def __init__(self, logdir: str | os.PathLike[str] | None = None,
                 iter_start: int | None = None, iter_stop: int | None = None,
                 **options: Any) -> None:
        super().__init__()
        self.logdir = logdir
        self.iter_start = iter_start
        self.iter_stop = iter_stop
        self.options = options
        self.profiler: GpuProfiler | None = None
        self.last_profiler: GpuProfiler | None = None
        self._val_t0: float | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.profiler is not None:
            return
        try:
            logdir = self.logdir or trainer.log_dir or trainer.default_root_dir
            options = dict(self.options)
            options.setdefault("model", pl_module)
            optimizers = list(getattr(trainer, "optimizers", None) or [])
            options.setdefault("optimizer", optimizers[0] if optimizers else None)
            # on_train_batch_start marks data arrival; training_step may never call forward.
            options.setdefault("model_hooks", False)
            self.profiler = GpuProfiler(logdir, self.iter_start, self.iter_stop, **options)
            precision = str(getattr(trainer, "precision", "") or "")
            self.profiler.start()
            if precision in _PRECISION_AUTOCAST:
                self.profiler._autocast = _PRECISION_AUTOCAST[precision]
        except Exception as e:
            warnings.warn(f"tb_gpuprof: profiling disabled, training continues: {e}",
                          GpuProfWarning, stacklevel=2)
            self.profiler = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        if self.profiler is not None:
            self.profiler.batch_ready()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.profiler is not None:
            self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.profiler is not None and self._val_t0 is not None:
            self.profiler.exclude(time.perf_counter() - self._val_t0)
            self._val_t0 = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # a CUDA out-of-memory error gets its report (docs/pytorch.md#out-of-memory); Lightning
        # re-raises ``exception`` itself afterwards
        self._close(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._close()

    def _close(self, exception: BaseException | None = None) -> None:
        prof, self.profiler = self.profiler, None
        if prof is not None:
            close_or_warn(prof, exception)
            self.last_profiler = prof


__all__ = ["GpuProfCallback"]
