"""What the always-on hook costs per iteration, counted in CPU time rather than timed (issue 13).

A launch-bound loop's own speed drifts by more than the 1% to be shown (docs/performance.md),
but the CPU time the hook adds does not depend on that drift. This counts it, on the
benchmark's eager GPT-2 bf16 loop with one long-lived ``GpuProfiler``:

- ``step_us``: the training thread's CPU time inside ``prof.step()`` per iteration
  (``time.thread_time_ns`` around the call);
- ``threads_us_per_iteration``: the CPU time of each of the hook's threads (scalar writer,
  NVML sampler, the window's analysis thread) per iteration, by phase: before the window,
  while its analysis runs, after it;
- ``iteration_ms``: the loop's wall time per iteration in each phase (for the shares; it is
  the drifting quantity, not the measurement);
- the parts of ``step()``: a CUDA event created and recorded, ``Event.query()``, the
  allocator's ``memory_stats_as_nested_dict`` and peak reset, each timed alone
  (``parts_us``) and in the bare loop right after an iteration (``bare_loop_parts_us``).

    python3 gpu/hook_step_cost.py --out $OUT/step_cost.json      # on a GPU
    python3 gpu/hook_step_cost.py --lightning --out $OUT/light.json  # the same under Lightning
    python3 gpu/hook_step_cost.py --smoke                          # CPU: runs, measures little
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))

from bench_hook_overhead import gpt2_step, lightning_fit, sync  # noqa: E402


def thread_cpu_ns() -> dict[str, int]:
    """CPU time of every Python thread but this one, by name."""
    out = {}
    for t in threading.enumerate():
        if t is threading.current_thread() or t.ident is None:
            continue
        try:
            out[t.name] = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
        except (OSError, ProcessLookupError):
            pass
    return out


class PhaseClock:
    """One phase's costs per iteration: wall time, the hook's time on the training thread
    (``add_hook_ns``), the training thread's whole CPU time and each hook thread's."""

    def __init__(self) -> None:
        sync()
        self.hook_ns = self.iterations = 0
        self.threads0, self.t0, self.cpu0 = thread_cpu_ns(), time.perf_counter(), \
            time.thread_time_ns()

    def add_hook_ns(self, ns: int) -> None:
        """One iteration ended; the hook took ``ns`` of the training thread in it."""
        self.hook_ns += ns
        self.iterations += 1

    def result(self) -> dict[str, Any]:
        sync()
        k = max(self.iterations, 1)
        threads = thread_cpu_ns()
        return {"iterations": self.iterations,
                "iteration_ms": round((time.perf_counter() - self.t0) / k * 1e3, 3),
                "step_us": round(self.hook_ns / k / 1e3, 2),
                "thread_cpu_us": round((time.thread_time_ns() - self.cpu0) / k / 1e3, 1),
                "threads_us_per_iteration": {t: round((v - self.threads0.get(t, 0)) / k / 1e3, 2)
                                             for t, v in threads.items()}}


def phase(prof: Any, step: Any, iterations: int, until: Any = None) -> dict[str, Any]:
    """Run ``iterations`` steps (or until ``until()`` is true); the costs per iteration."""
    clock = PhaseClock()
    while clock.iterations < iterations and not (until is not None and until()):
        step()
        a = time.thread_time_ns()
        prof.step()
        clock.add_hook_ns(time.thread_time_ns() - a)
    return clock.result()


def parts_us(torch: Any, repeat: int) -> dict[str, float]:
    """Each piece of step()'s CUDA work alone, microseconds per call (median of 5 runs)."""
    if not torch.cuda.is_available():
        return {}
    dev = torch.cuda.current_device()

    def per_call(fn: Any) -> float:
        runs = []
        for _ in range(5):
            a = time.perf_counter_ns()
            for _ in range(repeat):
                fn()
            runs.append((time.perf_counter_ns() - a) / repeat / 1e3)
        return round(sorted(runs)[2], 2)

    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return {
        "event_create_record": per_call(lambda: torch.cuda.Event(enable_timing=True).record()),
        "event_query": per_call(ev.query),
        "memory_stats_nested": per_call(lambda: torch.cuda.memory.memory_stats_as_nested_dict(
            dev)),
        "reset_peak": per_call(lambda: torch.cuda.reset_peak_memory_stats(dev)),
    }


