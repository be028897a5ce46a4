#!/usr/bin/env python3
"""Record raw NVML answers on a real GPU into a replay file for tests/data/ (CI has no GPU).

Idle for a few seconds, then a bf16 matmul loop (torch, same process, so this process's GPU
memory shows up), then a short cool-down; every tick stores every raw NVML answer (or its
NVML error) and the GPM metrics. Next to it, for comparison: ``nvidia-smi dmon -c 5`` taken
during the load, ``nvidia-smi topo -m`` and ``nvidia-smi -q -d PERFORMANCE,CLOCK``.

    python3 tools/record_nvml.py --out $OUT/nvml

Writes into --out: nvml_replay.json, nvidia_smi_dmon.txt, nvidia_smi_topo.txt,
nvidia_smi_q.txt, record_summary.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tb_gpuprof.nvml.backend import NvmlBackend
from tests.nvml_replay import (  # the replay format is the tests' (CI has no GPU)
    REPLAY_FORMAT,
    REPLAY_VERSION,
    record_tick,
    record_topology,
)


def matmul_load(stop: threading.Event, running: threading.Event, info: dict) -> None:
    """bf16 8192^3 products until told to stop; syncs every 10 so the queue stays short.

    Sets ``running`` once the first batch finished, so the "load" phase starts under load
    (torch import and CUDA context creation take seconds).
    """
    try:
        import torch

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        n = 0
        t0 = time.perf_counter()
        while not stop.is_set():
            for _ in range(10):
                a @ b
            torch.cuda.synchronize()
            running.set()
            n += 10
        dt = time.perf_counter() - t0
        info.update(matmuls=n, seconds=round(dt, 3),
                    tflops=round(n * 2 * 8192**3 / dt / 1e12, 1),
                    torch=torch.__version__,
                    memory_reserved_mib=round(torch.cuda.memory_reserved() / 2**20, 1))
    except Exception as e:  # record the failure rather than lose the idle samples
        info["error"] = f"{type(e).__name__}: {e}"
    finally:
        running.set()


def run(cmd: list[str], timeout: float = 60) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(cmd)}: {e}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--load-s", type=float, default=10.0)
    ap.add_argument("--cool-s", type=float, default=2.0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    backend = NvmlBackend()
    backend.init()
    uuids = [d.uuid for d in backend.devices()]
    physical = [d.uuid for d in backend.devices() if d.mig_parent_uuid is None]
    ticks: list[dict] = []
    load_info: dict = {}
    stop = threading.Event()
    running = threading.Event()
    loader = threading.Thread(target=matmul_load, args=(stop, running, load_info), daemon=True)
    dmon_proc = None
    dmon_text = ""
    t0 = time.monotonic()
    phases = [("idle", args.idle_s), ("load", args.load_s), ("cool", args.cool_s)]
    deadline = t0
    tick_cost: list[float] = []
    for phase, seconds in phases:
        if phase == "load":
            loader.start()
            running.wait(timeout=120)
            try:
                dmon_proc = subprocess.Popen(["nvidia-smi", "dmon", "-c", "5"],
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True)
            except OSError as e:
                dmon_text = f"nvidia-smi dmon: {e}\n"
            deadline = time.monotonic()
        if phase == "cool":
            stop.set()
            loader.join()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            c0 = time.perf_counter()
            ticks.append(record_tick(backend, uuids, time.monotonic() - t0, phase))
            tick_cost.append(time.perf_counter() - c0)
            deadline += args.interval
            time.sleep(max(0.0, deadline - time.monotonic()))
    if dmon_proc is not None:
        dmon_text = dmon_proc.communicate(timeout=30)[0]

    data = {
        "format": REPLAY_FORMAT, "version": REPLAY_VERSION,
        "recorded": {"host": socket.gethostname(), "pid": os.getpid(),
                     "interval_s": args.interval, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "system": backend.system_info(), "load": load_info,
                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
        "devices": [d.to_json() for d in backend.devices()],
        "topology": record_topology(backend, physical),
        "ticks": ticks,
    }
    backend.shutdown()
    with open(os.path.join(args.out, "nvml_replay.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(args.out, "nvidia_smi_dmon.txt"), "w") as f:
        f.write(dmon_text)
    with open(os.path.join(args.out, "nvidia_smi_topo.txt"), "w") as f:
        f.write(run(["nvidia-smi", "topo", "-m"]))
    with open(os.path.join(args.out, "nvidia_smi_q.txt"), "w") as f:
        f.write(run(["nvidia-smi", "-q", "-d", "PERFORMANCE,CLOCK,POWER,TEMPERATURE"]))
    summary = (f"ticks={len(ticks)} devices={len(uuids)} load={load_info} "
               f"tick_cost_ms mean={1e3 * sum(tick_cost) / max(1, len(tick_cost)):.2f} "
               f"max={1e3 * max(tick_cost, default=0):.2f}\n")
    with open(os.path.join(args.out, "record_summary.txt"), "w") as f:
        f.write(summary)
    print(summary, end="")
    print(dmon_text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
