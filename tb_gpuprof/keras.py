"""Keras 3 callback: always-on iteration timing plus one profiled window, on the TensorFlow,
JAX and torch backends.

    from tb_gpuprof.keras import GpuProfCallback
    model.fit(ds, epochs=3, callbacks=[GpuProfCallback("runs/cnn", iter_start=20, iter_stop=40)])

Always on: per-step wall time (and device memory peaks on a GPU) as scalars, written off the
training thread; NVML telemetry. In [iter_start, iter_stop): the backend's own profiler
(``tf.profiler`` / ``jax.profiler`` -> XPlane, ``torch.profiler`` -> Kineto JSON) with one
step marker per Keras execution, then analysis off the training thread into a report stored in
the run with the raw profile. Nothing here may break ``fit``: an internal error becomes one
warning and switches off the feature that failed. User guide: docs/keras.md.

Timing adds no synchronization: ``async_safe = True`` keeps Keras 3's asynchronous batch-end
dispatch (JAX, torch), where ``on_train_batch_end`` runs on a Keras worker thread after Keras
has turned the step's logs into numbers, i.e. once the step's results exist. The batch argument
Keras passes counts steps; one call covers ``steps_per_execution`` of them.

This module is named like the framework; ``import keras`` below is the real package.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import keras

from .capture import keras_env as _keras_env
from .capture import torch_env as _torch_env
from .capture.hookcore import GpuProfWarning, HookCore
from .capture.torch_window import TorchProfilerWindow
from .capture.verify_options import DEFAULT_MAX_SECONDS as DEFAULT_VERIFY_MAX_S
from .capture.verify_options import verify_options
from .store import layout

STEP_MARKER = "train"  # name of the per-execution step range in the window's trace
DRAIN_TIMEOUT_S = 120.0  # longest wait for an in-flight step at the window's edges


class _Exec:
    """One Keras execution (``steps_per_execution`` steps) between batch begin and end."""

    __slots__ = ("batch", "boundary", "exec_ms", "g0", "prev", "t_end", "t_ready",
                 "verifying")

    def __init__(self, g0: int, batch: int, boundary: bool, prev: _Exec | None) -> None:
        self.g0 = g0  # global step of its first batch, counted from the first fit
        self.batch = batch  # Keras' batch index within the epoch
        self.boundary = boundary  # first after fit/epoch start or the window's start/stop
        self.prev = prev
        self.t_ready = 0.0
        self.t_end: float | None = None
        self.exec_ms: float | None = None  # the whole execution's time, once it ended
        self.verifying = False  # ran while verify= was measuring (in the state it had set)


class GpuProfCallback(keras.callbacks.Callback, HookCore):
    """Profile ``model.fit``: ``GpuProfCallback(logdir, iter_start, iter_stop, **options)``.

    Args:
        logdir: the run directory (one TensorBoard run); created if missing.
        iter_start: first training step of the profile window, counted from the first batch of
            the first ``fit`` across epochs. ``None``: no window, always-on measurements only.
        iter_stop: step the window stops before (exclusive); default ``iter_start + 1``. With
            ``steps_per_execution=N`` the window starts and stops at execution boundaries.
        nvml: sample GPU telemetry through NVML (``None``: on when the backend sees a GPU).
        nvml_interval_s: NVML sampling period (``None``: the sampler's default, 0.5 s).
        with_stack: record Python frames in the window (TF/JAX python tracer, torch stacks).
        record_shapes, with_flops: torch backend only, as ``torch.profiler``'s options.
        record_memory: torch backend only: the allocator's events in the window
            (``torch.profiler``'s ``profile_memory``; the report's ``memory`` section).
        key: name of a range marking one iteration in the window's trace (DLProf's
            ``--key_node``); default: the callback's own step markers.
        memory: record device memory peaks on a GPU, read at the end of an execution at most
            every ``memory_interval_s`` (and at every execution of the window); TF and torch
            reset the peak at each reading, so it covers the executions since; JAX has no
            reset, so its figure is the peak since start.
        memory_interval_s: the least time between two readings (default 0.1 s; 0: every
            execution). A torch reading takes tens of µs of the training thread.
        scalars: write the always-on scalars (``gpuprof/iteration_time_ms`` ...).
        flush_secs: how often the background thread writes queued scalars.
        verify: after the window's report, measure its fixes inside this ``fit`` where the
            backend can switch them in place (docs/verify.md): ``True`` for the report's top
            fixes, or a list of fix ids. Only ``tf32`` on the torch backend can be switched;
            the others are reported not verifiable, with the reason. One iteration of the
            verification is one execution (``steps_per_execution`` steps). Default ``False``.
        verify_max_s: the most seconds the whole verification may take (default 600).
    """

    async_safe = True  # Keras 3: our batch-end hook may run on Keras' worker threads
    _supports_tf_logs = True  # tf.keras (Keras 2): don't convert logs to numpy for us

    def __init__(self, logdir: str | os.PathLike[str], iter_start: int | None = None,
                 iter_stop: int | None = None, *, nvml: bool | None = None,
                 nvml_interval_s: float | None = None, with_stack: bool = False,
                 record_shapes: bool = True, with_flops: bool = True, key: str | None = None,
                 memory: bool = True, memory_interval_s: float = 0.1, scalars: bool = True,
                 flush_secs: float = 1.0, record_memory: bool = True,
                 verify: bool | Sequence[str] = False,
                 verify_max_s: float = DEFAULT_VERIFY_MAX_S) -> None:
        super().__init__()
        if not isinstance(record_memory, bool):
            raise TypeError(f"record_memory must be True or False, got {record_memory!r}")
        # torch.compile is not switched in a fit (the train function is built once): no
        # verify_compile; plan_fixes then leaves the reason to _switch_for
        self._verify, _, self._verify_max_s = verify_options(verify, False, verify_max_s)
        self.record_memory = record_memory
        # iteration: global step of the next execution
        self._init_core(logdir, iter_start, iter_stop, key=key, nvml_interval_s=nvml_interval_s,
                        with_stack=with_stack, record_shapes=record_shapes,
                        with_flops=with_flops, flush_secs=flush_secs,
                        memory_interval_s=memory_interval_s)
        self._want = {"nvml": nvml, "memory": memory, "scalars": scalars}
        self._dead = True  # until on_train_begin's setup succeeds, and after an internal bug
        self._set_up = False
        self.backend: str | None = None
        self.gpu = False
        self._fw: Any = None
        self._mem_probe: Any = None
        self._lock = threading.Condition()
        self._spe = 1
        self._boundary = True
        self._last: _Exec | None = None
        self._pending: dict[int, _Exec] = {}  # batch index -> execution, this epoch
        self._waiting: _Exec | None = None
        self._train_tid = 0
        self.batch_end_async: bool | None = None  # what Keras did, once seen
        self._window: _Window | None = None
        self._warm: _Window | None = None  # torch backend: profiler warming up CUPTI
        self._warm_step: int | None = None  # the execution that warmed it up
        # torch backend: TEARDOWN_CUPTI=1 kept from the window's stop until Kineto tore down
        self._cupti_hold = _torch_env.CuptiTeardownHold()
        self._train_ended = False
        self._window_done = False
        self._window_mem: list[float] = []
        self.report_step: int | None = None  # the step the report is stored at
        self._verify_state = "waiting" if self._verify else "off"  # -> running -> done

    # -- robustness ------------------------------------------------------------------------

    def _bug(self, e: BaseException) -> None:
        """A bug of ours: stop measuring, never stop training."""
        self._fail("tb_gpuprof", e)
        self._dead = True

    # -- fit lifecycle -----------------------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        try:
            self._train_ended = False
            self._train_tid = threading.get_ident()
            self._boundary = True
            self._last = None
            if not self._set_up:
                self._set_up = True
                self._setup()
                self._dead = False
            if not self._dead:
                self._open()
            self._spe = max(int(getattr(self._keras_model(), "steps_per_execution", 1) or 1), 1)
        except Exception as e:
            self._bug(e)

    def _keras_model(self) -> Any:
        """The model without Keras 3's ``model`` property, which syncs the JAX state; Keras 2
        keeps it in a plain ``model`` attribute."""
        model = self.__dict__.get("_model")
        return model if model is not None else self.__dict__.get("model")

    def _setup(self) -> None:
        self.backend = _keras_env.keras_backend(keras)
        self._fw = fw = _keras_env.framework_module(self.backend)
        self.gpu = _keras_env.gpu_present(self.backend, fw)
        dist = _keras_env.distributed_info()
        self.rank = dist["rank"] if dist["world_size"] > 1 else None  # decided once, here
        w = self._want
        self._on = {"scalars": bool(w["scalars"]), "window": self.iter_start is not None,
                    "memory": self.gpu and bool(w["memory"]),
                    "nvml": self.gpu if w["nvml"] is None else bool(w["nvml"])}
        if self._on["memory"]:
            self._mem_probe = self._guard("memory", _keras_env.memory_probe, self.backend, fw)

    def _open(self) -> None:
        """Per fit: a new events file, NVML sampling and the scalar thread."""
        if self._writer is None:
            self._guard("event writer", self._open_writer)
        if self._sampler is None and self._on.get("nvml"):
            self._guard("nvml", self._start_nvml)
        self._start_flush_thread()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._boundary = True
        self._pending.clear()  # Keras flushed the last epoch's batch ends before epoch end

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._window is not None and not self._dead:
            # Validation and epoch-end work would be counted into the last step; cut here.
            warnings.warn(f"tb_gpuprof: the epoch ended at step {self.iteration}, inside the "
                          f"window [{self.iter_start}, {self.iter_stop}); the report covers "
                          "the steps that ran", GpuProfWarning, stacklevel=2)
            self._guard("window", self._stop_window)

    def on_train_end(self, logs: Any = None) -> None:
        if not self._set_up:
            return
        try:
            self._train_ended = True
            if self._window is not None:
                self._guard("window", self._stop_window)
            self._abort_warm()
            self.wait()
            if self._verifier is not None:  # fit ended mid-verification: undo, store so far
                self._verifier.stop()
                self._guard("verify", self._store_verification)
                self._verify_state = "done"
            elif self._verify_state == "waiting" and self.report is not None:
                # fixes none of which can be switched are settled now; others wait for a fit
                self._guard("verify", self._start_verification, True)
            self._guard("run summary", self._write_summary)
            self.close()
        except Exception as e:
            self._bug(e)

    def close(self) -> None:
        """Flush the scalars, stop NVML, close the run's events file (``fit`` does this at
        its end; another ``fit`` with the same callback continues in a new events file)."""
        self._cupti_hold.release(force=True)
        self._stop_flush_thread()
        self._flush_scalars()
        self._stop_nvml()
        self._close_writer()

    @property
    def iteration_times_ms(self) -> list[float]:
        """The always-on per-step times measured so far (ms, in step order per thread)."""
        return list(self._wall_ms)

    # -- per execution -----------------------------------------------------------------------

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._dead:
            return
        try:
            if self._cupti_hold.held:
                self._cupti_hold.step()
            g0 = self.iteration
            boundary = self._boundary
            if self._window is not None:
                self._window.unmark()
                if g0 >= (self.iter_stop or 0):
                    self._guard("window", self._stop_window)
                    boundary = True
            elif (self._on.get("window") and not self._window_done
                  and (self.iter_start or 0) <= g0 < (self.iter_stop or 0)):
                self._guard("window", self._start_window)
                boundary = True
            elif self._warms_up_before(g0):
                self._guard("window", self._warm_up, g0)
                boundary = True
            verifying = False
            if self._verify_state in ("waiting", "running") and self._window is None:
                boundary = self._verify_begin() or boundary
                verifying = self._verify_state == "running"
            if self._window is not None:
                self._window.mark(g0)
            rec = _Exec(g0, batch, boundary, self._last)
            rec.verifying = verifying
            self._pending[batch] = rec
            self._last = rec
            self._boundary = False
            self.iteration = g0 + self._spe
            rec.t_ready = time.perf_counter()  # after our own window work, which is not timed
        except Exception as e:
            self._bug(e)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        t = time.perf_counter()  # Keras made the step's logs numbers: its results exist
        if self._dead:
            return
        try:
            with self._lock:
                rec = self._pending.pop(batch - self._spe + 1, None)
                if rec is None:  # a shorter last execution of the epoch
                    rec = self._pending.pop(max((b for b in self._pending if b <= batch),
                                                default=-1), None)
                if rec is None:
                    return
                rec.t_end = t
                prev, rec.prev = rec.prev, None  # no chain through every execution
                base = prev.t_end if prev is not None else None
                if rec.boundary:
                    base = rec.t_ready if base is None else max(base, rec.t_ready)
                if base is not None and t > base:  # before the notify: verify= reads it
                    rec.exec_ms = (t - base) * 1e3
                if self._waiting is rec:
                    self._lock.notify_all()
                if self.batch_end_async is None:
                    self.batch_end_async = threading.get_ident() != self._train_tid
            if base is None or t <= base:
                return  # async ends out of order: no honest figure for this one
            steps = max(batch - rec.batch + 1, 1)
            ms = (t - base) * 1e3 / steps
            self._wall_ms.append(ms)
            if len(self._wall_ms) > 100_000:  # bound memory on endless runs
                del self._wall_ms[:50_000]
            # Keras made the logs numbers before this call: the step's results exist, so
            # batch end to batch end is the true period (the host cannot have run ahead).
            self._periods.append((rec.g0, ms, False))
            values = {layout.ITERATION_TIME_TAG: ms}
            if self._mem_probe is not None and self._on.get("memory") and self._memory_due(t):
                try:
                    alloc, reserved = self._mem_probe()
                    values[layout.MEMORY_ALLOCATED_PEAK_TAG] = alloc
                    if reserved is not None:
                        values[layout.MEMORY_RESERVED_PEAK_TAG] = reserved
                    if self._window is not None:
                        self._window_mem.append(alloc)
                except Exception as e:
                    self._fail("memory", e)
            if self._on.get("scalars"):
                self._out.append((rec.g0, time.time(), values))
        except Exception as e:
            self._bug(e)

    def _wait_done(self, rec: _Exec | None) -> bool:
        """Wait until ``rec``'s batch end ran (async dispatch: its results exist); False when
        it did not within :data:`DRAIN_TIMEOUT_S`."""
        if rec is None:
            return True
        with self._lock:
            self._waiting = rec
            done = self._lock.wait_for(lambda: rec.t_end is not None, timeout=DRAIN_TIMEOUT_S)
            self._waiting = None
        return bool(done)

    # -- verification (verify=) ------------------------------------------------------------

    def _verify_begin(self) -> bool:
        """Training thread, at a batch begin: drive the verification with the execution that
        just ended, so that it switches between executions, never inside one. With Keras'
        async batch ends this waits for that execution's end (its results), at every
        execution while verifying only. True when the verifier may have switched something:
        this execution is then timed from its own batch begin."""
        if self._verify_state == "waiting":
            if self.report is None or self.report_step is None or (
                    self._analysis is not None and self._analysis.is_alive()):
                return False
            self._guard("verify", self._start_verification)
            return False
        prev = self._last
        if prev is None or not prev.verifying:  # the fit's first execution: nothing to feed
            return False
        if not self._wait_done(prev):
            self._fail("verify", f"no batch end for step {prev.g0} within "
                                 f"{DRAIN_TIMEOUT_S:.0f} s")
            if self._verifier is not None:
                self._verifier.stop()
                self._guard("verify", self._store_verification)
            self._verify_state = "done"
            return False
        if prev.exec_ms is None:  # no honest figure for it: the state is kept one more
            return False
        return self._verify_drive(prev.exec_ms)

    def _start_verification(self, settle_only: bool = False) -> None:
        """The verifier, from the window's report; when nothing can be switched in this fit,
        its section (every fix with its reason) is stored at once. ``settle_only``: only
        that (the fit is ending; a later fit may run the trials). A failure of ours leaves
        the verification done (off)."""
        self._verify_state = "done"
        verifier = self._make_verifier()
        if verifier.settle_if_nothing_to_try():
            self._verifier = verifier
            self._store_verification()
        elif settle_only:
            self._verify_state = "waiting"
        else:
            self._verifier, self._verify_state = verifier, "running"

    def _make_verifier(self) -> Any:
        from .capture.verification import LoopVerifier, counted_after, plan_fixes

        assert self.report is not None
        report = self.report
        plan = plan_fixes(report, self._verify, True, self._switch_for,
                          lambda fix_id: counted_after(report, fix_id))
        snapshot: Any = lambda: None  # noqa: E731
        sync: Any = lambda: None  # noqa: E731
        if self.backend == "torch":
            from .capture import switches

            snapshot = lambda: switches.snapshot(None, None)  # noqa: E731  backend flags
            if self.gpu:
                sync = self._fw.cuda.synchronize
        return LoopVerifier(
            plan, sync=sync, snapshot=snapshot, requested=[p.fix_id for p in plan[1:]],
            max_seconds=self._verify_max_s,
            warn=lambda msg: warnings.warn(msg, GpuProfWarning, stacklevel=4))

    def _switch_for(self, fix_id: str) -> tuple[Any | None, str | None]:
        """The in-place switch for ``fix_id`` on this backend, or why there is none."""
        return keras_switch_for(self.backend or "", fix_id)

    def _verification_step(self) -> int | None:
        return self.report_step

    # -- the window --------------------------------------------------------------------------

    def _warms_up_before(self, g0: int) -> bool:
        """The torch backend's profiler starts one execution before the window, in warm-up:
        CUPTI's start-up cost lands in an execution that is not recorded (as the PyTorch
        hook does). XLA's tracer (TF, JAX) has no warm-up phase."""
        first = self.iter_start or 0
        return (self.backend == "torch" and self._warm is None and not self._window_done
                and bool(self._on.get("window")) and g0 < first <= g0 + self._spe
                and g0 + self._spe < (self.iter_stop or 0))

    def _warm_up(self, g0: int) -> None:
        win = _Window.create(self.backend or "", self._fw, self)
        win.warm_up()
        self._warm, self._warm_step = win, g0

    def _abort_warm(self) -> None:
        """The fit ended before the warmed-up window began: stop the profiler, no report."""
        win, self._warm = self._warm, None
        if win is not None:
            try:
                win.abort()
            finally:
                win.cleanup()

    def _start_window(self) -> None:
        self._window_done = True  # one window per callback, whatever happens next
        # Async dispatch: let the steps before the window finish, so the trace holds the
        # window's device work only.
        self._wait_done(self._last)
        self._window_mem = []
        win, self._warm = self._warm, None
        if win is None:
            win = _Window.create(self.backend or "", self._fw, self)
        win.first_step = win.last_step = self.iteration
        win.start()
        self._window = win

    def _stop_window(self) -> None:
        win, self._window = self._window, None
        if win is None:
            return
        win.unmark()
        self._wait_done(self._last)  # the window's last step ran to the end on the device
        last_step = max(win.first_step, (self._last.g0 if self._last else 0) + self._spe - 1)
        win.last_step = last_step
        try:
            win.stop()
        except Exception as e:
            win.cleanup()
            raise RuntimeError(f"stopping the {self.backend} profiler failed: {e}") from e
        observed = {"steps_per_execution": self._spe,
                    "batch_end_dispatch": None if self.batch_end_async is None else
                    ("async" if self.batch_end_async else "sync")}
        if self._window_mem:
            observed["memory_peak_bytes"] = int(max(self._window_mem) * 2**20)
        env = _keras_env.record_env(keras, self.backend or "", self._fw, self._keras_model(),
                                  observed)
        self.env = env
        self._analysis = threading.Thread(target=self._analyze, name="tb_gpuprof-window",
                                          args=(win, last_step, env))
        self._analysis.start()

    def _analyze(self, win: _Window, step: int, env: dict[str, Any]) -> None:
        """Analysis thread: the profile's file (torch: exported here, it needs the profiler
        object), then storing and analysis in a low-priority child process (HookCore)."""
        try:
            raw = win.raw_trace()
            first = win.first_step
            warm = self._warm_step

            def skip(g0: int) -> bool:  # start-up, warm-up, window, the execution after it
                return g0 == 0 or g0 == warm or first <= g0 <= step + 1

            env["unprofiled"] = self._unprofiled(skip, first if warm is None else warm,
                                                 lambda: self._train_ended)
            self._analyze_in_child(
                raw, env, win.t0, win.t1, step, gpu_expected=self.gpu,
                no_gpu_warning="tb_gpuprof: the window's profile holds no GPU activity: CUPTI "
                "is probably in use by another tool (Nsight, another profiler); the report "
                "covers host work only", stored_name=win.stored_name(), gzip_raw=win.gzip_raw)
            if self.report is not None:
                self.report_step = step
        except Exception as e:
            self._fail("window", f"analysis failed: {e}")
        finally:
            win.cleanup()

    def _write_summary(self) -> None:
        self._write_run_summary([ms for _, ms, _ in self._periods], self.report_step, {
            "backend": self.backend,
            "steps_per_execution": self._spe,
            "batch_end_dispatch": None if self.batch_end_async is None else
            ("async" if self.batch_end_async else "sync"),
        })


