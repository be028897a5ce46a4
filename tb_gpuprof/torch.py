"""PyTorch training hook: always-on iteration timing plus one profiled window.

    from tb_gpuprof.torch import GpuProfiler
    with GpuProfiler("runs/resnet50_amp", iter_start=20, iter_stop=40) as prof:
        for x, y in prof.wrap(loader):
            ...train step...
            prof.step()

Always on: wall time, GPU time (CUDA events read lazily, never synchronized) and data wait per
iteration, memory peaks at most every ``memory_interval_s``, written as scalars off the
training thread; NVTX ranges per iteration. In [iter_start, iter_stop): torch.profiler, then
analysis off the training thread into a report stored in the run. Nothing here may break
training: an internal error becomes one warning and switches off the feature that failed.
User guide: docs/pytorch.md.

This module is named like the framework; ``torch`` itself is imported lazily via importlib
(absolute imports resolve to the real package).
"""

from __future__ import annotations

import collections
import importlib
import os
import shutil
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .capture import torch_env as _torch_env
from .capture import torch_memory, torch_oom
from .capture.hookcore import UNPROFILED_MIN, GpuProfWarning, HookCore
from .capture.torch_window import TorchProfilerWindow
from .capture.verify_options import DEFAULT_MAX_SECONDS as DEFAULT_VERIFY_MAX_S
from .capture.verify_options import verify_options
from .store import layout

# How many finished iterations may wait for their CUDA events before the oldest is dropped
# (the GPU never lags that far behind in practice; this only bounds memory).
MAX_PENDING = 1000
# Iterations just before the window's warm-up that start on an idle GPU (one synchronize at
# the step before each) and are timed on the host: the un-profiled host time the replay needs
# where a GPU-bound window's time cannot give it (analysis/stages.probe_host_scale).
HOST_PROBE_STEPS = 3


class _Iter:
    """One finished iteration waiting for its GPU time."""

    __slots__ = ("ahead", "data_ms", "ev_end", "ev_prev", "ev_start", "mem", "step", "wall_ms",
                 "wall_time")

    def __init__(self, step: int, wall_ms: float, data_ms: float | None, wall_time: float) -> None:
        self.step = step
        self.wall_ms = wall_ms
        self.data_ms = data_ms
        self.wall_time = wall_time
        self.ev_start: Any = None
        self.ev_end: Any = None
        self.ev_prev: Any = None  # the previous iteration's end event
        self.ahead = False  # the GPU was still on the previous iteration when this one ended
        self.mem: tuple[float, float] | None = None


def true_period(wall_ms: float, gpu_step_ms: float | None, host_ahead: bool
                ) -> tuple[float, bool]:
    """(the iteration's true period, whether it is the GPU's): when the host ran ahead of the
    GPU, the host's step-to-step time says how fast it queues work, not how fast iterations
    finish; the GPU's end-of-step to end-of-step time does. Otherwise the GPU waited for the
    host and the wall time is the period (and covers time the GPU spent idle)."""
    if host_ahead and gpu_step_ms is not None and gpu_step_ms > 0:
        return gpu_step_ms, True
    return wall_ms, False


