"""Nsight Systems SQLite reader on a large export: time and peak memory of ``read_nsys``.

Builds an export with tests/nsys_builder.py (the documented export schema: a training-like
loop of kernel launches, memcpys, memsets and NVTX iteration ranges), then doubles every
activity table inside SQLite (copy k shifted by k x the span, correlation ids by a stride)
until the file reaches ``--size-mb``. The reader runs in a fresh process; what it keeps is the
model, so the figure to watch is peak RSS against the RSS that the finished Profile holds
(the reader's own working memory) and against the file size.

The reader reads at most ``tb_gpuprof.readers.nsys.MAX_ROWS`` rows (whole iterations); with
``--whole`` the whole export is read as well (unbounded: the model grows with the rows).

    python benchmarks/bench_nsys.py --size-mb 1000 --keep /tmp/big.sqlite [--whole]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
sys.path.insert(0, REPO)

SHIFTED = {"start", "end"}
STRIDED = {"correlationId", "gridId"}
TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
          "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")


def build_base(path: str, iterations: int = 2000) -> None:
    from tests.nsys_builder import NsysExport

    ex = NsysExport()
    t = 1_000_000
    for i in range(iterations):
        ex.range(t, t + 900_000, f"iteration {i}")
        ex.memcpy(t + 10_000, 20_000, 4 << 20, 1)
        for k in range(12):
            ex.launch(t + 40_000 + k * 60_000, 50_000,
                      f"void gemm_kernel<{k % 4}>(float*, float const*, int)",
                      grid=(132, 1 + k % 3, 1), block=(256, 1, 1), regs=96, dyn_smem=49152)
        ex.memset(t + 800_000, 5_000, 1 << 20)
        t += 1_000_000
    ex.write(path)


def grow(path: str, size_mb: float) -> int:
    con = sqlite3.connect(path)
    span = con.execute('SELECT MAX("end") - MIN(start) + 1 FROM CUPTI_ACTIVITY_KIND_KERNEL'
                       ).fetchone()[0]
    stride = con.execute("SELECT MAX(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME"
                         ).fetchone()[0]
    copies = 1
    while os.path.getsize(path) < size_mb * 1e6:
        with con:
            for table in TABLES:
                cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
                exprs = [f'"{c}" + {span * copies}' if c in SHIFTED else
                         f'"{c}" + {stride * copies}' if c in STRIDED else f'"{c}"'
                         for c in cols]
                con.execute(f'INSERT INTO "{table}" SELECT {", ".join(exprs)} FROM "{table}"')
        copies *= 2
    con.close()
    return copies


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    return 0.0


def run_one(path: str, whole: bool = False) -> dict[str, Any]:
    from tb_gpuprof.readers.nsys import MAX_ROWS, read_nsys

    base = _status_mb("VmRSS:")
    t0 = time.perf_counter()
    p = read_nsys(path, max_rows=None if whole else MAX_ROWS)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_mb": _status_mb("VmHWM:"), "base_mb": base,
            "after_mb": _status_mb("VmRSS:"), "gpu": len(p.gpu), "runtime": len(p.runtime),
            "annotations": len(p.annotations), "window": p.metadata.get("read_window")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=1000.0)
    ap.add_argument("--keep", metavar="PATH", help="build here (or reuse a file already there)")
    ap.add_argument("--whole", action="store_true",
                    help="also read the whole export (max_rows=None), not only the window")
    ap.add_argument("--run-one", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_one:
        print(json.dumps(run_one(args.run_one, args.whole)))
        return 0
    path = args.keep or tempfile.mktemp(suffix=".sqlite")
    try:
        if not os.path.exists(path):
            t0 = time.perf_counter()
            build_base(path)
            copies = grow(path, args.size_mb)
            print(f"built {path}: {copies} copies in {time.perf_counter() - t0:.0f} s")
        size = os.path.getsize(path)
        print(f"export: {size / 1e6:.0f} MB; load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} CPUs")
        for whole in ([False, True] if args.whole else [False]):
            proc = subprocess.run([sys.executable, __file__, "--run-one", path,
                                   *(["--whole"] if whole else [])], check=True,
                                  capture_output=True, text=True, cwd=REPO)
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows = r["gpu"] + r["runtime"] + r["annotations"]
            what = "whole export" if whole else (
                f"window of {r['window']['rows_in_export']:,} rows (max_rows "
                f"{r['window']['max_rows']:,})" if r["window"] else "whole (under max_rows)")
            print(f"read_nsys, {what}: {r['seconds']:.1f} s, {rows:,} rows "
                  f"({rows / r['seconds']:,.0f}/s)  [load {os.getloadavg()[0]:.1f}]")
            work = r["peak_mb"] - r["after_mb"]
            print(f"  peak RSS {r['peak_mb']:.0f} MB = interpreter {r['base_mb']:.0f} MB + "
                  f"model {r['after_mb'] - r['base_mb']:.0f} MB + reader working memory "
                  f"{work:.0f} MB; peak / file size {r['peak_mb'] * 2**20 / size:.2f}, model "
                  f"per row {(r['after_mb'] - r['base_mb']) * 2**20 / rows:.0f} bytes")
    finally:
        if not args.keep and os.path.exists(path):
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
