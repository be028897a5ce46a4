"""What the PyTorch hook (tb_gpuprof.torch) and the Keras callback (tb_gpuprof.keras) share:
warn-once feature switches, the run's events file, the scalar queue and its flush thread, NVML
sampling and window telemetry, the window's analyze-and-store steps and the run summary.

Framework-free (no torch/keras/tensorflow/jax imports): the hooks import the frameworks; this
module only moves numbers and files. The per-step hot paths stay in the hooks and touch only
plain attributes set here (``_on``, ``_out``, ``_wall_ms``), so sharing adds nothing per step.
"""

from __future__ import annotations

import collections
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import msgspec

from ..store import layout
from .window_child import StoreSpec, WindowJob, WindowResult, encode

# The window's analysis child gets this long before it is killed (a huge trace takes minutes).
CHILD_TIMEOUT_S = 3600.0
# Un-profiled iteration periods the report is corrected with: at least this many, and when the
# window starts too early for that, wait at most this long for iterations after it.
UNPROFILED_MIN = 3
UNPROFILED_WAIT_S = 10.0
# The analysis child's numerical libraries run one thread each. numpy's OpenBLAS otherwise
# starts a thread per CPU at import, and each spins for a while: on a 16-CPU host that is
# 15 busy threads on the cores training runs on, for an analysis that does no linear algebra.
CHILD_THREAD_LIMITS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                       "MKL_NUM_THREADS": "1"}
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Scalars of iterations after the window wait for its report (FLOPs) at most this many deep.
MAX_HELD_SCALARS = 10_000


class GpuProfWarning(UserWarning):
    """A tb_gpuprof feature failed and was switched off; training goes on."""


def nvml_scalar_tags(values: dict[str, float]) -> dict[str, float]:
    """NVML sampler scalars under the ``gpuprof/`` tag prefix, as floats."""
    return {layout.scalar_tag(k): float(v) for k, v in values.items()}