class GpuProfiler(HookCore):
    """Profile a PyTorch training loop; call :meth:`step` at the end of every iteration.

    Args:
        logdir: the run directory (one TensorBoard run); created if missing. Under
            ``torch.distributed`` (or a launcher's ``RANK``) rank 0 writes there and rank r > 0
            into ``logdir/rank<r>``; every rank profiles the same iterations (docs/distributed.md).
        iter_start: first iteration of the profile window (0 = the first iteration after
            ``start()``). ``None``: no window, always-on measurements only.
        iter_stop: iteration the window stops before (exclusive); default ``iter_start + 1``.
        nvml: sample GPU telemetry through NVML (``None``: on when a CUDA GPU is present).
        nvml_interval_s: NVML sampling period (``None``: the sampler's default, 0.5 s).
        with_stack: record Python stacks in the window (kernel -> source line, the
            Timeline's Python rows; costs more).
        record_memory: record the allocator's allocations and frees in the window
            (``torch.profiler``'s ``profile_memory``), for the report's ``memory`` section and
            the dashboard's Memory view; with it, at the window's stop, the addresses and
            sizes of ``model``'s parameters and gradients and ``optimizer``'s state, and the
            CUDA allocator's fragmentation, for the memory peak's parts.
        record_shapes: record operator input shapes in the window.
        with_flops: estimate FLOPs of matmul/conv operators in the window.
        key: name of a range (``record_function``/NVTX) that marks one iteration in the
            window's trace, DLProf's ``--key_node``; default: the hook's own ProfilerStep#N.
        model: the ``nn.Module`` being trained (optional). Lets the hook read channels_last
            and torch.compile reliably, and name the parameters and gradients at the memory
            peak.
        model_hooks: with ``model``: a forward pre-hook marks the batch as in hand (data
            wait, when :meth:`wrap` is not used) and reads autocast inside the forward.
        nvtx: push an NVTX range "iteration N" per iteration (Nsight Systems).
        cuda_profiler_api: call cudaProfilerStart/Stop around the window, for
            ``nsys profile -c cudaProfilerApi --stop-on-range-end true``.
        memory: record peak allocated/reserved memory: the allocator's peaks since the last
            reading, read at the end of an iteration at most every ``memory_interval_s`` (and
            at every iteration of the window) and logged at that iteration. Reading resets
            PyTorch's peak-memory statistics (``torch.cuda.max_memory_allocated`` then covers
            the iterations since); set False if your code reads them.
        memory_interval_s: the least time between two readings of the peaks (default 0.1 s;
            0: every iteration). A reading takes 35-80 µs of the training thread on the H200
            (docs/performance.md), 0.1-0.3% of a 30 ms iteration when made every iteration.
        scalars: write the always-on scalars (``gpuprof/iteration_time_ms`` ...).
        flush_secs: how often the background thread writes queued scalars.
        peak_tflops: the GPU's dense BF16 peak TFLOP/s for MFU, instead of the built-in table.
        extra_flags: more flags for the report's ``system.flags`` (framework adapters record
            their own settings there, e.g. the Hugging Face Trainer's ``fp16``/``bf16``).
        optimizer: the optimizer being stepped (optional): the memory peak's optimizer state
            is its state tensors, exactly; verification moves its state with the parameters'
            memory format (channels_last).
        verify: after the window's report, measure its fixes inside this training loop
            (docs/verify.md): ``True`` for the top fixes, or a list of fix ids (``"tf32"``,
            ``"amp"``, ``"channels_last"``, ``"compile"``); each is switched on and off in
            blocks of iterations, then every setting is restored. Default ``False``.
        verify_compile: let verification try ``torch.compile`` (``model.compile()`` in place):
            it costs the compile time, which the report gives.
        verify_max_s: the most seconds the whole verification may take (default 600).
    """

    def __init__(self, logdir: str | os.PathLike[str], iter_start: int | None = None,
                 iter_stop: int | None = None, *, nvml: bool | None = None,
                 nvml_interval_s: float | None = None, with_stack: bool = False,
                 record_shapes: bool = True, with_flops: bool = True,
                 record_memory: bool = True, key: str | None = None, model: Any = None,
                 model_hooks: bool = True, nvtx: bool = True,
                 cuda_profiler_api: bool = True, memory: bool = True,
                 memory_interval_s: float = 0.1, scalars: bool = True, flush_secs: float = 1.0,
                 peak_tflops: float | None = None,
                 extra_flags: dict[str, Any] | None = None, optimizer: Any = None,
                 verify: bool | Sequence[str] = False, verify_compile: bool = False,
                 verify_max_s: float = DEFAULT_VERIFY_MAX_S) -> None:
        # run_dir: ``logdir``, or ``logdir/rank<r>`` for rank r > 0 (set at start(), once
        # torch.distributed is up). iteration: index of the iteration in progress.
        self._init_core(logdir, iter_start, iter_stop, key=key, nvml_interval_s=nvml_interval_s,
                        with_stack=with_stack, record_shapes=record_shapes,
                        with_flops=with_flops, flush_secs=flush_secs,
                        memory_interval_s=memory_interval_s)
        if peak_tflops is not None and not peak_tflops > 0:
            raise ValueError(f"peak_tflops must be positive, got {peak_tflops}")
        if not isinstance(record_memory, bool):
            raise TypeError(f"record_memory must be True or False, got {record_memory!r}")
        self.record_memory = record_memory
        self.peak_tflops = peak_tflops
        self.extra_flags = dict(extra_flags or {})
        self.distributed: dict[str, Any] = {"rank": 0, "world_size": 1, "backend": None}
        self.model = model
        self.optimizer = optimizer
        self._verify, self._verify_compile, self._verify_max_s = verify_options(
            verify, verify_compile, verify_max_s)
        self._verify_state = "waiting" if self._verify else "off"  # -> running -> done
        self._want = {"nvml": nvml, "nvtx": nvtx, "cuda_profiler_api": cuda_profiler_api,
                      "memory": memory, "scalars": scalars, "model_hooks": model_hooks}
        self._torch: Any = None
        self._started = False
        self.cuda = False
        self._dead = True  # until start() succeeds, and after an internal bug
        self._closed = False
        self._t_last = 0.0
        self._t_ready: float | None = None
        self._ev_last: Any = None  # end event of the previous iteration
        self._ev_ready: Any = None  # event recorded when this iteration's batch was in hand
        self._pending: collections.deque[_Iter] = collections.deque()
        self._hooks: list[Any] = []
        self._autocast: str | None = None
        self._window: TorchProfilerWindow | None = None
        self._window_t0 = 0.0
        self._recording = False  # the window's profiler is past its warm-up iteration
        self._nvtx_open = False
        self._teardown_cupti = False  # set TEARDOWN_CUPTI=1 around the window's start/stop
        self._cupti_hold = _torch_env.CuptiTeardownHold()  # ... and until the teardown ran
        self.analysis_seconds: float | None = None  # analysis + store, off-thread
        # the trace export and the results' release, on the training thread at the window's
        # stop (torch's C++ holds the GIL throughout: from any thread it stalls training)
        self.export_seconds: float | None = None
        # for the out-of-memory report (docs/pytorch.md#out-of-memory): the batch size of the
        # iteration in progress (read from the batch wrap() yields, or the model's forward's
        # first argument), the window's, and the always-on peaks' (step, batch size,
        # allocated bytes) at their last readings
        self._batch_size: int | None = None
        self._window_batch_size: int | None = None
        self._wrapping = False
        self._memory_history: collections.deque[tuple[int, int | None, int]] = \
            collections.deque(maxlen=64)
        # the host probe: per probed step (host ms, data ms, start event, end event)
        self._host_probe: list[tuple[float, float | None, Any, Any]] = []
        self._probe_plan = range(0)  # the iterations to probe (set at start())
        self._probe_steps: set[int] = set()  # the iterations that started on an idle GPU
        self._probe_start: Any = None  # the event after the synchronize that began one
        self.oom_report_path: str | None = None  # where the out-of-memory report went

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> GpuProfiler:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close_after(exc)  # returns None: the error, if any, propagates unchanged

    def close_after(self, exc: BaseException | None) -> None:
        """:meth:`close` after ``exc`` ended the loop (None: it ended normally). A CUDA
        out-of-memory error first gets its report, written into the run before the error
        propagates (docs/pytorch.md#out-of-memory); ``exc`` itself is never changed, and a
        failure of the report is one warning. Framework callbacks without a ``with`` block
        call this from their exception hook."""
        captured = None
        if exc is not None and torch_oom.is_out_of_memory(exc):
            captured = self._oom_capture()
        self.close()
        if exc is not None and captured is not None:
            self._oom_report(exc, captured)

    def _oom_capture(self) -> dict[str, Any] | None:
        """At the failure, before close() lets anything go: the allocator, the model's and
        optimizer's tensors (reading only)."""
        if self._torch is None:
            return None
        try:
            return torch_oom.capture(self._torch, self.model, self.optimizer,
                                     self._device if self.cuda else None)
        except Exception as e:
            warnings.warn(f"tb_gpuprof: the out-of-memory report failed, the error propagates "
                          f"unchanged: {e!r}", GpuProfWarning, stacklevel=3)
            return None

    def _oom_report(self, exc: BaseException, captured: dict[str, Any]) -> None:
        """Build the report (analysis/oom.py), write it into the run, warn its summary."""
        try:
            from .analysis import oom
            from .store.writer import save_oom_report

            device = f"cuda:{self._device}" if self.cuda else None
            report = oom.oom_report(
                error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
                message=str(exc), step=self.iteration, device=device,
                allocator=captured["allocator"], tensors=captured["tensors"],
                model=captured["model"], batch_size=self._batch_size,
                window=self._oom_window(device),
                history=[{"step": s, "batch_size": b, "allocated_bytes": a}
                         for s, b, a in self._memory_history],
                autocast=self._autocast)
            self.oom_report_path = save_oom_report(self.run_dir, report, rank=self.rank)
            warnings.warn(f"{oom.summary(report)} Report: {self.oom_report_path}",
                          GpuProfWarning, stacklevel=3)
        except Exception as e:
            warnings.warn(f"tb_gpuprof: the out-of-memory report failed, the error propagates "
                          f"unchanged: {e!r}", GpuProfWarning, stacklevel=3)

    def _oom_window(self, device: str | None) -> dict[str, Any] | None:
        """The window's peak decomposition on the failing device (on the CPU, the CPU's)."""
        if self.report is None:
            return None
        for d in (self.report.get("memory") or {}).get("devices") or ():
            if d.get("device") == (device or "cpu") and d.get("peak_parts"):
                return {"peak_parts": d["peak_parts"], "batch_size": self._window_batch_size,
                        "step": (d.get("peak") or {}).get("step")}
        return None

    def start(self) -> GpuProfiler:
        """Begin iteration 0 (``with GpuProfiler(...)`` calls this)."""
        if self._started:
            return self
        self._started = True
        try:
            self._start()
            self._dead = False
        except Exception as e:
            self._fail("tb_gpuprof", e)
        return self

    def _start(self) -> None:
        self._torch = torch = importlib.import_module("torch")
        try:
            cuda = bool(torch.cuda.is_available())
        except Exception:
            cuda = False
        self.cuda = cuda
        self._device = torch.cuda.current_device() if cuda else None
        self.distributed = _torch_env.distributed_info(torch)
        rank = self.distributed["rank"]
        if rank > 0:
            # Each rank > 0 is its own sub-run: TensorBoard shows its scalars as their own
            # curves (ranks sharing one run would write the same tags at the same steps), and
            # the Python loader follows every rank live (it stops reading a run's older event
            # files once a newer one appears). See docs/distributed.md.
            self.run_dir = layout.rank_run_dir(self.logdir, rank)
        # decided once, here: the events file and the stored trace take it as a parameter
        self.rank = rank if self.distributed["world_size"] > 1 else None
        w = self._want
        self._on = {"scalars": bool(w["scalars"]), "cuda_timing": cuda,
                    "memory": cuda and bool(w["memory"]), "nvtx": cuda and bool(w["nvtx"]),
                    "cuda_profiler_api": cuda and bool(w["cuda_profiler_api"]),
                    "window": self.iter_start is not None,
                    "model_hooks": self.model is not None and bool(w["model_hooks"]),
                    "memory_parts": self.record_memory and self.iter_start is not None and (
                        cuda or self.model is not None or self.optimizer is not None),
                    "nvml": cuda if w["nvml"] is None else bool(w["nvml"]),
                    "host_probe": self.iter_start is not None}
        self._probe_plan = self._probe_iterations()
        self._guard("event writer", self._open_writer)
        per_rank = self.distributed["world_size"] > 1 and self._device is not None
        # under torch.distributed every rank samples its own GPU only
        self._guard("nvml", self._start_nvml, [self._device] if per_rank else None, when="nvml")
        self._guard("model_hooks", self._install_model_hooks, when="model_hooks")
        self._start_flush_thread()
        self._begin_iteration(time.perf_counter())

    def _install_model_hooks(self) -> None:
        def pre_hook(module: Any, args: Any, kwargs: Any) -> None:
            try:
                self.batch_ready()
                if not self._wrapping:  # HF models take their batch as keywords (input_ids=)
                    self._batch_size = torch_oom.batch_size_of(args) if args else \
                        torch_oom.batch_size_of_keywords(kwargs)
                if self._window is not None and self._autocast is None:
                    self._autocast = _torch_env.autocast_state(self._torch)
            except Exception as e:  # a hook must never raise into the model
                self._fail("model_hooks", e)

        self._hooks.append(self.model.register_forward_pre_hook(pre_hook, with_kwargs=True))

    def close(self) -> None:
        """End the last iteration's bookkeeping, finish the window's analysis, flush."""
        if not self._started or self._closed:
            return
        self._closed = True
        if (self._window is not None and self._recording and self.iter_start is not None
                and self.iteration > self.iter_start):
            warnings.warn(f"tb_gpuprof: the loop ended at iteration {self.iteration}, inside "
                          f"the window [{self.iter_start}, {self.iter_stop}); the report covers "
                          "the iterations that ran", GpuProfWarning, stacklevel=2)
            self._guard("window", self._stop_window, self.iteration)
        elif self._on.get("window") and self._analysis is None:
            if self._window is not None:
                self._abort_window("")
            warnings.warn(f"tb_gpuprof: the loop ended at iteration {self.iteration}, before "
                          f"the window [{self.iter_start}, {self.iter_stop}); no report",
                          GpuProfWarning, stacklevel=2)
        if self._nvtx_open:
            self._guard("nvtx", self._torch.cuda.nvtx.range_pop, when="nvtx")
        if self._verifier is not None:  # the loop ended mid-verification: undo, store so far
            self._verifier.stop()
            self._guard("verify", self._store_verification)
        for h in self._hooks:
            h.remove()
        self._cupti_hold.release(force=True)
        self._harvest(wait=True)
        self.wait()
        self._stop_flush_thread()
        self._flush_scalars()
        self._stop_nvml()
        self._guard("run summary", self._write_summary)
        self._close_writer()

    # -- per iteration -----------------------------------------------------------------------

    def batch_ready(self) -> None:
        """The current iteration's batch is in hand: time since the last :meth:`step` is data
        wait. Called by :meth:`wrap` and the ``model`` forward hook; the first call counts."""
        if self._t_ready is not None or self._dead or self._closed:
            return
        self._t_ready = time.perf_counter()
        if self._on.get("cuda_timing"):
            try:
                ev = self._torch.cuda.Event(enable_timing=True)
                ev.record()
                self._ev_ready = ev
            except Exception as e:
                self._fail("cuda_timing", e)

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` just spent (e.g. a validation run) out of the current iteration's
        wall time and data wait."""
        self._t_last += seconds

    def wrap(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``loader``, marking each batch's arrival (exact data-wait timing)."""
        it = iter(loader)
        while True:
            if self._on.get("nvtx"):
                self._guard("nvtx", self._torch.cuda.nvtx.range_push, "data", when="nvtx")
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                if self._on.get("nvtx"):
                    self._guard("nvtx", self._torch.cuda.nvtx.range_pop, when="nvtx")
            self._wrapping = True
            try:
                self._batch_size = torch_oom.batch_size_of(batch)
            except Exception:
                self._batch_size = None
            self.batch_ready()
            yield batch

    def step(self) -> None:
        """End the current iteration. Cheap: no device synchronization, no file I/O."""
        if self._dead or self._closed:
            if self._cupti_hold.held:  # a window that stopped before a failure of ours
                self._cupti_hold.step()
            return
        try:
            self._step()
        except Exception as e:  # a bug of ours: stop measuring, never stop training
            self._fail("tb_gpuprof", e)
            self._dead = True

    def _step(self) -> None:
        t = time.perf_counter()
        if self._cupti_hold.held:  # before this step's own window work: a stop starts it
            self._cupti_hold.step()
        i = self.iteration
        on = self._on
        data_ms = (self._t_ready - self._t_last) * 1e3 if self._t_ready is not None else None
        rec = _Iter(i, (t - self._t_last) * 1e3, data_ms, time.time())
        torch = self._torch
        if on["cuda_timing"]:
            try:
                prev = self._ev_last
                # query(), never a sync: is the GPU still on the previous iteration?
                rec.ahead = prev is not None and not prev.query()
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                rec.ev_start = self._ev_ready if self._ev_ready is not None else prev
                rec.ev_prev = prev
                rec.ev_end = self._ev_last = ev
            except Exception as e:
                self._fail("cuda_timing", e)
        if on["memory"] and self._memory_due(t):
            try:
                stats = torch.cuda.memory.memory_stats_as_nested_dict(self._device)
                allocated_peak = stats["allocated_bytes"]["all"]["peak"]
                rec.mem = (allocated_peak / 2**20, stats["reserved_bytes"]["all"]["peak"] / 2**20)
                self._memory_history.append((i, self._batch_size, allocated_peak))
                torch.cuda.reset_peak_memory_stats(self._device)
            except Exception as e:
                self._fail("memory", e)
        if on["nvtx"] and self._nvtx_open:
            self._guard("nvtx", torch.cuda.nvtx.range_pop, when="nvtx")
            self._nvtx_open = False
        self._pending.append(rec)
        self._harvest()
        self._wall_ms.append(rec.wall_ms)
        if len(self._wall_ms) > 100_000:  # bound memory on endless runs
            del self._wall_ms[:50_000]
        moved = False
        if self._window is not None:
            if self._recording and self._autocast is None:
                self._autocast = self._guard("autocast probe", _torch_env.autocast_state, torch)
            if self._recording and i + 1 >= (self.iter_stop or 0):
                self._guard("window", self._stop_window, i + 1, when="window")
            else:
                try:
                    self._window.step()
                    if not self._recording:  # the warm-up iteration is over
                        self._begin_recording()
                except Exception as e:
                    self._abort_window(e)
            moved = True
        elif on["window"] and self._analysis is None and i + 1 == self._window_opens_at():
            self._guard("window", self._open_window, i + 1, when="window")
            moved = True
        if self._verify_state != "off" and self._verify_state != "done":
            moved = self._verify_step(rec.wall_ms) or moved
        if i in self._probe_steps:
            self._host_probe.append((rec.wall_ms, rec.data_ms, self._probe_start, rec.ev_end))
        if i + 1 in self._probe_plan and on["host_probe"]:
            moved = bool(self._guard("host_probe", self._begin_probe, i + 1,
                                     when="host_probe")) or moved
        self.iteration = i + 1
        # The hook's own window start/stop (can take seconds) is not charged to an iteration.
        self._begin_iteration(time.perf_counter() if moved else t)

    def _begin_iteration(self, t: float) -> None:
        self._t_last = t
        self._t_ready = None
        self._ev_ready = None
        i = self.iteration
        if i == 0 and self._on.get("cuda_timing"):
            try:
                self._ev_last = self._torch.cuda.Event(enable_timing=True)
                self._ev_last.record()
            except Exception as e:
                self._fail("cuda_timing", e)
        if (i == 0 and self._on.get("window") and self._window_opens_at() == 0
                and self._window is None):
            self._guard("window", self._open_window, 0, when="window")
            self._t_last = time.perf_counter()
        if self._on.get("nvtx"):
            self._guard("nvtx", self._torch.cuda.nvtx.range_push, f"iteration {i}", when="nvtx")
            self._nvtx_open = self._on.get("nvtx", False)

    def _harvest(self, wait: bool = False) -> None:
        """Move iterations whose end event completed to the write queue (query(), no sync)."""
        pending = self._pending
        while pending:
            rec = pending[0]
            gpu_ms = gpu_step_ms = None
            if rec.ev_end is not None and self._on.get("cuda_timing"):
                try:
                    if not rec.ev_end.query():
                        if not wait and len(pending) < MAX_PENDING:
                            return
                        if wait:
                            rec.ev_end.synchronize()  # close(): the loop is over
                    if rec.ev_end.query():
                        if rec.ev_start is not None:
                            gpu_ms = rec.ev_start.elapsed_time(rec.ev_end)
                        if rec.ev_prev is not None:
                            gpu_step_ms = rec.ev_prev.elapsed_time(rec.ev_end)
                except Exception as e:
                    self._fail("cuda_timing", e)
            pending.popleft()
            period, from_gpu = true_period(rec.wall_ms, gpu_step_ms, rec.ahead)
            self._periods.append((rec.step, period, from_gpu))
            if not self._on.get("scalars"):
                continue
            values = {layout.ITERATION_TIME_TAG: period,
                      layout.HOST_STEP_TIME_TAG: rec.wall_ms}
            if gpu_step_ms is not None:
                values[layout.GPU_STEP_TIME_TAG] = gpu_step_ms
            if gpu_ms is not None:
                values[layout.GPU_TIME_TAG] = gpu_ms
            if rec.data_ms is not None:
                values[layout.DATA_WAIT_TAG] = rec.data_ms
            if rec.mem is not None:
                values[layout.MEMORY_ALLOCATED_PEAK_TAG] = rec.mem[0]
                values[layout.MEMORY_RESERVED_PEAK_TAG] = rec.mem[1]
            self._out.append((rec.step, rec.wall_time, values))

    # -- the host probe --------------------------------------------------------------------

    def _probe_iterations(self) -> range:
        """The (up to) HOST_PROBE_STEPS iterations before the window's warm-up: only as many
        as leave UNPROFILED_MIN iterations after iteration 0 (start-up) for the un-profiled
        time; none without a window."""
        if self.iter_start is None:
            return range(0)
        opens = self._window_opens_at()
        return range(opens - max(min(HOST_PROBE_STEPS, opens - 1 - UNPROFILED_MIN), 0), opens)

    def _begin_probe(self, step: int) -> bool:
        """Let the GPU finish all queued work, so iteration ``step``'s launches find it idle;
        its host time from here to its step() is then the host's own dispatch time (plus its
        waits at the loop's syncs), without the profiler."""
        self._probe_start = None
        if self.cuda:  # without CUDA nothing is queued: the step's host time is all there is
            torch = self._torch
            torch.cuda.synchronize()
            self._probe_start = torch.cuda.Event(enable_timing=True)
            self._probe_start.record()
        self._probe_steps.add(step)
        return True

    def _probe_summary(self) -> dict[str, Any] | None:
        """``env["unprofiled"]["host_probe"]``: the probed steps' median host time and the
        GPU's time for the same work (its events, complete by the window's stop)."""
        rows = self._host_probe
        if not rows:
            return None
        gpu = []
        for _, _, start, end in rows:
            if start is not None and end is not None and end.query():
                gpu.append(start.elapsed_time(end))
        data = [d for _, d, _, _ in rows if d is not None]
        host = [h for h, _, _, _ in rows]
        return {"host_ms": round(statistics.median(host), 4),
                "gpu_ms": round(statistics.median(gpu), 4) if gpu else None,
                "data_ms": round(statistics.median(data), 4) if data else None,
                "steps": len(rows), "host_ms_each": [round(h, 4) for h in host]}

    # -- the window --------------------------------------------------------------------------

    def _window_opens_at(self) -> int:
        """The profiler opens one iteration early, in warm-up: CUPTI's start-up cost lands in
        an iteration that is not recorded (on the H200 it made the first recorded ResNet-50
        iteration 2.4x slower than the others)."""
        return max((self.iter_start or 0) - 1, 0)

    def _open_window(self, step: int) -> None:
        first = self.iter_start or 0
        win = TorchProfilerWindow(self._torch, self._cupti_hold, self, cuda=self.cuda,
                                  record_from=first)
        self._recording = False
        self._plan_cupti_teardown()
        win.teardown = self._teardown_cupti
        recording = win.start(step)
        self._window = win
        if recording:
            self._begin_recording()

    def _plan_cupti_teardown(self) -> None:
        """Decide the next window's CUPTI teardown (TorchProfilerWindow.plan_teardown); a
        method of the hook's own so that a test can force it on CPU, where it is off."""
        self._teardown_cupti = TorchProfilerWindow.plan_teardown(
            self._torch, self._cupti_hold, cuda=self.cuda, warned=self._warned, stacklevel=4)

    def _begin_recording(self) -> None:
        torch = self._torch
        self._recording = True
        if self.model is None and not _torch_env.dynamo_compiled_anything():
            self._install_probe()
        self._window_t0 = time.time()
        if self._on.get("cuda_profiler_api"):
            self._guard("cuda_profiler_api", torch.cuda.profiler.start, when="cuda_profiler_api")

    def _install_probe(self) -> None:
        """Without ``model``: a global module pre-hook for the window only, which reads the
        autocast state and the first convolution's weight layout from inside the forward."""
        torch = self._torch
        conv = torch.nn.modules.conv._ConvNd
        convs: list[Any] = []
        self._probe_convs = convs

        def probe(module: Any, args: Any) -> None:
            try:
                if self._autocast is None:
                    self._autocast = _torch_env.autocast_state(torch)
                if len(convs) < 16 and isinstance(module, conv):
                    convs.append(module)
            except Exception:
                pass

        self._probe = torch.nn.modules.module.register_module_forward_pre_hook(probe)

    def _end_recording(self) -> None:
        if self._recording and self._on.get("cuda_profiler_api"):
            self._guard("cuda_profiler_api", self._torch.cuda.profiler.stop,
                        when="cuda_profiler_api")
        self._recording = False
        probe = getattr(self, "_probe", None)
        if probe is not None:
            probe.remove()
            self._probe = None

    def _stop_window(self, stop: int) -> None:
        win, self._window = self._window, None
        if win is None:
            return
        torch = self._torch
        self._end_recording()
        win.stop()
        window = (self._window_t0, time.time())
        convs = getattr(self, "_probe_convs", None) if self.model is None else None
        env = _torch_env.record_env(torch, model=self.model, convs=convs,
                                    autocast=self._autocast, device=self._device)
        self.env = env
        self._window_batch_size = self._batch_size
        tensors = self._guard("memory_parts", torch_memory.record_tensors, torch, self.model,
                              self.optimizer, self._device, when="memory_parts")
        raw = self._export_window(win, stop - 1)
        self._analysis = threading.Thread(target=self._analyze, name="tb_gpuprof-window",
                                          args=(raw, stop - 1, env, window, tensors))
        self._analysis.start()

    def _export_window(self, win: TorchProfilerWindow, step: int) -> str:
        """The window's trace file, exported here on the training thread right after the
        profiler's stop, and the profiler's results freed (:meth:`TorchProfilerWindow.export`).
        torch holds the GIL for both, so from the analysis thread they stalled training just
        as long, at a random iteration after the window; here they land in the window's
        last iteration, as the stop does."""
        t0 = time.perf_counter()
        tmp = tempfile.mkdtemp(prefix="tb_gpuprof_")
        raw = os.path.join(tmp, f"window_{self.iter_start}_{step + 1}.pt.trace.json")
        try:
            win.export(raw)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.export_seconds = time.perf_counter() - t0
        return raw

    def _abort_window(self, exc: BaseException | str) -> None:
        win, self._window = self._window, None
        try:
            self._end_recording()
            if win is not None:
                win.abort()
        except Exception:  # giving the window up must not fail training either
            pass
        if exc:
            self._fail("window", exc)

    def _analyze(self, raw: str, step: int, env: dict[str, Any],
                 window: tuple[float, float], tensors: dict[str, Any] | None) -> None:
        """Analysis thread: NVML telemetry, then the rest in a low-priority child process
        (HookCore); the exported trace's temporary folder goes afterwards."""
        t0 = time.perf_counter()
        try:
            env["unprofiled"] = self._unprofiled(self._not_unprofiled, self._window_opens_at(),
                                                 lambda: self._closed)
            probe = self._guard("host_probe", self._probe_summary, when="host_probe")
            if probe and env["unprofiled"]:
                env["unprofiled"]["host_probe"] = probe
            self._analyze_in_child(
                raw, env, *window, step, gpu_expected=self.cuda,
                no_gpu_warning="tb_gpuprof: the window's trace holds no CUDA activity: CUPTI is "
                "probably in use by another tool (Nsight Systems/Compute, another profiler, "
                "JAX); the report covers CPU operators only",
                stored_name=os.path.basename(raw) + ".gz", gzip_raw=True,
                memory_record=tensors)
        except Exception as e:
            self._fail("window", f"analysis failed: {e}")
        finally:
            shutil.rmtree(os.path.dirname(raw), ignore_errors=True)
            self.analysis_seconds = time.perf_counter() - t0

    # -- verification (verify=) ------------------------------------------------------------

    def _verify_step(self, iteration_ms: float) -> bool:
        """Drive the verification one iteration; True when it switched something (its own
        time is then not charged to the next iteration)."""
        if self._verify_state == "waiting":
            if self.report is None or self._window is not None or (
                    self._analysis is not None and self._analysis.is_alive()):
                return False
            self._verifier = self._guard("verify", self._make_verifier)
            self._verify_state = "running" if self._verifier is not None else "done"
            return False
        return self._verify_drive(iteration_ms)

    def _make_verifier(self) -> Any:
        from .capture import switches
        from .capture.verification import LoopVerifier, counted_after, plan_fixes, switch_for

        assert self.report is not None
        torch, model, optimizer = self._torch, self.model, self.optimizer
        report = self.report
        plan = plan_fixes(report, self._verify, self._verify_compile,
                          lambda fix_id: switch_for(fix_id, model, optimizer),
                          lambda fix_id: counted_after(report, fix_id))
        return LoopVerifier(
            plan, sync=torch.cuda.synchronize if self.cuda else (lambda: None),
            snapshot=lambda: switches.snapshot(model, optimizer),
            requested=[p.fix_id for p in plan[1:]], max_seconds=self._verify_max_s,
            warn=lambda msg: warnings.warn(msg, GpuProfWarning, stacklevel=4))

    def _verification_step(self) -> int | None:
        return None if self.iter_stop is None else self.iter_stop - 1

    def _not_unprofiled(self, step: int) -> bool:
        """Iterations whose period says nothing about the un-profiled loop: 0 (start-up), the
        host probe's (started on an idle GPU), the profiler's warm-up, the window, and the one
        after it (CUPTI's teardown runs there)."""
        return (step == 0 or self._window_opens_at() <= step <= (self.iter_stop or 0)
                or step in self._probe_steps)

    # -- run summary -------------------------------------------------------------------------

    def _write_summary(self) -> None:
        """Rank 0 records what the run was (other ranks' scalars sit in their own files)."""
        if self._torch is None:
            return
        dist = self.distributed  # as at start(): the process group may be gone by now
        if dist["rank"] != 0:
            return
        periods = [ms for step, ms, _ in self._periods]
        self._write_run_summary(
            periods[1:] or periods,  # iteration 0 includes warm-up
            (self.iter_stop - 1) if self.report is not None and self.iter_stop is not None
            else None,
            {"distributed": dist})


def close_or_warn(prof: GpuProfiler | None, exc: BaseException | None = None) -> None:
    """Close a framework adapter's profiler (after ``exc``, which ended training: an
    out-of-memory error gets its report); a failure is one warning (training is over)."""
    if prof is None:
        return
    try:
        prof.close_after(exc)
    except Exception as e:
        warnings.warn(f"tb_gpuprof: closing the profiler failed: {e}", GpuProfWarning,
                      stacklevel=3)


__all__ = ["GpuProfWarning", "GpuProfiler", "close_or_warn"]
