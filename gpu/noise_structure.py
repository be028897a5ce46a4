"""Where a launch-bound loop's noise comes from on the GPU machine (issue 13's measurement).

An eager HF GPT-2 124M bf16 step (bench_hook_overhead's gpt2 workload), every iteration timed
on the host (no synchronization inside a block of 10; one at each block's end), for
``--seconds`` in one process per condition. Per block it also records the pure-Python probe
(overhead_stats.cpu_probe_ms), involuntary context switches, the CPU the thread ran on and
the machine's steal time. Conditions: ``default``; ``cpuN`` (the process bound to CPU N, torch
threads 1); ``sync`` (a synchronization after every iteration).

    python3 gpu/noise_structure.py --seconds 12 --conds default,cpu2,cpu9,sync --out $OUT/noise
    python3 gpu/noise_structure.py --smoke --out /tmp/noise        # CPU, tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))

from conditions import run_condition  # noqa: E402


def steal_ticks() -> int:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def current_cpu() -> int:
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def one(cond: str, seconds: float, smoke: bool) -> dict:
    import torch
    from bench_hook_overhead import gpt2_step, sync
    from overhead_stats import cpu_probe_ms

    if cond.startswith("cpu"):
        os.sched_setaffinity(0, {int(cond[3:])})
        torch.set_num_threads(1)
    _, step = gpt2_step(smoke)
    for _ in range(20):
        step()
    sync()
    blocks = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        probe = cpu_probe_ms()
        ru0, st0 = resource.getrusage(resource.RUSAGE_SELF), steal_ticks()
        sync()
        its = []
        t0 = time.perf_counter()
        for _ in range(10):
            step()
            if cond == "sync":
                sync()
            its.append(time.perf_counter())
        sync()
        t1 = time.perf_counter()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        prev = t0
        per = []
        for t in its:
            per.append(round((t - prev) * 1e3, 3))
            prev = t
        blocks.append({"ms": round((t1 - t0) * 100, 3), "probe": round(probe, 4), "its": per,
                       "nivcsw": ru1.ru_nivcsw - ru0.ru_nivcsw,
                       "cpu_s": round(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
                                      4),
                       "steal": steal_ticks() - st0, "cpu": current_cpu()})
    return {"cond": cond, "blocks": blocks}


def summary(r: dict) -> dict:
    b = r["blocks"]
    ms = [x["ms"] for x in b]
    pr = [x["probe"] for x in b]
    its = sorted(t for x in b for t in x["its"][1:])
    pairs = [y / x for x, y in zip(ms[::2], ms[1::2], strict=False)]
    norm = [x["ms"] / x["probe"] for x in b]
    npairs = [y / x for x, y in zip(norm[::2], norm[1::2], strict=False)]

    def q(xs: list[float]) -> list[float] | None:
        return [round(v, 3) for v in statistics.quantiles(xs, n=10)[::4]] if len(xs) > 10 \
            else None

    corr = statistics.correlation(ms, pr) if len(ms) > 3 and statistics.pstdev(pr) > 0 \
        else None
    return {"cond": r["cond"], "n": len(b), "block_ms_p10_50_90": q(ms),
            "iter_ms_p10_50_90": q(its), "adjacent_ratio_p10_50_90": q(pairs),
            "adjacent_ratio_norm_p10_50_90": q(npairs), "probe_corr": corr and round(corr, 3),
            "cpus": sorted({x["cpu"] for x in b}),
            "nivcsw_per_block": statistics.median(x["nivcsw"] for x in b),
            "steal_ticks": sum(x["steal"] for x in b),
            "cpu_per_wall": round(statistics.median(x["cpu_s"] / (x["ms"] / 100) for x in b), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=12)
    ap.add_argument("--cond", default=None)
    ap.add_argument("--conds", default="default,cpu2,sync")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cond:
        print(json.dumps(one(a.cond, a.seconds, a.smoke)))
        return
    os.makedirs(a.out, exist_ok=True)
    args = ["--seconds", str(a.seconds), "--out", a.out] + (["--smoke"] if a.smoke else [])
    for c in a.conds.split(","):
        r = run_condition(__file__, c, args, timeout=a.seconds + 120)
        if "error" in r:
            print(c, "failed:", r["error"], flush=True)
            continue
        with open(os.path.join(a.out, f"noise_{c}.json"), "w") as f:
            json.dump(r, f)
        print(json.dumps(summary(r)), flush=True)

if __name__ == "__main__":
    main()
