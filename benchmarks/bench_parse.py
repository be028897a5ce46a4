"""Trace-parsing benchmark: tb_gpuprof's Kineto reader against torch-tb-profiler 0.4.3.

Builds a large Kineto trace by repeating the real H200 fixture's events (timestamps shifted
by one trace span per copy, correlation/external/flow ids by a fixed stride, so every copy is
a distinct, well-formed set of iterations) in Kineto's own layout, then runs each tool in its
own subprocess, one after the other, so each peak RSS is its own:

  * ``tb_gpuprof``: ``read_kineto(path)`` (and, when the analysis exists,
    ``build_report(profile)`` too: the end-to-end equivalent of what TensorBoard's profiler
    plugin does on load);
  * ``torch-tb-profiler``: ``RunProfileData.parse(...)`` - its whole load of one trace
    (json.loads + event tree + its aggregations), what TensorBoard runs when a run is opened.

Prints both wall times (of the parse call; interpreter start and imports excluded), both peak
RSS figures (whole process) and the two ratios. Needs ``pip install torch-tb-profiler==0.4.3``
(it pulls pandas; benchmark only, not a tb_gpuprof dependency).

    python benchmarks/bench_parse.py                 # ~518 MB trace, as in issue 2
    python benchmarks/bench_parse.py --size-mb 50    # quicker
    python benchmarks/bench_parse.py --size-mb 2000 --layout line --with-report --skip-baseline
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "tests", "data",
                       "kineto_transformer_bf16_h200.json.gz")
TS_STRIDE_US = 200_000.0  # > the fixture's 151.5 ms span: copies follow each other
ID_STRIDE = 100_000  # > the fixture's largest correlation / external / flow id
_SHIFTED = re.compile(
    rb'("ts": |"External id": |"correlation": |"id": |"Python id": |"Python parent id": )'
    rb"(\d+(?:\.\d+)?)")


_LAYOUT_SPACE = re.compile(rb"\n\s*")


def build_trace(fixture: str, out_path: str, size_mb: float,
                layout: str = "kineto") -> tuple[int, int]:
    """Write a trace of about ``size_mb`` MB; return (bytes, events).

    ``layout``: "kineto" (Kineto's own writer: one event per "  {\\n...\\n  }," block) or
    "line" (the whole trace on one line, as ``json.dump`` and trace-merging tools write it:
    every newline and the indentation after it removed; a raw newline is never inside a JSON
    string, so this changes the layout only).
    """
    with gzip.open(fixture, "rb") as f:
        text = f.read()
    m = re.search(rb'"traceEvents"\s*:\s*\[', text)
    if m is None:
        raise SystemExit(f"{fixture}: not a Kineto trace")
    head, body = text[: m.end()], text[m.end():]
    close = body.rindex(b"\n  ]")
    body, trailer = body[:close], body[close:]
    blocks = body.split(b"\n  },")  # Kineto writes one event per "  {\n...\n  }," block
    blocks = [b + b"\n  }" for b in blocks[:-1]] + [blocks[-1]]
    once = [b for b in blocks if b'"ph": "M"' in b or b'"ph": "i"' in b or b'"Trace"' in b]
    repeated = [b for b in blocks if b not in once]
    template = b",".join(repeated)
    if layout == "line":
        head, template, trailer = (_LAYOUT_SPACE.sub(b"", x) for x in (head, template, trailer))
        once = [_LAYOUT_SPACE.sub(b"", b) for b in once]
    elif layout != "kineto":
        raise ValueError(f"unknown layout {layout!r}")
    copies = max(1, round(size_mb * 1e6 / len(template)))

    def shift(k: int):
        def sub(m: re.Match[bytes]) -> bytes:
            key, num = m.group(1), m.group(2)
            if key == b'"ts": ':
                return key + f"{float(num) + k * TS_STRIDE_US:.3f}".encode()
            return key + str(int(num) + k * ID_STRIDE).encode()
        return sub

    with open(out_path, "wb") as out:
        out.write(head)
        for k in range(copies):
            out.write(template if k == 0 else _SHIFTED.sub(shift(k), template))
            out.write(b",")
        out.write(b",".join(once))
        out.write(trailer)
        size = out.tell()
    return size, copies * len(repeated) + len(once)


def _peak_rss_mb() -> float:
    """Peak RSS of this process. VmHWM belongs to the address space, which exec replaces;
    ru_maxrss would carry over the parent's peak (the trace builder's) into the child."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_one(tool: str, path: str, with_report: bool = False) -> dict[str, float | str]:
    """Runs inside the child process: parse once, report wall time and peak RSS."""
    result: dict[str, float | str] = {}
    if tool == "tb_gpuprof":
        from tb_gpuprof.readers.kineto import read_kineto

        base = _peak_rss_mb()
        t0 = time.perf_counter()
        profile = read_kineto(path)
        result["parse_s"] = time.perf_counter() - t0
        result["parse_peak_mb"] = _peak_rss_mb()
        result["events"] = float(profile.metadata.get("events", 0))
        if with_report:
            from tb_gpuprof.analysis.report import build_report

            t1 = time.perf_counter()
            build_report(profile)
            result["report_s"] = time.perf_counter() - t1
    else:
        import logging

        from torch_tb_profiler.profiler.data import RunProfileData

        logging.disable(logging.WARNING)
        base = _peak_rss_mb()
        with tempfile.TemporaryDirectory() as cache:
            t0 = time.perf_counter()
            RunProfileData.parse("worker0", "span0", path, cache)
            result["parse_s"] = time.perf_counter() - t0
        result["parse_peak_mb"] = _peak_rss_mb()
    result["base_mb"] = base
    result["peak_mb"] = _peak_rss_mb()
    return result