# Why a fix with an in-loop switch in a PyTorch loop cannot be switched inside a Keras fit
KERAS_NOT_SWITCHABLE = {
    "amp": ("the Keras dtype policy (mixed precision) is fixed when the layers are built: "
            "switching it needs a new model"),
    "channels_last": ("Keras layers' data_format is fixed when they are built: switching it "
                      "needs a new model"),
    "compile": ("Keras builds the train function once, at the fit's first step "
                "(jit_compile): it cannot be switched between blocks of the running fit"),
    "dispatch_overhead": ("Keras builds the train function once, at the fit's first step "
                          "(jit_compile): it cannot be switched between blocks of the running "
                          "fit"),
}
KERAS_TF32_NOT_SWITCHABLE = {
    "jax": ("JAX's matmul precision (jax_default_matmul_precision) is fixed when the train "
            "step is traced: it cannot be switched in the running fit"),
    "tensorflow": ("TensorFlow's TF32 setting is not switched in a running fit: a train step "
                   "compiled by XLA (jit_compile) keeps the precision it was compiled with"),
}


def keras_switch_for(backend: str, fix_id: str) -> tuple[Any | None, str | None]:
    """(the in-place switch, None) or (None, why there is none) for a fix in a Keras fit: only
    TF32 on the torch backend (the backend's matmul/cuDNN flags, capture/switches.Tf32Switch;
    it reports itself unavailable without a CUDA GPU of compute capability 8.0 or later)."""
    from .capture.verification import rule_switch

    path, reason = rule_switch(fix_id)
    if path is None:
        return None, reason
    if fix_id == "tf32":
        if backend == "torch":
            from .capture.switches import Tf32Switch

            return Tf32Switch(None, None), None
        return None, KERAS_TF32_NOT_SWITCHABLE.get(
            backend, f"no TF32 switch for the Keras backend {backend!r}")
    return None, KERAS_NOT_SWITCHABLE.get(
        fix_id, f"{fix_id} has no in-place switch in a Keras fit")


