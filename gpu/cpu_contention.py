"""Which of this machine's CPUs slow a pure-Python thread when they are busy (issue 13).

The analysis child runs on another CPU at nice +19, yet single replays slowed the training
thread by 20-30% with the host in one state. One explanation is a CPU that shares a physical
core with the training thread's CPU (SMT siblings) that a guest's topology does not show.
This pins itself to ``--cpu``, then for each other CPU alternates (ABBA) a block of the
pure-Python probe with that CPU idle and a block with a busy-looping process pinned there,
and prints busy / idle per CPU. Siblings read well above the rest.

    python3 gpu/cpu_contention.py --out $OUT/contention.json      # on the GPU machine
    python3 gpu/cpu_contention.py --rounds 1 --probes 3           # quick look anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BUSY = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def probe_ms(repeats: int) -> float:
    """Median wall time of a fixed pure-Python loop."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        s = 0
        for i in range(20_000):
            s += i * i
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def busy_over_idle(cpu: int, rounds: int, probes: int) -> float:
    """Median over rounds of (probe with ``cpu`` busy) / (probe with it idle), ABBA."""
    ratios = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        ms = {}
        for busy in order:
            proc = subprocess.Popen([sys.executable, "-c", BUSY, str(cpu)]) if busy else None
            if proc is not None:
                time.sleep(0.05)  # let it start spinning
            ms[busy] = probe_ms(probes)
            if proc is not None:
                proc.kill()
                proc.wait()
        ratios.append(ms[True] / ms[False])
    return statistics.median(ratios)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", type=int, default=None, help="the probe's CPU (default: lowest)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--probes", type=int, default=15, help="probe loops per block")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    home = cpus[0] if args.cpu is None else args.cpu
    os.sched_setaffinity(0, {home})
    out = {"cpu": home, "cpus": len(cpus),
           "busy_over_idle": {str(c): round(busy_over_idle(c, args.rounds, args.probes), 4)
                              for c in cpus if c != home}}
    print(json.dumps(out))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
