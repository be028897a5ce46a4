"""End-to-end report benchmark: the ``tb-gpuprof report TRACE --format json`` process against
the peers' processes on the same file, side by side in one run (issue 39).

Each tool runs as a whole process, interpreter start and imports included:

* Kineto JSON of about 130 MB (the H200 ResNet-50 fixture scaled, bench_parse.build_trace), in
  Kineto's own layout and on one line: ours against torch-tb-profiler 0.4.3's
  ``RunProfileData.parse`` (what TensorBoard's profiler plugin runs when a run is opened).
  Goal: at least 20x faster, at 1/5 or less of its peak memory.
* Kineto JSON of about 2 GB: ours alone. Goal: 30 s or less, peak memory under 0.75x the file.
* XPlane of about 22 MB (the shared H200 JAX fixture scaled, scale_xplane.scale): ours against
  XProf's ``overview_page`` conversion. Goal: at least 1.5x faster, 1/3 or less of its memory.

Each case runs ours and the peer's process ``--repeat`` times, interleaved, and compares the
medians; the range of each tool's times is printed beside it (this machine is shared: the
range is the noise the ratio has to stand against). Peak memory is the process tree's: the
larger of the process's own peak (``os.wait4``'s ru_maxrss) and the sampled sum of the
proportional set sizes of the process and its children every 10 ms (our Kineto reader forks
a helper for big traces; Pss counts the pages they share once).
The peers live in their own virtual environments (torch-tb-profiler pulls pandas; neither is
a tb_gpuprof dependency):

    python -m venv /tmp/tbp-venv && /tmp/tbp-venv/bin/pip install torch-tb-profiler==0.4.3
    python -m venv /tmp/xprof-venv && /tmp/xprof-venv/bin/pip install xprof
    python benchmarks/bench_report.py --tbp-python /tmp/tbp-venv/bin/python \\
        --xprof-python /tmp/xprof-venv/bin/python

The traces are built once into ``--workdir`` (default /tmp/tb_gpuprof_bench) and reused.
Run it on an idle machine: the goals are ratios, but a busy core slows whichever runs then.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, os.pardir))
KINETO_FIXTURE = os.path.join(ROOT, "tests", "data", "h200", "resnet50_fp32.json.gz")
XPLANE_FIXTURE = os.path.join(ROOT, "tests", "data", "jax_conv_h200.xplane.pb")
SAMPLE_EVERY_S = 0.01
# Installed packages run from compiled bytecode (pip compiles on install): no tool may pay
# for compiling its sources because this shell says not to write them.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
WARM_IMPORTS = {
    "ours": "import tb_gpuprof.cli, tb_gpuprof.pipeline, tb_gpuprof.readers.kineto, "
            "tb_gpuprof.readers.xplane, tb_gpuprof.analysis.report",
    "tbp": "import torch_tb_profiler.profiler.data",
    "xprof": "import xprof.convert.raw_to_tool_data",
}

TBP_SNIPPET = """
import logging, sys, tempfile
from torch_tb_profiler.profiler.data import RunProfileData
logging.disable(logging.WARNING)
with tempfile.TemporaryDirectory() as cache:
    RunProfileData.parse("worker0", "span0", sys.argv[1], cache)