class HookCore:
    """Mixin holding the framework-free state and machinery of a capture hook.

    The hook calls :meth:`_init_core` from its ``__init__`` (a method, not ``__init__``, so it
    composes with a framework's own base class), sets ``_on`` (feature -> on) when it starts,
    appends ``(step, wall_time, {tag: value})`` to ``_out`` per iteration, and advances
    ``iteration``. Subclasses must write ``run_dir`` before the events file opens.
    """

    def _init_core(self, logdir: str | os.PathLike[str], iter_start: int | None,
                   iter_stop: int | None, *, key: str | None, nvml_interval_s: float | None,
                   with_stack: bool, record_shapes: bool, with_flops: bool,
                   flush_secs: float, memory_interval_s: float = 0.1) -> None:
        if iter_start is not None and iter_start < 0:
            raise ValueError(f"iter_start must be >= 0, got {iter_start}")
        if iter_start is not None and iter_stop is None:
            iter_stop = iter_start + 1
        if iter_start is not None and iter_stop is not None and iter_stop <= iter_start:
            raise ValueError(f"iter_stop ({iter_stop}) must be greater than iter_start "
                             f"({iter_start})")
        if not (isinstance(memory_interval_s, (int, float)) and memory_interval_s >= 0):
            raise ValueError(f"memory_interval_s must be a number >= 0, got {memory_interval_s!r}")
        self.memory_interval_s = float(memory_interval_s)
        self._memory_read_t = -math.inf  # perf_counter of the last reading of the memory peaks
        self.logdir = os.fspath(logdir)
        self.run_dir = self.logdir  # where this process writes (the PyTorch hook: per rank)
        self.iter_start = iter_start
        self.iter_stop = iter_stop if iter_start is not None else None
        self.key = key
        self.nvml_interval_s = nvml_interval_s
        self.with_stack = with_stack
        self.record_shapes = record_shapes
        self.with_flops = with_flops
        self.flush_secs = flush_secs
        self._on: dict[str, bool] = {}
        self._warned: set[str] = set()
        self._writer: Any = None
        self._sampler: Any = None
        self._nvml_lock = threading.Lock()
        self._nvml_recent: collections.deque[Any] = collections.deque(maxlen=20_000)
        self._out: collections.deque[tuple[int, float, dict[str, float]]] = collections.deque()
        self._flusher: threading.Thread | None = None
        self._stop_flusher = threading.Event()
        self.iteration = 0
        self.rank: int | None = None  # decided by the framework adapter; None: no distributed job
        self.extra_flags: dict[str, Any] = {}  # adapters' own flags (the Trainer's), for rules
        self.peak_tflops: float | None = None  # overrides the peak table for MFU
        self._wall_ms: list[float] = []
        # (step, true iteration period in ms, whether it came from the GPU step-to-step events)
        self._periods: collections.deque[tuple[int, float, bool]] = \
            collections.deque(maxlen=100_000)
        self._analysis: threading.Thread | None = None
        self.env: dict[str, Any] | None = None
        self.report: dict[str, Any] | None = None  # the window's report, once analyzed
        self.trace_path: str | None = None  # the stored raw profile, once saved
        # the analysis child's niceness (window_child; None: it could not lower it)
        self.analysis_niceness: int | None = None
        # seconds of the last analysis's steps: the telemetry wait, the child (its own steps)
        self.analysis_timing: dict[str, Any] | None = None
        # verify=: capture/verification.LoopVerifier while it runs; off | waiting | running |
        # done (the hooks set "waiting" when asked to verify)
        self._verifier: Any = None
        self._verify_state = "off"

    def _memory_due(self, t: float) -> bool:
        """Whether to read the device's memory peaks at ``t`` (a reading costs tens of µs of
        the training thread): at every iteration of a window, else at most every
        ``memory_interval_s`` (0: always, also for Keras' batch ends dispatched out of order on
        its worker threads). The peaks read cover the iterations since the last reading."""
        if self.memory_interval_s > 0 and getattr(self, "_window", None) is None and \
                t - self._memory_read_t < self.memory_interval_s:
            return False
        self._memory_read_t = t
        return True

    # -- robustness ------------------------------------------------------------------------

    def _fail(self, feature: str, exc: BaseException | str) -> None:
        """Switch ``feature`` off and warn once; training continues."""
        self._on[feature] = False
        if feature not in self._warned:
            self._warned.add(feature)
            warnings.warn(f"tb_gpuprof: {feature} disabled, training continues: {exc}",
                          GpuProfWarning, stacklevel=3)

    def _guard(self, feature: str, fn: Callable[..., Any], *args: Any,
               when: str | None = None) -> Any:
        """``fn(*args)``; an error switches off ``when`` (or ``feature``) and gives None.
        With ``when``: nothing runs while that feature is off."""
        if when is not None and not self._on.get(when):
            return None
        try:
            return fn(*args)
        except Exception as e:
            self._fail(when or feature, e)
            return None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the window's analysis; True when it is done (or there is none)."""
        t = self._analysis
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    # -- outputs: events file, NVML, scalar thread -------------------------------------------

    def _open_writer(self) -> None:
        from ..store.writer import EventWriter

        self._writer = EventWriter(self.run_dir, rank=self.rank)

    def _start_nvml(self, devices: list[int] | None = None) -> None:
        from ..nvml.sampler import NvmlSampler

        kwargs: dict[str, Any] = ({} if self.nvml_interval_s is None
                                  else {"interval_s": self.nvml_interval_s})
        if devices is not None:
            kwargs["devices"] = devices
        sampler = NvmlSampler(**kwargs)
        if not sampler.start():
            raise RuntimeError(sampler.unavailable_reason or "NVML unavailable")
        self._sampler = sampler

    def _start_flush_thread(self) -> None:
        if self._writer is not None and self._on.get("scalars") and self._flusher is None:
            self._stop_flusher.clear()
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name="tb_gpuprof-scalars")
            self._flusher.start()

    def _stop_flush_thread(self) -> None:
        if self._flusher is not None:
            self._stop_flusher.set()
            self._flusher.join(timeout=30)
            self._flusher = None

    def _stop_nvml(self) -> None:
        if self._sampler is not None:
            self._guard("nvml", self._sampler.stop)
            self._sampler = None

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._guard("event writer", self._writer.close)
            self._writer = None

    # -- scalars (background thread) ---------------------------------------------------------

    def _flush_loop(self) -> None:
        while not self._stop_flusher.wait(self.flush_secs):
            self._flush_scalars()

    def _flush_scalars(self) -> None:
        writer, out = self._writer, self._out
        if writer is None:
            return
        try:
            while out:
                step, wall_time, values = out[0]
                if self._awaiting_report(step) and len(out) < MAX_HELD_SCALARS:
                    break  # wait for the window's FLOPs: they go with every later iteration
                out.popleft()
                if self._on.get("scalars"):  # queued before a failure switched them off
                    writer.add_scalars(self._with_throughput(step, values), step, wall_time)
            if self._sampler is not None and self._on.get("nvml"):
                samples = self._drain_nvml()
                nv = self._sampler.scalars(samples) if samples else None
                if nv:
                    writer.add_scalars(nvml_scalar_tags(nv), max(self.iteration - 1, 0))
        except Exception as e:
            self._fail("scalars", e)

    def _awaiting_report(self, step: int) -> bool:
        analysis = self._analysis
        return (self.iter_stop is not None and step >= self.iter_stop and self.report is None
                and analysis is not None and analysis.is_alive())

    def _with_throughput(self, step: int, values: dict[str, float]) -> dict[str, float]:
        """After the window: ``gpuprof/model_tflops`` and ``gpuprof/mfu_pct`` of each later
        iteration, the window's FLOPs per iteration over its period (here, off the training
        thread)."""
        report = self.report
        period = values.get(layout.ITERATION_TIME_TAG)
        if report is None or period is None or self.iter_stop is None or step < self.iter_stop:
            return values
        # a leaf module: importing analysis.throughput here held the GIL for 32-35 ms
        from ..analysis.live_throughput import section_scalars

        return {**values, **section_scalars(report.get("throughput") or {}, period)}

    def _drain_nvml(self) -> list[Any]:
        """New NVML samples; they are also kept a while for the window's telemetry."""
        with self._nvml_lock:
            samples = self._sampler.drain()
            self._nvml_recent.extend(samples)
        return samples

    # -- the window's analysis (analysis thread) ---------------------------------------------

    def _window_telemetry(self, t0: float, t1: float) -> dict[str, Any] | None:
        """NVML summary of the window [t0, t1] (wall clock). A window shorter than the sampling
        period gets the samples nearest to it (one period either side)."""
        if self._sampler is None or not self._on.get("nvml"):
            return None
        period = float(getattr(self._sampler, "interval_s", 0.5))
        # let the sample after t1 arrive (reading the profile may have taken that long)
        time.sleep(max(0.0, min(period, 2.0) - (time.time() - t1)))
        self._drain_nvml()
        with self._nvml_lock:
            recent = list(self._nvml_recent)
        inside = [s for s in recent if t0 <= s.time <= t1]
        if not inside:
            inside = [s for s in recent if t0 - period <= s.time <= t1 + period]
        return self._sampler.window_summary(inside)

    def _window_topology(self) -> dict[str, Any] | None:
        """The host's GPU interconnect with the job's GPUs marked, for the ``gpu_placement``
        rule (the report's analysis takes it explicitly)."""
        sampler = self._sampler
        if sampler is None or not self._on.get("nvml") or len(sampler.devices) < 2:
            return None  # one GPU: nothing to place
        from ..nvml.topology import topology_from_backend

        return topology_from_backend(sampler.backend, [info.uuid for _, info in sampler.devices])

    def _unprofiled(self, skip: Callable[[int], bool], window_start: int,
                    enough_after: Callable[[], bool]) -> dict[str, Any] | None:
        """``env["unprofiled"]``: the median true period of the iterations outside the window
        (``skip`` says which steps do not count: iteration 0, warm-up, window, teardown).

        The iterations before the window are used when there are UNPROFILED_MIN of them;
        otherwise the ones after it are added, waiting for them at most UNPROFILED_WAIT_S
        (or until ``enough_after()``: the loop ended)."""
        deadline = time.monotonic() + UNPROFILED_WAIT_S
        while True:
            used = [(step, ms, gpu) for step, ms, gpu in list(self._periods) if not skip(step)]
            before = [u for u in used if u[0] < window_start]
            if len(before) >= UNPROFILED_MIN:
                used = before
                break
            if len(used) >= UNPROFILED_MIN or time.monotonic() >= deadline or enough_after():
                break
            time.sleep(0.05)
        if not used:
            return None
        from_gpu = sum(1 for _, _, gpu in used if gpu)
        return {"median_ms": round(statistics.median(ms for _, ms, _ in used), 4),
                "count": len(used),
                "source": "gpu_events" if from_gpu * 2 > len(used) else "wall_time"}

    def _analyze_in_child(self, raw: str, env: dict[str, Any], t0: float, t1: float,
                          step: int, *, gpu_expected: bool, no_gpu_warning: str,
                          stored_name: str, gzip_raw: bool,
                          memory_record: dict[str, Any] | None = None) -> None:
        """Analysis thread: NVML telemetry here, then the child process stores the raw
        profile and builds the report (off this process's GIL); the report comes back and is
        written into this process's events file. ``memory_record``: the model's and
        optimizer's tensors at the window's stop, for the memory peak's parts."""
        started = time.perf_counter()
        telemetry = self._guard("nvml", self._window_telemetry, t0, t1, when="nvml")
        telemetry_s = time.perf_counter() - started
        if self.extra_flags:  # env is also self.env, the run summary's
            env.setdefault("flags", {}).update(self.extra_flags)
        topology = self._guard("nvml", self._window_topology, when="nvml")
        job = WindowJob(trace=raw, key=self.key, env=env, telemetry=telemetry,
                        peak_tflops=self.peak_tflops, topology=topology,
                        gpu_expected=gpu_expected, no_gpu_warning=no_gpu_warning,
                        memory_record=memory_record, store=None if self._writer is None else
                        StoreSpec(run_dir=self.run_dir, step=step, rank=self.rank,
                                  name=stored_name, gzip=gzip_raw))
        child_started = time.perf_counter()
        result = run_window_child(job)
        self.analysis_timing = {"telemetry_s": round(telemetry_s, 4),
                                "child_s": round(time.perf_counter() - child_started, 4),
                                **result.timing}
        self.analysis_niceness = result.niceness
        self.trace_path = result.trace_path
        for message in result.warnings:
            warnings.warn(message, GpuProfWarning, stacklevel=1)
        if result.error or result.report is None:
            raise RuntimeError(result.error or "the analysis process returned no report")
        self._store_report(result.report, step)

    def _store_report(self, report: dict[str, Any], step: int) -> None:
        """Write the report at ``step`` (the child made its source the stored raw profile)."""
        if self._writer is not None and self.trace_path is not None:
            self._writer.add_report(report, step=step)
        self.report = report

    # -- verification (verify=, capture/verification.py) ------------------------------------

    def _verify_drive(self, iteration_ms: float) -> bool:
        """Hand one iteration's time to the running verifier; once it is done, store its
        section. True while it is in its trials (it may have switched something: the hook's
        own time is then not charged to the next iteration)."""
        verifier = self._verifier
        try:
            verifier.on_step(iteration_ms)
        except Exception as e:  # a bug of ours: undo what is switched, stop verifying
            self._fail("verify", e)
            verifier.stop()
        if verifier.done:
            self._guard("verify", self._store_verification)
            self._verifier, self._verify_state = None, "done"
        return bool(verifier.phase == "trial")

    def _verification_step(self) -> int | None:
        """The step the window's report (and its stored context) is at."""
        return None

    def _store_verification(self) -> None:
        """The report again, with what the loop measured; and the window's stored context,
        so that a re-analysis keeps it (analysis/context.py)."""
        import copy

        from ..analysis.verify import attach_verification
        from ..store.reader import read_context_beside
        from ..store.writer import save_context, traces_dir

        verifier, self._verifier = self._verifier, None
        step = self._verification_step()
        if verifier is None or self.report is None or step is None:
            return
        section = verifier.section()
        report = copy.deepcopy(self.report)
        attach_verification(report, section)
        context = read_context_beside(os.path.join(traces_dir(self.run_dir, step, self.rank),
                                                   "trace")) or {}
        save_context(self.run_dir, step, {**context, "verification": section}, rank=self.rank)
        self._store_report(report, step)

    # -- run summary -------------------------------------------------------------------------

    def _write_run_summary(self, periods_ms: list[float], report_step: int | None,
                           details: dict[str, Any]) -> None:
        """``gpuprof/run_summary``: what the run was; ``details`` are the hook's own fields.
        ``periods_ms``: the true iteration periods (``gpuprof/iteration_time_ms``)."""
        if self._writer is None:
            return
        walls = sorted(periods_ms)
        summary: dict[str, Any] = {
            "iterations": self.iteration,
            "iteration_time_ms_median": walls[len(walls) // 2] if walls else None,
            "window": [self.iter_start, self.iter_stop] if self.iter_start is not None else None,
            "report_step": report_step,
            **details,
            "env": self.env,
            "warnings": sorted(self._warned),
        }
        self._writer.add_json(layout.RUN_SUMMARY_TAG, summary, max(self.iteration - 1, 0))


def run_window_child(job: WindowJob) -> WindowResult:
    """Run ``job`` in ``python -m tb_gpuprof.capture.window_child``; its result (or an ``error``).

    The child finds this very package (``PYTHONPATH`` is set for the child only) and sees
    the same environment otherwise, less its numerical libraries' threads
    (CHILD_THREAD_LIMITS); nothing of this process is changed."""
    env = {**os.environ, **CHILD_THREAD_LIMITS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH"))
                                        if p)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tb_gpuprof.capture.window_child"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, close_fds=True)
    except OSError as e:
        return WindowResult(error=f"cannot start the analysis process: {e}")
    try:
        out, err = proc.communicate(encode(job), timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return WindowResult(error=f"the analysis process took over {CHILD_TIMEOUT_S:.0f} s")
    try:
        return msgspec.json.decode(out, type=WindowResult)
    except msgspec.MsgspecError:
        lines = err.decode(errors="replace").strip().splitlines()
        return WindowResult(error=f"the analysis process exited with status "
                                  f"{proc.returncode}: {lines[-1] if lines else 'no output'}")