class _Window:
    """The backend profiler over the window: start, one step range per execution, stop."""

    def __init__(self, fw: Any, cb: GpuProfCallback) -> None:
        self.fw = fw
        self.cb = cb
        self.tmp = tempfile.mkdtemp(prefix="tb_gpuprof_keras_")
        self.first_step = cb.iteration
        self.last_step = cb.iteration
        self.t0 = self.t1 = 0.0
        self._marker: Any = None

    @staticmethod
    def create(backend: str, fw: Any, cb: GpuProfCallback) -> _Window:
        kinds = {"tensorflow": _TfWindow, "jax": _JaxWindow, "torch": _TorchWindow}
        if backend not in kinds:
            raise RuntimeError(f"no profiler for the Keras backend {backend!r}")
        return kinds[backend](fw, cb)

    gzip_raw = False  # store the raw profile gzipped (text formats)

    def warm_up(self) -> None:
        """Start the profiler without recording (backends that have a warm-up phase)."""
        raise NotImplementedError

    def abort(self) -> None:
        """Stop a warmed-up profiler that never recorded."""

    def start(self) -> None:
        self.t0 = time.time()
        try:
            self._start()
        except Exception:
            self.cleanup()
            raise

    def stop(self) -> None:
        self._stop()
        self.t1 = time.time()

    def mark(self, step: int) -> None:
        self._marker = self._new_marker(step)
        self._marker.__enter__()

    def unmark(self) -> None:
        m, self._marker = self._marker, None
        if m is not None:
            m.__exit__(None, None, None)

    def raw_trace(self) -> str:
        """Path of the profile the analysis reads (the XPlane the profiler wrote)."""
        found = sorted(glob.glob(os.path.join(self.tmp, "**", "*.xplane.pb"), recursive=True),
                       key=os.path.getmtime)
        if not found:
            raise RuntimeError(f"the profiler wrote no .xplane.pb under {self.tmp}")
        return found[-1]

    def stored_name(self) -> str:
        """The name the raw profile is kept under in the run (named after the window)."""
        return f"window_{self.first_step}_{self.last_step + 1}.xplane.pb"

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def _new_marker(self, step: int) -> Any:
        raise NotImplementedError