"""
XPROF_SNIPPET = """
import sys
from xprof.convert.raw_to_tool_data import xspace_to_tool_data
data, _ = xspace_to_tool_data([sys.argv[1]], "overview_page", {"use_saved_result": False})
assert data
"""


@dataclass
class Run:
    seconds: float
    peak_mb: float


def _tree_memory_kb(pid: int) -> int:
    """Proportional set size (Pss: a page shared by n processes counts 1/n to each) of
    ``pid`` and its descendants, in KiB; 0 once it is gone."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("Pss:")),
                              0)
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def timed(cmd: list[str]) -> Run:
    """Run ``cmd`` to the end; its wall time and its process tree's peak memory."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
                                env=CHILD_ENV)
        sampled = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            sampled = max(sampled, _tree_memory_kb(proc.pid))
            time.sleep(SAMPLE_EVERY_S)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{cmd[0]} ... failed ({proc.returncode}):\n{tail}")
    return Run(seconds, max(usage.ru_maxrss, sampled) / 1024.0)


def build(kind: str, out: str, size_mb: float, layout: str = "kineto") -> None:
    """Build one input trace in a child process, so this process's peak stays small (a child
    started from it would inherit the peak in its own ru_maxrss)."""
    if os.path.exists(out):
        return
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from bench_parse import build_trace\nfrom scale_xplane import scale\n"
            "kind, out, mb, layout, src = sys.argv[3:8]\n"
            "if kind == 'kineto':\n    build_trace(src, out + '.tmp', float(mb), layout)\n"
            "else:\n    data = open(src, 'rb').read()\n"
            "    one, two = len(scale(data, 1)), len(scale(data, 2))\n"
            "    copies = max(1, round((float(mb) * 1e6 - one) / max(two - one, 1)) + 1)\n"
            "    open(out + '.tmp', 'wb').write(scale(data, copies))\n")
    src = KINETO_FIXTURE if kind == "kineto" else XPLANE_FIXTURE
    subprocess.run([sys.executable, "-c", code, HERE, ROOT, kind, out, str(size_mb), layout,
                    src], check=True)
    os.replace(out + ".tmp", out)


def ours(path: str) -> list[str]:
    return [sys.executable, "-m", "tb_gpuprof", "report", path, "--format", "json"]


def _verdict(ok: bool) -> str:
    return "meets the goal" if ok else "MISSES the goal"


def median_run(runs: list[Run]) -> Run:
    return Run(statistics.median(r.seconds for r in runs),
               statistics.median(r.peak_mb for r in runs))


def _spread(runs: list[Run]) -> str:
    times = [r.seconds for r in runs]
    return f"{min(times):.2f}-{max(times):.2f} s" if len(runs) > 1 else "one run"


def compare(label: str, path: str, peer: str, peer_cmd: list[str] | None,
            speed_goal: float, mem_goal: float, repeat: int) -> bool:
    """Ours and the peer's process, interleaved ``repeat`` times; medians compared."""
    size_mb = os.path.getsize(path) / 1e6
    mine_runs: list[Run] = []
    their_runs: list[Run] = []
    for _ in range(repeat):
        mine_runs.append(timed(ours(path)))
        if peer_cmd is not None:
            their_runs.append(timed(peer_cmd))
    mine = median_run(mine_runs)
    print(f"{label} ({size_mb:.0f} MB): tb-gpuprof report {mine.seconds:.2f} s "
          f"({_spread(mine_runs)}), {mine.peak_mb:.0f} MB peak "
          f"({size_mb / mine.seconds:.0f} MB/s end to end)")
    if peer_cmd is None:
        print(f"  {peer}: not run (no --{'tbp' if 'torch' in peer else 'xprof'}-python)")
        return False
    theirs = median_run(their_runs)
    speed, mem = theirs.seconds / mine.seconds, mine.peak_mb / theirs.peak_mb
    ok = speed >= speed_goal and mem <= mem_goal
    print(f"  {peer}: {theirs.seconds:.2f} s ({_spread(their_runs)}), {theirs.peak_mb:.0f} MB "
          f"peak -> ours is {speed:.2f}x faster (goal >= {speed_goal:g}x) at {mem:.2f}x its "
          f"memory (goal <= {mem_goal:.2f}x): {_verdict(ok)}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tb_gpuprof_bench"))
    ap.add_argument("--kineto-mb", type=float, default=130.0)
    ap.add_argument("--big-mb", type=float, default=2000.0)
    ap.add_argument("--xplane-mb", type=float, default=22.0)
    ap.add_argument("--cases", default="kineto,line,xplane,big",
                    help="which of kineto, line, xplane, big to run (default all)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each tool per case, interleaved; medians compared")
    ap.add_argument("--tbp-python", help="an interpreter with torch-tb-profiler 0.4.3")
    ap.add_argument("--xprof-python", help="an interpreter with xprof")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    paths = {
        "kineto": os.path.join(args.workdir, f"resnet50_{args.kineto_mb:g}mb.pt.trace.json"),
        "line": os.path.join(args.workdir, f"resnet50_{args.kineto_mb:g}mb_line.pt.trace.json"),
        "big": os.path.join(args.workdir, f"resnet50_{args.big_mb:g}mb.pt.trace.json"),
        "xplane": os.path.join(args.workdir, f"jax_conv_{args.xplane_mb:g}mb.xplane.pb"),
    }
    cases = set(args.cases.split(","))
    if unknown := cases - {"kineto", "line", "xplane", "big"}:
        ap.error(f"unknown cases: {', '.join(sorted(unknown))}")
    for case in sorted(cases):
        if case == "xplane":
            build("xplane", paths[case], args.xplane_mb)
        else:
            build("kineto", paths[case], args.big_mb if case == "big" else args.kineto_mb,
                  "line" if case == "line" else "kineto")
    for key, python in (("ours", sys.executable), ("tbp", args.tbp_python),
                        ("xprof", args.xprof_python)):
        if python:  # each tool's bytecode compiled and cached before it is timed
            subprocess.run([python, "-c", WARM_IMPORTS[key]], check=True, env=CHILD_ENV,
                           cwd=ROOT)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
          f"python {sys.version.split()[0]}")

    def tbp(path: str) -> list[str] | None:
        return [args.tbp_python, "-c", TBP_SNIPPET, path] if args.tbp_python else None

    results = []
    for case, label in (("kineto", "Kineto, Kineto's layout"), ("line", "Kineto, one line")):
        if case in cases:
            results.append(compare(label, paths[case], "torch-tb-profiler 0.4.3",
                                   tbp(paths[case]), 20.0, 0.2, args.repeat))
    if "xplane" in cases:
        results.append(compare("XPlane", paths["xplane"], "XProf overview_page",
                               [args.xprof_python, "-c", XPROF_SNIPPET, paths["xplane"]]
                               if args.xprof_python else None, 1.5, 1 / 3, args.repeat))
    if "big" in cases:
        size_mb = os.path.getsize(paths["big"]) / 1e6
        big = timed(ours(paths["big"]))
        ok = big.seconds <= 30.0 and big.peak_mb < 0.75 * size_mb
        print(f"Kineto, big ({size_mb:.0f} MB): tb-gpuprof report {big.seconds:.1f} s "
              f"(goal <= 30 s), {big.peak_mb:.0f} MB peak = {big.peak_mb / size_mb:.2f}x the "
              f"file (goal < 0.75x): {_verdict(ok)}")
        results.append(ok)
    print(f"{sum(results)} of {len(results)} goals met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
