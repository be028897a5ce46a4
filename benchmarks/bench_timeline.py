#!/usr/bin/env python3
"""Timeline benchmark: a 1M-event window through /timeline and the Timeline view.

Writes a synthetic Kineto trace (torch.profiler's layout: per launch an aten op wrapping a
cudaLaunchKernel, the kernel on a GPU stream; ProfilerStep ranges) of about ``--events``
events, with log-normal kernel durations and host gaps (from a fraction of a microsecond to
milliseconds, so bars merge differently at every zoom level), imports it
with the real `tb-gpuprof import`, starts a real `tensorboard --logdir`, then measures:

  * the index build: the first /timeline request of the window (parses the trace once);
  * /timeline over HTTP: ranges from the whole window down to 1/10,000 of it, at random
    offsets, width 3200 px (what the view asks for: twice a 1600 px canvas); p50/p95 against
    the 100 ms goal, and the answer's size against the raw trace's;
  * in headless Chromium at 1600x1000: frame time of wheel zooms and drag pans (input to the
    next animation frame after the redraw, recorded by the view in window.__gpTimelineFrames);
    p50/p95 against the 50 ms goal.

    python benchmarks/bench_timeline.py [--events 1000000] [--requests 200] [--frames 120]
    python benchmarks/bench_timeline.py --smoke   # 30k events, a quick check of the script
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


sys.path.insert(0, str(REPO / "benchmarks"))
from bench_dashboard import CHROMIUM, CHROMIUM_ARGS, cli, wait_for_runs  # noqa: E402

ROUTE_TARGET_MS = 100.0
FRAME_TARGET_MS = 50.0
RUN = "timeline_1m"
KERNELS_PER_STEP = 5000


def write_trace(path: Path, events: int, rng: random.Random) -> Path:
    """A Kineto trace of about ``events`` events (3 per launch), gzipped."""
    launches = events // 3
    steps = max(1, launches // KERNELS_PER_STEP)
    out = []
    t = gpu_t = 1000.0
    for i in range(launches):
        if i % KERNELS_PER_STEP == 0:
            step, step_start = i // KERNELS_PER_STEP, t
        t += rng.lognormvariate(1.0, 1.5)  # host gap: median 2.7 µs, sometimes milliseconds
        op_dur = 3.0 + rng.lognormvariate(0.5, 0.5)
        out.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 40}", "pid": 1, "tid": 1,
                    "ts": round(t, 3), "dur": round(op_dur, 3),
                    "args": {"External id": i + 1, "Input Dims": [[64, 64]],
                             "Input type": ["float"]}})
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                    "tid": 1, "ts": round(t + 1.0, 3), "dur": 1.5,
                    "args": {"correlation": i + 1, "External id": i + 1}})
        gpu_t = max(gpu_t, t + 3.0)
        k_dur = rng.lognormvariate(1.5, 1.2)  # median 4.5 µs
        out.append({"ph": "X", "cat": "kernel", "name": f"void synth_kernel_{i % 3000:04d}()",
                    "pid": 0, "tid": 7, "ts": round(gpu_t, 3), "dur": round(k_dur, 3),
                    "args": {"device": 0, "stream": 7, "correlation": i + 1,
                             "External id": i + 1, "grid": [132, 1, 1], "block": [256, 1, 1],
                             "registers per thread": 64, "shared memory": 0}})
        gpu_t += k_dur + rng.lognormvariate(0.0, 1.0)
        t += op_dur
        if (i + 1) % KERNELS_PER_STEP == 0 or i == launches - 1:
            end = max(t, gpu_t) + 5.0
            out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                        "pid": 1, "tid": 1, "ts": step_start, "dur": end - step_start,
                        "args": {"External id": 0}})
    trace = {"schemaVersion": 1, "traceEvents": out,
             "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
                                   "computeMajor": 9, "computeMinor": 0, "numSms": 132}]}
    with gzip.open(path, "wt", compresslevel=1) as f:
        json.dump(trace, f, separators=(",", ":"))
    del out
    print(f"wrote {events:,} events in {steps} steps to {path}", file=sys.stderr)
    return path


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else values[0]


def route(base: str, **params: object) -> tuple[float, int, dict]:
    url = f"{base}/data/plugin/gpuprof/timeline?{urllib.parse.urlencode(params)}"
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        body = r.read()
    ms = 1000 * (time.perf_counter() - t)
    return ms, len(body), json.loads(body)


def bench_route(base: str, requests: int, rng: random.Random) -> dict[str, object]:
    build_ms, _, whole = route(base, run=RUN, width=3200)
    span = whole["span_us"]
    times, sizes, bars = [], [], []
    for i in range(requests):
        frac = 10 ** -(i % 5)  # whole window, 1/10, ..., 1/10,000
        lo = rng.uniform(0, span * (1 - frac))
        ms, size, body = route(base, run=RUN, width=3200, start_us=lo, end_us=lo + span * frac)
        times.append(ms)
        sizes.append(size)
        bars.append(len(body["bars"]["start"]))
    return {"events": whole["events"], "index_build_ms": round(build_ms),
            "p50_ms": round(p(times, 50), 1), "p95_ms": round(p(times, 95), 1),
            "max_ms": round(max(times), 1), "median_bytes": int(statistics.median(sizes)),
            "max_bars": max(bars), "target_ms": ROUTE_TARGET_MS}


def bench_frames(base: str, frames: int) -> dict[str, object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(f"{base}/data/plugin_entry.html?name=gpuprof")
        page.select_option("[data-testid=run-select]", RUN)
        page.wait_for_selector("[data-testid=view-dashboard]", timeout=300_000)
        page.click("nav.tabs button[data-tab=timeline]")
        page.wait_for_function("() => +document.querySelector('[data-testid=timeline-canvas]')"
                               "?.dataset.bars > 0", timeout=300_000)
        box = page.locator("[data-testid=timeline-canvas]").bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + 60
        page.evaluate("() => { window.__gpTimelineFrames = []; }")
        page.mouse.move(x, y)
        for i in range(frames):
            phase = (i // 10) % 4  # zoom in, pan, zoom out, pan back: all zoom levels
            if phase in (0, 2):
                page.mouse.wheel(0, -240 if phase == 0 else 240)
            else:
                page.mouse.down()
                page.mouse.move(x + (80 if phase == 1 else -80), y, steps=4)
                page.mouse.up()
                page.mouse.move(x, y)
            page.wait_for_timeout(40 if i % 10 else 250)  # every 10th: let the new bars arrive
        page.wait_for_timeout(500)
        times = page.evaluate("() => window.__gpTimelineFrames")
        bars = int(page.locator("[data-testid=timeline-canvas]").get_attribute("data-bars"))
        browser.close()
    return {"frames": len(times), "p50_ms": round(p(times, 50), 1),
            "p95_ms": round(p(times, 95), 1), "max_ms": round(max(times), 1),
            "bars_drawn_last": bars, "target_ms": FRAME_TARGET_MS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--smoke", action="store_true", help="30k events, few requests and frames")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    if args.smoke:
        args.events, args.requests, args.frames = 30_000, 20, 20
    from tests.conftest import start_tensorboard

    rng = random.Random(17)
    with tempfile.TemporaryDirectory(prefix="bench_timeline_") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        trace = write_trace(root / "trace.json.gz", args.events, rng)
        cli("import", str(trace), "--logdir", str(root / "logs"), "--run", RUN)
        prep_s = time.perf_counter() - t
        raw = os.path.getsize(trace)
        tb = start_tensorboard(root / "logs", "--reload_interval=0", log_dir=root)
        try:
            wait_for_runs(tb.base_url, [RUN])
            routes = bench_route(tb.base_url, args.requests, rng)
            frames = bench_frames(tb.base_url, args.frames)
        finally:
            tb.stop()
    result = {"events": routes["events"], "trace_bytes": raw, "prepare_s": round(prep_s, 1),
              "route": routes, "frames": frames}
    print(json.dumps(result, indent=2))
    print(f"/timeline p95 {routes['p95_ms']} ms (goal {ROUTE_TARGET_MS:.0f}): "
          f"{routes['p95_ms'] / ROUTE_TARGET_MS:.2f}x the goal; answer "
          f"{routes['median_bytes'] / 1e3:.0f} kB median for {routes['events']:,} events")
    print(f"pan/zoom frame p95 {frames['p95_ms']} ms (goal {FRAME_TARGET_MS:.0f}): "
          f"{frames['p95_ms'] / FRAME_TARGET_MS:.2f}x the goal")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