class _TfWindow(_Window):
    def _start(self) -> None:
        exp = self.fw.profiler.experimental
        opts = exp.ProfilerOptions(host_tracer_level=2, device_tracer_level=1,
                                   python_tracer_level=1 if self.cb.with_stack else 0)
        try:
            exp.start(self.tmp, options=opts)
        except Exception as e:  # AlreadyExistsError / UnavailableError
            raise RuntimeError(f"tf.profiler could not start (another profiler running?): "
                               f"{e}".replace("\n", " ")) from e

    def _stop(self) -> None:
        self.fw.profiler.experimental.stop()

    def _new_marker(self, step: int) -> Any:
        return self.fw.profiler.experimental.Trace(STEP_MARKER, step_num=step, _r=1)


class _JaxWindow(_Window):
    def _start(self) -> None:
        prof = self.fw.profiler
        kwargs: dict[str, Any] = {}
        if hasattr(prof, "ProfileOptions"):
            # JAX traces every Python call by default: slow, and a huge trace; only on request
            opts = prof.ProfileOptions()
            opts.python_tracer_level = 1 if self.cb.with_stack else 0
            kwargs["profiler_options"] = opts
        try:
            prof.start_trace(self.tmp, **kwargs)
        except Exception as e:
            raise RuntimeError(f"jax.profiler could not start (another trace running?): "
                               f"{e}") from e

    def _stop(self) -> None:
        self.fw.profiler.stop_trace()

    def _new_marker(self, step: int) -> Any:
        return self.fw.profiler.StepTraceAnnotation(STEP_MARKER, step_num=step)


