#!/usr/bin/env python3
"""NVML sampler overhead: CPU cost of the sampler thread and its effect on iteration time.

1. CPU: the sampler thread's own CPU time (time.thread_time) over wall time, as % of one core,
   at the default interval and at 0.1 s, with the GPU busy (real NVML answers differ when idle).
2. Iteration time A/B: a torch training step (MLP forward/backward/AdamW, bf16 autocast, a
   sync per step like a loss.item()) run in interleaved rounds without / with the sampler;
   the ratio of medians is printed (1.00 = no effect) with the round-to-round spread.

    python3 benchmarks/bench_nvml.py [--rounds 6] [--arm-seconds 5] [--cpu-seconds 20] [--out F]
    python3 benchmarks/bench_nvml.py --replay tests/data/nvml_h200.json   # CPU part only,
                                                                          # no GPU needed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tb_gpuprof.nvml import DEFAULT_INTERVAL_S, NvmlSampler
from tests.nvml_replay import ReplayBackend  # the recorded H200 answers (tests)


def make_backend(replay: str | None) -> ReplayBackend | None:
    return ReplayBackend(replay, loop=True) if replay else None


def cpu_cost(interval: float, seconds: float, replay: str | None) -> dict:
    sampler = NvmlSampler(interval_s=interval, backend=make_backend(replay))
    if not sampler.start():
        raise SystemExit(f"bench_nvml: {sampler.unavailable_reason}")
    t0 = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - t0
    cpu = sampler.cpu_time_s  # updated by the thread after every tick
    ticks = sampler.ticks
    sampler.stop()
    n = len(sampler.drain())
    return {"interval_s": interval, "wall_s": round(wall, 2), "ticks": ticks, "samples": n,
            "cpu_s": round(cpu, 4), "core_pct": round(100 * cpu / wall, 3),
            "cpu_ms_per_tick": round(1e3 * cpu / max(1, ticks), 3)}


def gpu_load(stop: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def make_step() -> Callable[[], float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(8) for m in
                                  (torch.nn.Linear(4096, 4096), torch.nn.GELU())]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 4096, device="cuda")

    def step() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # the per-step sync a training loop has

    return step


def time_steps(step: Callable[[], float], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n * 1e3


def iteration_ab(rounds: int, arm_seconds: float, interval: float) -> dict:
    step = make_step()
    time_steps(step, 30)  # warm-up: cuBLAS heuristics, allocator, clocks
    # each arm spans many sampler ticks, or the A/B would barely see the sampler
    steps = max(50, int(arm_seconds * 1e3 / time_steps(step, 50)))
    off: list[float] = []
    on: list[float] = []
    for r in range(rounds):
        for arm in (("off", "on") if r % 2 == 0 else ("on", "off")):
            sampler = None
            if arm == "on":
                sampler = NvmlSampler(interval_s=interval)
                if not sampler.start():
                    raise SystemExit(f"bench_nvml: {sampler.unavailable_reason}")
                time.sleep(2 * interval)  # first GPM pair and NVML warm-up outside the timing
            ms = time_steps(step, steps)
            (on if arm == "on" else off).append(ms)
            if sampler is not None:
                sampler.stop()
    ratio = statistics.median(on) / statistics.median(off)
    spread = (max(off) - min(off)) / statistics.median(off)
    return {"interval_s": interval, "rounds": rounds, "steps_per_arm": steps,
            "off_ms": [round(v, 3) for v in off], "on_ms": [round(v, 3) for v in on],
            "median_off_ms": round(statistics.median(off), 3),
            "median_on_ms": round(statistics.median(on), 3),
            "ratio_on_off": round(ratio, 4), "off_spread_pct": round(100 * spread, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description="NVML sampler overhead")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--arm-seconds", type=float, default=5.0, help="timed seconds per arm")
    ap.add_argument("--cpu-seconds", type=float, default=20.0)
    ap.add_argument("--replay", default=None, help="replay file: CPU part only, no GPU needed")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    results: dict = {"backend": "replay" if args.replay else "nvml"}
    stop = threading.Event()
    loader = None
    if not args.replay:
        loader = threading.Thread(target=gpu_load, args=(stop,), daemon=True)
        loader.start()
        time.sleep(2)
    try:
        results["cpu"] = [cpu_cost(i, args.cpu_seconds, args.replay)
                          for i in (DEFAULT_INTERVAL_S, 0.1)]
    finally:
        stop.set()
        if loader is not None:
            loader.join()
    for c in results["cpu"]:
        print(f"sampler CPU at {c['interval_s']} s: {c['core_pct']:.3f}% of one core "
              f"({c['cpu_ms_per_tick']:.3f} ms CPU per tick, {c['ticks']} ticks, "
              f"{c['samples']} samples)")
    if not args.replay:
        results["iteration"] = [iteration_ab(args.rounds, args.arm_seconds, i)
                                for i in (DEFAULT_INTERVAL_S, 0.1)]
        for a in results["iteration"]:
            print(f"iteration time with sampler at {a['interval_s']} s / without: "
                  f"{a['ratio_on_off']:.4f} (median {a['median_on_ms']:.3f} vs "
                  f"{a['median_off_ms']:.3f} ms; round-to-round spread without: "
                  f"{a['off_spread_pct']:.2f}%)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
