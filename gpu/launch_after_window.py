"""Is a CUDA launch as fast after a window as before it? (issue 13, the mechanism.)

CUPTI left subscribed after a profiler stops makes every CUDA launch slower for the rest of
the run; a launch-bound loop feels that in full, but its own iteration time drifts by more
than the 1% to be shown. So this times the launch itself: the launch probe of
bench_hook_overhead (200 tiny in-place adds on the GPU over the same 200 on a CPU tensor, back
to back, so the host's speed cancels), ``--seconds`` of samples before a window and as long
after it, each sample between two pure-Python probes that read the vCPU's state
(benchmarks/overhead_stats.py); after / before = the median over steady after-samples of each
against the steady before-samples of the same state. One process per condition:

- ``none``: no window (the same pause instead): the floor of a before/after comparison;
- ``hook``: a GpuProfiler window of 3 steps of a small GPT-2 (its analysis waited for);
- ``plain``: torch.profiler around the same 3 steps, CUPTI left subscribed (the defect);
- ``plain-teardown``: the same with TEARDOWN_CUPTI=1 for the whole process.

At the end of each condition, ``cupti_subscriber``: whether CUPTI's one callback subscriber
is free (``cuptiSubscribe`` succeeds; it is let go at once) or still held, as Kineto holds it
after a window it did not tear down: a check of the state itself, where the launch probe
times its cost. ``plain`` must read ``held`` for the check to mean anything.

    python3 gpu/launch_after_window.py --out $OUT/launch          # on a GPU
    python3 gpu/launch_after_window.py --smoke --out /tmp/launch  # CPU: runs, measures nothing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
sys.path.insert(0, os.path.join(HERE, ".."))

from conditions import run_condition  # noqa: E402

CONDS = ("none", "hook", "plain", "plain-teardown")


def samples(seconds: float, probe: object) -> list[tuple[float, float, float, float]]:
    from overhead_stats import cpu_probe_ms

    out = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        before = cpu_probe_ms()
        launch = probe()  # type: ignore[operator]
        out.append((launch, before, cpu_probe_ms(), launch))
    return out


CUPTI_SUCCESS, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS = 0, 39  # cupti_result.h


def cupti_subscriber() -> str:
    """``free`` / ``held`` / why it cannot tell: try to take CUPTI's callback subscriber
    (one per process), in the libcupti this process loaded (torch's), and let it go."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcupti" in line}
    except OSError as e:
        return f"unknown: {e}"
    if paths:
        lib = ctypes.CDLL(sorted(paths)[0])
    else:  # linked into torch's own libraries: the process's global symbols
        lib = ctypes.CDLL(None)
        if not hasattr(lib, "cuptiSubscribe"):
            return "unknown: no libcupti loaded"
    handle = ctypes.c_void_p()
    rc = lib.cuptiSubscribe(ctypes.byref(handle), None, None)
    if rc == CUPTI_SUCCESS:
        lib.cuptiUnsubscribe(handle)
        return "free"
    return "held" if rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS else f"unknown: cupti rc {rc}"


def window(cond: str, smoke: bool, logdir: str) -> None:
    import torch
    from bench_hook_overhead import gpt2_step

    from tb_gpuprof.torch import GpuProfiler

    _, step = gpt2_step(True)
    for _ in range(3):
        step()
    if cond == "none":
        time.sleep(2.0)
    elif cond == "hook":
        prof = GpuProfiler(logdir, iter_start=1, iter_stop=4).start()
        for _ in range(6):
            step()
            prof.step()
        prof.wait(120)
        prof.close()
    else:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as p:
            for _ in range(3):
                step()
        p.export_chrome_trace(os.path.join(logdir, "plain.json"))
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def one(cond: str, seconds: float, smoke: bool) -> dict:
    from bench_hook_overhead import torch_launch_probe
    from overhead_stats import bootstrap_ci, state_matched_ratios

    if cond == "plain-teardown":
        os.environ["TEARDOWN_CUPTI"] = "1"  # this process only
    probe = torch_launch_probe()
    samples(1.0, probe)  # warm-up
    before = samples(seconds, probe)
    window(cond, smoke, tempfile.mkdtemp(prefix="launch_after_"))
    samples(0.5, probe)  # the first launches after a teardown run it (Kineto's thread)
    after = samples(seconds, probe)
    ratios = state_matched_ratios(after, before)
    raw = statistics.median(a[0] for a in after) / statistics.median(b[0] for b in before)
    return {"cond": cond, "n_before": len(before), "n_after": len(after),
            "n_matched": len(ratios), "raw_ratio": round(raw, 4),
            "ratio": round(statistics.median(ratios), 4) if ratios else None,
            "ci90": bootstrap_ci(lambda r: statistics.median(r.choices(ratios, k=len(ratios))))
            if ratios else None,
            "launch_before_median": round(statistics.median(b[0] for b in before), 4),
            "cupti_subscriber": cupti_subscriber()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cond", choices=CONDS)
    ap.add_argument("--conds", default="none,hook,plain,plain-teardown,hook,none")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cond:
        print(json.dumps(one(a.cond, a.seconds, a.smoke)))
        return
    os.makedirs(a.out, exist_ok=True)
    rows = []
    args = ["--seconds", str(a.seconds), "--out", a.out] + (["--smoke"] if a.smoke else [])
    for c in a.conds.split(","):
        row = run_condition(__file__, c, args, timeout=a.timeout)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.out, "launch_after_window.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