class _TorchWindow(_Window):
    """torch.profiler driven by its phases (TorchProfilerWindow): prepare (warm-up: CUPTI
    starts up, nothing is kept), record, stop; a ProfilerStep#N range per execution."""

    gzip_raw = True
    win: TorchProfilerWindow | None = None

    def _make(self) -> TorchProfilerWindow:
        cb = self.cb
        win = TorchProfilerWindow(self.fw, cb._cupti_hold, cb, cuda=cb.gpu)
        win.teardown = TorchProfilerWindow.plan_teardown(
            self.fw, cb._cupti_hold, cuda=cb.gpu, warned=cb._warned, stacklevel=3)
        self.win = win
        return win

    def warm_up(self) -> None:
        try:
            self._make().prepare()
        except Exception:
            self.win = None
            self.cleanup()
            raise

    def abort(self) -> None:
        if self.win is not None:
            self.win.abort()

    def _start(self) -> None:
        (self.win or self._make()).record()

    def _stop(self) -> None:
        self._made().stop()

    def _new_marker(self, step: int) -> Any:
        return self._made().step_marker(step)

    def stop(self) -> None:
        """Stop, then export the trace and free the profiler's results here on the training
        thread: torch holds the GIL for both, so from the analysis thread they stalled
        training just as long, at a random step after the window
        (:meth:`TorchProfilerWindow.export`)."""
        super().stop()
        self._made().export(self._trace_path())

    def _made(self) -> TorchProfilerWindow:
        if self.win is None:
            raise RuntimeError("the torch profiler window was not started")
        return self.win

    def raw_trace(self) -> str:
        return self._trace_path()

    def _trace_path(self) -> str:
        return os.path.join(self.tmp, "window.pt.trace.json")

    def stored_name(self) -> str:
        return f"window_{self.first_step}_{self.last_step + 1}.pt.trace.json.gz"


__all__ = ["GpuProfCallback", "GpuProfWarning", "keras_switch_for"]
