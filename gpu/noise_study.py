"""How steady is a launch-bound loop's iteration time on this machine, and what steadies it?

An eager HF GPT-2 124M bf16 step (the hook-overhead benchmark's gpt2 workload) timed in blocks
of 10 synchronized iterations for ``--seconds``, in one process per condition:
``default``; ``pinned`` (the process bound to the 4 CPUs that the GPU's NUMA node lists first);
``collect`` (gc.collect() before every block). Prints per-block times and their spread.

    python3 gpu/noise_study.py --seconds 25
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))


def one(cond: str, seconds: float) -> dict:
    import torch
    from bench_hook_overhead import gpt2_step

    if cond == "pinned":
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, set(cpus[:4]))
    _, step = gpt2_step(False)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    blocks = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        if cond == "collect":
            gc.collect()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - t0) * 100)
    med = statistics.median(blocks)
    pairs = [b / a for a, b in zip(blocks[::2], blocks[1::2], strict=False)]
    return {"cond": cond, "median_ms": round(med, 2), "min": round(min(blocks), 2),
            "max": round(max(blocks), 2), "n": len(blocks),
            "first_half_median": round(statistics.median(blocks[: len(blocks) // 2]), 2),
            "second_half_median": round(statistics.median(blocks[len(blocks) // 2:]), 2),
            "adjacent_pair_ratio_p10_p50_p90": [round(x, 3) for x in statistics.quantiles(
                pairs, n=10)[::4]] if len(pairs) > 10 else None,
            "blocks": [round(b, 2) for b in blocks]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--cond", default=None)
    ap.add_argument("--conds", default="default,pinned,collect,default")
    a = ap.parse_args()
    if a.cond:
        print(json.dumps(one(a.cond, a.seconds)))
        return
    for c in a.conds.split(","):
        out = subprocess.run([sys.executable, __file__, "--cond", c, "--seconds",
                              str(a.seconds)], capture_output=True, text=True)
        line = (out.stdout.strip().splitlines() or [out.stderr[-300:]])[-1]
        try:
            r = json.loads(line)
            print({k: v for k, v in r.items() if k != "blocks"}, flush=True)
            print("   blocks:", r["blocks"][:60], flush=True)
        except ValueError:
            print(c, "failed:", line, flush=True)


if __name__ == "__main__":
    main()
