"""Hugging Face ``transformers.Trainer`` callback around :class:`tb_gpuprof.torch.GpuProfiler`.

    from tb_gpuprof.transformers import GpuProfCallback
    trainer = Trainer(..., callbacks=[GpuProfCallback("runs/gpt2", iter_start=20, iter_stop=24)])

One iteration is one optimizer step (``on_step_end`` fires once per step, after all of its
gradient-accumulation micro-batches), so the scalars' step is the Trainer's ``global_step``
minus the steps before ``train()`` started. The Trainer's ``fp16``/``bf16``/``tf32``/
``torch_compile`` settings are recorded as flags. Evaluation and checkpoint saving between two
steps are left out of the next iteration's time. User guide: docs/transformers.md.

This module is named like the library; ``transformers`` itself is imported via importlib
(absolute imports resolve to the real package), and only when this module is imported.
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import time
import warnings
from typing import Any

from .torch import GpuProfiler, GpuProfWarning, close_or_warn

RUN_NAME = "gpuprof"


def _trainer_callback_base() -> type:
    try:
        return importlib.import_module("transformers").TrainerCallback
    except ImportError:
        raise ImportError("tb_gpuprof.transformers needs `transformers` installed "
                          "(pip install tb_gpuprof[transformers])") from None


def trainer_flags(args: Any) -> dict[str, Any]:
    """The TrainingArguments switches recommendations and `compare` read, as report flags."""
    return {"trainer_fp16": bool(getattr(args, "fp16", False)),
            "trainer_bf16": bool(getattr(args, "bf16", False)),
            "trainer_tf32": getattr(args, "tf32", None),
            "trainer_torch_compile": bool(getattr(args, "torch_compile", False))}


def default_run_dir(args: Any) -> str:
    """Beside the Trainer's own TensorBoard logs.

    ``<logging_dir>/gpuprof`` where the Trainer has a logging directory
    (``TENSORBOARD_LOGGING_DIR`` or, before transformers 5, ``args.logging_dir``); else
    ``<output_dir>/runs/<time>_<host>_gpuprof``, next to the ``<output_dir>/runs/<time>_<host>``
    run that TensorBoardCallback writes.
    """
    base = os.environ.get("TENSORBOARD_LOGGING_DIR") or getattr(args, "logging_dir", None)
    if base:
        return os.path.join(os.path.expanduser(base), RUN_NAME)
    stamp = datetime.datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join(getattr(args, "output_dir", None) or ".", "runs",
                        f"{stamp}_{socket.gethostname()}_{RUN_NAME}")


class GpuProfCallback(_trainer_callback_base()):  # type: ignore[misc]
    """Profile ``Trainer.train()``: ``GpuProfCallback(logdir, iter_start, iter_stop, **options)``.

    ``logdir`` defaults to :func:`default_run_dir`. ``peak_tflops`` overrides the peak table
    for MFU. ``options`` are :class:`tb_gpuprof.torch.GpuProfiler`'s (``nvml``,
    ``with_stack``, ``key``, ``verify``, ...; ``model`` and ``optimizer`` default to the
    Trainer's: ``verify=True`` tries the report's top fixes inside this ``train()``,
    docs/verify.md). After ``train()``,
    ``callback.last_profiler`` is the finished :class:`GpuProfiler` (its ``report``, ``env``).
    """

    def __init__(self, logdir: str | os.PathLike[str] | None = None,
                 iter_start: int | None = None, iter_stop: int | None = None, *,
                 peak_tflops: float | None = None, **options: Any) -> None:
        super().__init__()
        self.logdir = logdir
        self.iter_start = iter_start
        self.iter_stop = iter_stop
        self.peak_tflops = peak_tflops
        self.options = options
        self.profiler: GpuProfiler | None = None
        self.last_profiler: GpuProfiler | None = None
        self.run_dir: str | None = None
        self._t_mark: float | None = None  # last step end (or excluded pause) before a pause

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None:
            return
        try:
            self.run_dir = os.fspath(self.logdir) if self.logdir else default_run_dir(args)
            options = dict(self.options)
            options.setdefault("model", kwargs.get("model"))
            options.setdefault("optimizer", kwargs.get("optimizer"))
            # on_step_begin marks the step's batches as in hand (the Trainer fetches all of a
            # step's micro-batches first), so the model's forward hook is not needed
            options.setdefault("model_hooks", False)
            flags = trainer_flags(args)
            if flags.get("trainer_torch_compile"):
                flags["compiled"] = True
            prof = GpuProfiler(self.run_dir, self.iter_start, self.iter_stop,
                               extra_flags=flags, peak_tflops=self.peak_tflops, **options)
            # accelerate enters autocast inside the wrapped forward, where no outer hook sees
            # it; the Trainer's arguments say which dtype it uses
            if getattr(args, "bf16", False):
                prof._autocast = "bfloat16"
            elif getattr(args, "fp16", False):
                prof._autocast = "float16"
            self.profiler = prof.start()
        except Exception as e:
            warnings.warn(f"tb_gpuprof: profiling disabled, training continues: {e}",
                          GpuProfWarning, stacklevel=2)
            self.profiler = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None:
            self._t_mark = None
            self.profiler.batch_ready()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None:
            self.profiler.step()
            self._t_mark = time.perf_counter()

    def _exclude_pause(self) -> None:
        """Evaluation or saving ran since the last step ended (or since the last pause)."""
        if self.profiler is not None and self._t_mark is not None:
            now = time.perf_counter()
            self.profiler.exclude(now - self._t_mark)
            self._t_mark = now

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._exclude_pause()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._exclude_pause()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close_after(None)

    def close_after(self, exc: BaseException | None) -> None:
        """The Trainer has no exception callback (``on_train_end`` does not run when
        ``train()`` raises): call this from an ``except`` around ``trainer.train()`` and
        re-raise, so that a CUDA out-of-memory error gets its report
        (docs/pytorch.md#out-of-memory)."""
        prof, self.profiler = self.profiler, None
        if prof is not None:
            close_or_warn(prof, exc)
            self.last_profiler = prof


__all__ = ["GpuProfCallback", "default_run_dir", "trainer_flags"]