def measure(tool: str, path: str, with_report: bool = False) -> dict[str, float | str]:
    cmd = [sys.executable, __file__, "--run-one", tool, path]
    if with_report:
        cmd.append("--with-report")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=518.0,
                        help="size of the generated trace (default 518, as in issue 2)")
    parser.add_argument("--fixture", default=os.path.normpath(FIXTURE))
    parser.add_argument("--layout", choices=("kineto", "line"), default="kineto",
                        help="Kineto's own layout or the whole trace on one line")
    parser.add_argument("--keep", metavar="PATH", help="write the trace here and keep it")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="measure tb_gpuprof only (torch-tb-profiler not installed)")
    parser.add_argument("--with-report", action="store_true",
                        help="also time tb_gpuprof's build_report on the parsed profile")
    parser.add_argument("--run-one", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_one:
        print(json.dumps(run_one(*args.run_one, with_report=args.with_report)))
        return 0

    tmp = None
    if args.keep:
        path = args.keep
    else:
        tmp = tempfile.NamedTemporaryFile(suffix=".pt.trace.json", delete=False)
        tmp.close()
        path = tmp.name
    try:
        t0 = time.perf_counter()
        size, events = build_trace(args.fixture, path, args.size_mb, args.layout)
        print(f"trace: {path}: {size / 1e6:.0f} MB, {events:,} events "
              f"(built in {time.perf_counter() - t0:.0f} s)")
        print(f"load average before: {os.getloadavg()[0]:.1f} (on {os.cpu_count()} CPUs)")
        ours = measure("tb_gpuprof", path, args.with_report)
        line = (f"tb_gpuprof read_kineto: {ours['parse_s']:.2f} s, peak RSS "
                f"{ours['parse_peak_mb']:.0f} MB (interpreter+imports {ours['base_mb']:.0f} MB)")
        if "report_s" in ours:
            line += (f"; build_report +{ours['report_s']:.2f} s, "
                     f"peak RSS then {ours['peak_mb']:.0f} MB")
        print(line)
        if args.skip_baseline:
            return 0
        theirs = measure("torch_tb_profiler", path)
        print(f"torch-tb-profiler 0.4.3 RunProfileData.parse: {theirs['parse_s']:.2f} s, "
              f"peak RSS {theirs['parse_peak_mb']:.0f} MB (interpreter+imports "
              f"{theirs['base_mb']:.0f} MB)")
        print(f"speed-up (their time / ours): {theirs['parse_s'] / ours['parse_s']:.1f}x "
              f"(goal >= 10x)")
        mem = ours["parse_peak_mb"] / theirs["parse_peak_mb"]
        print(f"memory (our peak / theirs): {mem:.3f} = 1/{1 / mem:.1f} (goal <= 1/5)")
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        if "report_s" in ours:
            total = ours["parse_s"] + ours["report_s"]
            print(f"end to end (read + report) vs theirs: {theirs['parse_s'] / total:.1f}x")
    finally:
        if tmp is not None:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
