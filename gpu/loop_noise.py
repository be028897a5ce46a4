"""How noisy is the launch-bound benchmark loop, and does CPU affinity calm it? (issue 13)

The eager GPT-2 bf16 loop of ``benchmarks/bench_hook_overhead.py`` is bound by the host:
on the H200's KVM guest its 5-iteration blocks vary by +-15 %, so a ratio within 1 % needs
hundreds of blocks. This script times bare blocks under several CPU affinities, alternating
block by block (so a drift of the machine falls on every condition alike), and prints for
each: the block mean, the spread of the ratio of one block to the next one of the same
condition (what a paired comparison sees), thread CPU time over wall time, how many CPUs
the training thread ran on, and the host probe (overhead_stats.cpu_probe_ms) before each
block, which tells the host's fast and slow states apart. Nothing of tb_gpuprof is imported.

    python3 gpu/loop_noise.py --blocks 80 --out DIR
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import math
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from bench_hook_overhead import gpt2_step, sync
from overhead_stats import cpu_probe_ms


def steal_jiffies() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def conditions() -> dict[str, set[int]]:
    every = os.sched_getaffinity(0)
    cpus = sorted(every)
    conds = {"free": set(every)}
    if len(cpus) >= 4:
        conds["one_cpu"] = {cpus[2]}
        conds["four_cpus"] = set(cpus[2:6])
    return conds


def run(blocks: int, block: int, smoke: bool) -> dict[str, Any]:
    _, step = gpt2_step(smoke)
    getcpu = ctypes.CDLL(None).sched_getcpu
    for _ in range(20):
        step()
    sync()
    conds = conditions()
    times: dict[str, list[float]] = {c: [] for c in conds}
    cpu_share: dict[str, list[float]] = {c: [] for c in conds}
    seen: dict[str, set[int]] = {c: set() for c in conds}
    iters: dict[str, list[float]] = {c: [] for c in conds}
    probes: dict[str, list[float]] = {c: [] for c in conds}
    steal0, t0 = steal_jiffies(), time.time()
    for _ in range(blocks):
        for name, mask in conds.items():
            os.sched_setaffinity(0, mask)  # the calling thread only (Linux)
            step()  # one untimed iteration after the move
            sync()
            probes[name].append(cpu_probe_ms())  # the host's speed: ~1.8x apart in two states
            w0, c0 = time.perf_counter(), time.thread_time()
            last = w0
            for _ in range(block):
                step()
                seen[name].add(getcpu())
                now = time.perf_counter()
                iters[name].append((now - last) * 1e3)
                last = now
            sync()
            w, c = time.perf_counter() - w0, time.thread_time() - c0
            times[name].append(w * 1e3 / block)
            cpu_share[name].append(c / w)
    os.sched_setaffinity(0, conds["free"])
    steal_per_s = (steal_jiffies() - steal0) / os.sysconf("SC_CLK_TCK") / (time.time() - t0)
    out: dict[str, Any] = {"steal_cpu_s_per_s": round(steal_per_s, 3), "conditions": {}}
    for name in conds:
        t = times[name]
        logs = [math.log(b / a) for a, b in itertools.pairwise(t)]
        it = sorted(iters[name])
        out["conditions"][name] = {
            "cpus": sorted(conds[name]) if name != "free" else f"{len(conds[name])} allowed",
            "block_ms_mean": round(statistics.fmean(t), 2),
            "block_cv": round(statistics.stdev(t) / statistics.fmean(t), 4),
            "next_block_ratio_sd": round(statistics.stdev(logs), 4),
            "iteration_ms_p10_p50_p90": [round(it[int(q * (len(it) - 1))], 2)
                                         for q in (0.1, 0.5, 0.9)],
            "thread_cpu_over_wall": round(statistics.fmean(cpu_share[name]), 3),
            "cpus_used": len(seen[name]),
            "probe_ms_min_median_max": [round(f(probes[name]), 3)
                                        for f in (min, statistics.median, max)],
            "probe_ms": [round(x, 3) for x in probes[name]],
            "block_ms": [round(x, 2) for x in t],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=80, help="blocks per condition")
    ap.add_argument("--block", type=int, default=5, help="iterations per block")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="a tiny GPT-2 (CPU check)")
    args = ap.parse_args()
    res = run(args.blocks, args.block, args.smoke)
    for name, c in res["conditions"].items():
        print(f"{name:10s} {c['block_ms_mean']:7.2f} ms  block cv {c['block_cv']:.3f}  "
              f"next-block ratio sd {c['next_block_ratio_sd']:.3f}  iter p10/50/90 "
              f"{c['iteration_ms_p10_p50_p90']}  cpu/wall {c['thread_cpu_over_wall']}  "
              f"cpus used {c['cpus_used']} ({c['cpus']})  host probe ms "
              f"{c['probe_ms_min_median_max']}")
    print("steal (CPU s per s):", res["steal_cpu_s_per_s"])
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "loop_noise.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
