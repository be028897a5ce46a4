"""The window's analysis in a child process: read the profile, build the report, store the
raw profile in the run. The hooks start it (``python -m tb_gpuprof.capture.window_child``) so the
analysis never competes with training for the training process's GIL, and it lowers its own
CPU priority first thing (``lower_priority``: nice +19; this process only).

Protocol: one :class:`WindowJob` on stdin, one :class:`WindowResult` on stdout, both JSON
(msgspec Structs: a field the other side does not know fails loudly, not later);
framework-free, like the analysis.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:  # the analysis is imported in the child only, never in the training process
    from ..analysis.context import AnalysisContext


class StoreSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where the window's raw profile goes in the run (``None`` in the job: not stored)."""
    run_dir: str
    step: int
    rank: int | None = None
    name: str | None = None  # the stored file's name (default: the raw file's)
    gzip: bool = False  # store a gzipped copy (Kineto JSON), else move the file


class WindowJob(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the hook hands the child: the raw profile and the analysis context's parts."""
    trace: str
    key: str | None = None
    env: dict[str, Any] | None = None
    telemetry: dict[str, Any] | None = None
    peak_tflops: float | None = None
    topology: dict[str, Any] | None = None
    gpu_expected: bool = False  # warn (no_gpu_warning) when the profile holds no GPU work
    no_gpu_warning: str = ""
    store: StoreSpec | None = None
    memory_record: dict[str, Any] | None = None  # capture/torch_memory.py's record


class WindowResult(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What comes back: the report (its source the stored copy) or the error, and how the
    child ran."""
    report: dict[str, Any] | None = None
    trace_path: str | None = None  # the stored raw profile
    warnings: list[str] = msgspec.field(default_factory=list)
    error: str | None = None
    timing: dict[str, float | int | None] = msgspec.field(default_factory=dict)
    niceness: int | None = None


def encode(value: WindowJob | WindowResult) -> bytes:
    """JSON for the pipe; a value JSON cannot hold (an env entry a framework returned as its
    own type) becomes its text, as the report would show it."""
    return msgspec.json.encode(value, enc_hook=str)

# How much lower than the training process the analysis runs, in nice levels (Unix): +19,
# the lowest (scheduler weight 15 against a normal task's 1024). At the former +10 (weight
# 110), on a CPU it shared with a launch-bound training thread, the child took about a tenth
# of that CPU while it ran. SCHED_IDLE (weight 3) was tried: under CPU training on both cores
# of the development machine one window's analysis then took 162 s against 34 s at +19, and
# an unprivileged process cannot leave SCHED_IDLE again (RLIMIT_NICE), while the CPU time the
# child takes from training in all is its own CPU time either way (docs/pytorch.md).
NICE_INCREMENT = 19


def lower_priority() -> int | None:
    """Nice this process by NICE_INCREMENT; its niceness then, None where not allowed."""
    if not hasattr(os, "nice"):
        return None
    try:
        return os.nice(NICE_INCREMENT)
    except OSError:
        return None  # not allowed here: run at the parent's priority


def _store_raw(job: WindowJob) -> str | None:
    """Keep the window's raw profile in the run (gzipped for Kineto JSON); its path."""
    store = job.store
    if store is None:
        return None
    from ..store.writer import gzip_copy, save_raw_trace

    src = job.trace
    if store.gzip and store.name:
        src = gzip_copy(src, os.path.join(os.path.dirname(src), store.name))
    elif store.name and os.path.basename(src) != store.name:
        dest = os.path.join(os.path.dirname(src), store.name)
        os.replace(src, dest)
        src = dest
    return save_raw_trace(store.run_dir, src, store.step, rank=store.rank)


class Phases:
    """Wall and CPU seconds of each of the child's steps (the result's ``timing``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def done(self, step: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.seconds[f"{step}_s"] = round(wall - self._wall, 4)
        self.seconds[f"{step}_cpu_s"] = round(cpu - self._cpu, 4)
        self._wall, self._cpu = wall, cpu


def job_context(job: WindowJob) -> AnalysisContext:
    """What the analysis knows beside the trace, from the job (stored with the raw trace)."""
    from ..analysis.context import AnalysisContext

    return AnalysisContext(key=job.key, env=job.env, telemetry=job.telemetry,
                           peak_tflops=job.peak_tflops, topology=job.topology,
                           memory_record=job.memory_record)


def _store_context(job: WindowJob, context: AnalysisContext) -> None:
    if job.store is not None:
        from ..store.writer import save_context

        save_context(job.store.run_dir, job.store.step, context.to_dict(), rank=job.store.rank)


def run_job(job: WindowJob, phases: Phases | None = None) -> WindowResult:
    """Store, then analyze (the raw profile is worth keeping even if the analysis fails)."""
    phases = phases or Phases()
    from ..analysis.context import build_report_in_context
    from ..readers import load_profile

    phases.done("imports")
    out = WindowResult()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            context = job_context(job)
            out.trace_path = _store_raw(job)
            _store_context(job, context)
            phases.done("store")
            # the raw file where it still is (the run got a gzipped copy: reading that back
            # would only decompress it again), else the one moved into the run
            trace = job.trace if os.path.exists(job.trace) else (out.trace_path or job.trace)
            profile = load_profile(trace, python_calls=False)  # a report reads none
            phases.done("read")
            if job.gpu_expected and not profile.gpu:
                out.warnings.append(job.no_gpu_warning)
            report = build_report_in_context(profile, context)
            if out.trace_path and job.store is not None:  # the stored copy, inside the run
                report["source"]["path"] = os.path.relpath(out.trace_path, job.store.run_dir)
            out.report = report
            phases.done("report")
        except Exception as e:
            out.error = f"{type(e).__name__}: {e}"
    out.warnings.extend(str(w.message) for w in caught)
    return out


def _thread_count() -> int | None:
    """This process's threads now (Linux; None elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def main() -> int:
    niceness = lower_priority()  # before the analysis's imports, which take CPU time too
    try:
        job = msgspec.json.decode(sys.stdin.buffer.read(), type=WindowJob)
    except msgspec.MsgspecError as e:
        write_all(sys.stdout.fileno(), encode(WindowResult(error=f"bad job: {e}")))
        return 2
    phases = Phases()  # from here: reading the job is not part of the imports' time
    result = run_job(job, phases)
    result.niceness = niceness
    result.timing = {**phases.seconds, "cpu_s": round(time.process_time(), 4),
                     "threads": _thread_count()}
    write_all(sys.stdout.fileno(), encode(result))
    return 0


def write_all(fd: int, data: bytes) -> None:
    """``data`` to ``fd`` in as few writes as the pipe takes. ``json.dump`` to ``sys.stdout``
    writes each token: under ``PYTHONUNBUFFERED=1`` (common in containers and batch
    scripts) the report of a 12 MB H200 trace went out in about 1,500 writes, and the
    parent's analysis thread woke, took the GIL from training and read once per write."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


if __name__ == "__main__":
    sys.exit(main())
