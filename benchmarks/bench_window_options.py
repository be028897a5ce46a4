"""What the window's record_memory and with_stack options cost on a tiny CPU training loop.

Trains a small MLP (CPU) under GpuProfiler with a window of 10 iterations, in four
configurations (neither, record_memory, with_stack, both), interleaved over ``--rounds`` rounds,
and prints the median window iteration time (the hook's ``gpuprof/iteration_time_ms``) of each
next to the plain window's, as ratios. CPU-only figures: per-op profiler costs weigh far more
on a CPU loop of tiny ops than on a GPU-bound one (gpu/memory_view_check.py measures that).

    python benchmarks/bench_window_options.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch

from tb_gpuprof.torch import GpuProfiler
from tests.runs import read_scalars

WINDOW = (5, 15)
CONFIGS = {"plain": {"record_memory": False, "with_stack": False},
           "record_memory": {"record_memory": True, "with_stack": False},
           "with_stack": {"record_memory": False, "with_stack": True},
           "both": {"record_memory": True, "with_stack": True}}


def window_ms(run: str, **options: bool) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(256, 256),
                                                                torch.nn.ReLU())])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    with GpuProfiler(run, *WINDOW, nvml=False, **options) as prof:
        for _ in range(WINDOW[1] + 1):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            prof.step()
    times = read_scalars(run)["gpuprof/iteration_time_ms"]
    return statistics.median(times[s] for s in range(*WINDOW))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    got: dict[str, list[float]] = {k: [] for k in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            names = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
            for name in names:
                got[name].append(window_ms(os.path.join(tmp, f"{name}{r}"), **CONFIGS[name]))
    base = statistics.median(got["plain"])
    print(f"window iteration time, median of {args.rounds} rounds (tiny CPU MLP, "
          f"torch {torch.__version__})")
    for name, values in got.items():
        med = statistics.median(values)
        print(f"  {name:14s} {med:8.3f} ms   x{med / base:.2f} of plain   "
              f"(rounds: {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