def in_loop_us(torch: Any, step: Any, iterations: int) -> dict[str, float]:
    """The same pieces timed in the loop, right after a bare step() (no hook), medians: where
    the first CUDA call after an iteration waits for room in the launch queue, it shows here
    too, so it is the loop's own wait, not the hook's work."""
    if not torch.cuda.is_available():
        return {}
    dev = torch.cuda.current_device()
    names = ("event_create_record", "event_query", "memory_stats_nested", "reset_peak",
             "second_event_create_record")
    times: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(iterations):
        step()
        marks = [time.perf_counter_ns()]
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        marks.append(time.perf_counter_ns())
        ev.query()
        marks.append(time.perf_counter_ns())
        torch.cuda.memory.memory_stats_as_nested_dict(dev)
        marks.append(time.perf_counter_ns())
        torch.cuda.reset_peak_memory_stats(dev)
        marks.append(time.perf_counter_ns())
        torch.cuda.Event(enable_timing=True).record()
        marks.append(time.perf_counter_ns())
        for k, a, b in zip(names, marks, marks[1:], strict=False):
            times[k].append((b - a) / 1e3)
    return {k: round(sorted(v)[len(v) // 2], 2) for k, v in times.items()}


def lightning_costs(step: Any, n: int) -> dict[str, Any]:
    """The same phases in a Lightning ``fit`` with one long-lived ``GpuProfCallback``: the
    training thread's CPU time inside the callback's two batch hooks per iteration
    (``step_us``), the hook's threads, and the training thread's whole CPU time per
    iteration (``thread_cpu_us``: Lightning's loop, the model and the callback together)."""
    import lightning as L

    from tb_gpuprof.lightning import GpuProfCallback

    first = n + 5
    cb = GpuProfCallback(tempfile.mkdtemp(prefix="step_cost_light_"), iter_start=first,
                         iter_stop=first + 3)
    phases: dict[str, Any] = {}

    class Timed(L.Callback):
        """Forwards the batch hooks to ``cb``, timing them, and ends the phases."""

        def __init__(self) -> None:
            self.phase = "before"
            self.i = 0
            self.start_ns = 0  # the callback's batch-start hook, this iteration
            self.clock = PhaseClock()

        def on_train_start(self, trainer: Any, pl: Any) -> None:
            cb.on_train_start(trainer, pl)
            self.clock = PhaseClock()

        def on_train_batch_start(self, trainer: Any, pl: Any, batch: Any, idx: int) -> None:
            a = time.thread_time_ns()
            cb.on_train_batch_start(trainer, pl, batch, idx)
            self.start_ns = time.thread_time_ns() - a

        def on_train_batch_end(self, trainer: Any, pl: Any, out: Any, batch: Any,
                               idx: int) -> None:
            a = time.thread_time_ns()
            cb.on_train_batch_end(trainer, pl, out, batch, idx)
            self.clock.add_hook_ns(self.start_ns + time.thread_time_ns() - a)
            self.i += 1
            prof = cb.profiler
            if self.phase == "before" and self.clock.iterations >= n:
                phases["before"] = self.clock.result()
                self.phase = "window"
            elif self.phase == "window" and self.i >= first + 3:
                self.phase = "during"
                self.clock = PhaseClock()
            elif self.phase == "during" and prof is not None and prof.wait(0):
                phases["during"] = self.clock.result()
                self.phase = "after"
                self.clock = PhaseClock()
            elif self.phase == "after" and self.clock.iterations >= n:
                phases["after"] = self.clock.result()
                trainer.should_stop = True

        def on_train_end(self, trainer: Any, pl: Any) -> None:
            cb.on_train_end(trainer, pl)

    lightning_fit(None, step, Timed())
    last = cb.last_profiler
    phases["analysis_s"] = last.analysis_seconds if last else None
    return phases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--iterations", type=int, default=300, help="per phase before/after")
    ap.add_argument("--lightning", action="store_true",
                    help="the same loop under Lightning with GpuProfCallback")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    from tb_gpuprof.torch import GpuProfiler

    _, step = gpt2_step(args.smoke)
    n = 20 if args.smoke else args.iterations
    for _ in range(10):
        step()
    if args.lightning:
        return write(lightning_costs(step, n), args.out)
    bare_in_loop = in_loop_us(torch, step, 20 if args.smoke else 200)
    first = n + 5
    prof = GpuProfiler(tempfile.mkdtemp(prefix="step_cost_"), iter_start=first,
                       iter_stop=first + 3).start()
    out: dict[str, Any] = {"before": phase(prof, step, n)}
    phase(prof, step, first + 3 - prof.iteration)  # up to the window's end, not counted
    out["during"] = phase(prof, step, 10**6, until=lambda: prof.wait(0))
    out["after"] = phase(prof, step, n)
    out["analysis_s"] = prof.analysis_seconds
    out["analysis_niceness"] = prof.analysis_niceness
    prof.close()
    out["parts_us"] = parts_us(torch, 200 if args.smoke else 2000)
    out["bare_loop_parts_us"] = bare_in_loop
    return write(out, args.out)


def write(out: dict[str, Any], path: str | None) -> int:
    print(json.dumps(out, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
