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
  allocator's ``memory_stats_as_nested_dict`` and peak reset, each timed alone.

    python3 gpu/hook_step_cost.py --out $OUT/step_cost.json      # on a GPU
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

from bench_hook_overhead import gpt2_step, sync  # noqa: E402


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


def phase(prof: Any, step: Any, iterations: int, until: Any = None) -> dict[str, Any]:
    """Run ``iterations`` steps (or until ``until()`` is true); the costs per iteration."""
    sync()
    c0, t0, hook_ns, n = thread_cpu_ns(), time.perf_counter(), 0, 0
    while n < iterations and not (until is not None and until()):
        step()
        a = time.thread_time_ns()
        prof.step()
        hook_ns += time.thread_time_ns() - a
        n += 1
    sync()
    wall, c1 = time.perf_counter() - t0, thread_cpu_ns()
    threads = {k: round((v - c0.get(k, 0)) / max(n, 1) / 1e3, 2) for k, v in c1.items()}
    return {"iterations": n, "iteration_ms": round(wall / max(n, 1) * 1e3, 3),
            "step_us": round(hook_ns / max(n, 1) / 1e3, 2),
            "threads_us_per_iteration": threads}


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--iterations", type=int, default=300, help="per phase before/after")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    from tb_gpuprof.torch import GpuProfiler

    _, step = gpt2_step(args.smoke)
    n = 20 if args.smoke else args.iterations
    for _ in range(10):
        step()
    first = n + 5
    prof = GpuProfiler(tempfile.mkdtemp(prefix="step_cost_"), iter_start=first,
                       iter_stop=first + 3).start()
    out: dict[str, Any] = {"before": phase(prof, step, n)}
    phase(prof, step, first + 3 - prof.iteration)  # up to the window's end, not counted
    out["during"] = phase(prof, step, 10**6, until=lambda: prof.wait(0))
    out["after"] = phase(prof, step, n)
    out["analysis_s"] = prof.analysis_seconds
    out["analysis_priority"] = prof.analysis_priority
    prof.close()
    out["parts_us"] = parts_us(torch, 200 if args.smoke else 2000)
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
