"""One ``torch.profiler`` window, for the PyTorch hook (``tb_gpuprof.torch``) and the Keras
callback's torch backend (``tb_gpuprof.keras``).

Both hooks need the same things from torch.profiler: refuse to start when another profiler
runs (torch allows one per process), the activities and options the analysis reads, CUPTI's
teardown after the window (``torch_env.cupti_teardown_plan``), the Chrome trace exported at
the stop, and a stop that never raises into training when the window is given up. They
differ only in who moves the profiler on: the PyTorch hook lets torch's own schedule do it
(:meth:`TorchProfilerWindow.start` then :meth:`~TorchProfilerWindow.step`, which also makes
torch emit its ProfilerStep#N ranges), the Keras callback calls the phases itself
(:meth:`~TorchProfilerWindow.prepare`, :meth:`~TorchProfilerWindow.record`) and marks its
steps with :meth:`~TorchProfilerWindow.step_marker`.

``torch`` is imported only inside the methods: ``import tb_gpuprof`` needs no framework.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

from .hookcore import GpuProfWarning
from .torch_env import CuptiTeardownHold, cupti_teardown_env, cupti_teardown_plan, export_trace

OTHER_PROFILER = ("another profiler (torch.profiler / autograd profiler) is already running in "
                  "this process; no window report")
# the name torch.profiler's own schedule gives its step ranges (the analysis finds them)
STEP_RANGE = "ProfilerStep#{}"


class WindowOptions(Protocol):
    """What to record in the window: the hooks' own options, read off the hook itself."""

    record_shapes: bool
    with_flops: bool
    with_stack: bool
    record_memory: bool


class TorchProfilerWindow:
    """A ``torch.profiler.profile`` over one window, from its start to its exported trace.

    ``record_from``: drive the profiler by torch's schedule, warming up (CUPTI starts, nothing
    is kept) before that step and recording from it on; ``None``: the caller drives the
    phases. ``teardown``: whether the starts and the stop run with ``TEARDOWN_CUPTI=1``
    (:meth:`plan_teardown`; after the stop ``hold`` keeps it until Kineto's teardown ran).
    """

    def __init__(self, torch: Any, hold: CuptiTeardownHold, options: WindowOptions, *,
                 cuda: bool, record_from: int | None = None) -> None:
        if torch._C._autograd._profiler_enabled():
            raise RuntimeError(OTHER_PROFILER)
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if cuda:
            activities.append(ProfilerActivity.CUDA)
        self.torch = torch
        self.hold = hold
        self.teardown = False
        self._schedule = None if record_from is None else _RecordFrom(record_from)
        self._prepared = self._recorded = False
        self.prof: Any = profile(
            activities=activities, record_shapes=options.record_shapes,
            with_flops=options.with_flops, with_stack=options.with_stack,
            profile_memory=options.record_memory, schedule=self._schedule)

    @staticmethod
    def plan_teardown(torch: Any, hold: CuptiTeardownHold, *, cuda: bool, warned: set[str],
                      stacklevel: int = 2) -> bool:
        """Whether the next window tears CUPTI down at its stop (Kineto's TEARDOWN_CUPTI); when
        CUDA graphs or the user's environment forbid it, say once (``warned``) what staying
        attached costs. An earlier window's hold ends here: the user's value counts again.
        ``stacklevel`` counts from the caller, as if the caller warned."""
        hold.release(force=True)
        if not cuda:
            return False  # no CUDA activity profiled: CUPTI is never attached
        on, warning = cupti_teardown_plan(torch)
        if warning and "cupti teardown" not in warned:
            warned.add("cupti teardown")
            warnings.warn(f"tb_gpuprof: no CUPTI teardown after the window: {warning}",
                          GpuProfWarning, stacklevel=stacklevel + 1)
        return on

    # -- driven by torch's schedule (the PyTorch hook) ---------------------------------------

    def start(self, step: int) -> bool:
        """Start at iteration ``step`` (warm-up before ``record_from``); whether it records."""
        prof, schedule = self.prof, self._schedule
        if schedule is None:
            raise TypeError("start() follows torch's schedule: construct with record_from")
        prof.step_num = step
        prof.current_action = schedule(step)
        if hasattr(prof, "_prev_schedule_action"):  # torch >= 2.12 keeps the schedule's view
            prof._prev_schedule_action = prof.current_action
        self._phase(prof.start)
        return step >= schedule.first

    def step(self) -> None:
        """One iteration ended (torch's schedule moves from warm-up to recording here)."""
        self.prof.step()

    # -- driven by the caller (the Keras callback) -------------------------------------------

    def prepare(self) -> None:
        """Warm up: CUPTI starts up, nothing is kept yet."""
        self._phase(self.prof.prepare_trace)

    def record(self) -> None:
        """Begin recording (warming up first, if :meth:`prepare` was not called)."""
        if not self._prepared:
            self.prepare()
        self.prof.start_trace()
        self._recorded = True

    def step_marker(self, step: int) -> Any:
        """A range marking one step in the trace, named as torch's schedule names its own."""
        return self.torch.profiler.record_function(STEP_RANGE.format(step))

    # -- the end -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the profiler, through ``hold`` when CUPTI is torn down."""
        stop = self.prof.stop if self._schedule is not None else self.prof.stop_trace
        if self.teardown:
            self.hold.stop(stop)
        else:
            stop()

    def export(self, path: str) -> None:
        """Write the stopped window's Chrome trace to ``path`` and free the profiler's results
        (``torch_env.export_trace``: both hold the GIL, so the caller runs this where the stop
        already stalls training, not from another thread)."""
        export_trace(self.prof, path)
        self.prof = None

    def abort(self) -> None:
        """Stop a window that will have no report (one that may never have recorded)."""
        if self.prof is None:
            return
        if self._schedule is None and not self._recorded:
            self.prof.start_trace()  # as torch leaves a warm-up: Kineto stops a started trace
        self.stop()

    def _phase(self, fn: Any) -> None:
        """Run a start phase with TEARDOWN_CUPTI as planned: Kineto reads it when a trace is
        prepared, to re-create the CUPTI subscriber an earlier teardown removed."""
        with cupti_teardown_env(self.teardown):
            fn()
        self._prepared = True


class _RecordFrom:
    """torch.profiler's schedule for one window: warm-up before ``first``, then record. A
    schedule also makes the profiler emit its ProfilerStep#N ranges."""

    def __init__(self, first: int) -> None:
        from torch.profiler import ProfilerAction

        self.first = first
        self._warmup, self._record = ProfilerAction.WARMUP, ProfilerAction.RECORD

    def __call__(self, step: int) -> Any:
        return self._record if step >= self.first else self._warmup


__all__ = ["TorchProfilerWindow", "WindowOptions"]
