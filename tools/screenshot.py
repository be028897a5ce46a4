#!/usr/bin/env python3
"""Screenshot of the gpuprof dashboard as TensorBoard shows it (for the README and docs).

Starts `tensorboard --logdir LOGDIR --port 0`, opens its page on the GPU Prof tab in headless
Chromium, picks a run and a view, makes the window tall enough for the whole view and saves
a PNG. Needs Playwright (the Python package) and a Chromium (Debian's /usr/bin/chromium by
default; `--chromium` for another).

    python tools/screenshot.py LOGDIR docs/img/dashboard.png [--run RUN] [--view dashboard]
                               [--width 1440] [--height H] [--dark]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWS = ("dashboard", "kernels", "roofline", "iterations", "timeline", "memory", "gpu", "compare")
URL_RE = re.compile(r"TensorBoard \S+ at (http://[^/\s]+)/")


def start_tensorboard(logdir: str, log_path: str, timeout: float = 180.0
                      ) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
                                 "--port", "0", "--host", "127.0.0.1"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, errors="replace") as f:
            m = URL_RE.search(f.read())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    proc.kill()
    with open(log_path, errors="replace") as f:
        raise SystemExit(f"tensorboard did not start:\n{f.read()[-2000:]}")


def wait_for_run(base: str, run: str | None, timeout: float = 180.0) -> str:
    """The run to show (``run`` or the first readable one) once TensorBoard lists it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/data/plugin/gpuprof/runs", timeout=30) as r:
                runs = json.loads(r.read())["runs"]
        except OSError:
            runs = []
        ready = [x["run"] for x in runs if x["reports"] and not x["error"]]
        if run is None and ready:
            return ready[0]
        if run is not None and run in ready:
            return run
        time.sleep(0.5)
    raise SystemExit(f"no readable gpuprof run {run or ''} in the log directory after "
                     f"{timeout:.0f}s")


def capture(base: str, run: str | None, out: str, view: str, width: int, dark: bool,
            chromium: str, height: int | None = None) -> str:
    """Screenshot ``view`` of ``run`` (None: the run the dashboard opens on); that run."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": width, "height": height or 900},
                                  color_scheme="dark" if dark else "light",
                                  device_scale_factor=1)
        page = ctx.new_page()
        page.goto(f"{base}/#gpuprof")
        iframe = page.wait_for_selector('iframe[src*="plugin_entry.html?name=gpuprof"]',
                                        state="attached", timeout=120_000)
        frame = iframe.content_frame()
        frame.wait_for_selector("[data-testid=gpuprof-root]", timeout=60_000)
        frame.wait_for_selector("[data-testid=view-dashboard]", timeout=120_000)
        if run is not None:
            frame.select_option("[data-testid=run-select]", run)
        shown = frame.locator("[data-testid=run-select]").input_value()
        frame.click(f"nav.tabs button[data-tab={view}]")
        frame.wait_for_selector(f"[data-testid=view-{view}]", timeout=60_000)
        page.wait_for_timeout(1500)  # charts draw in effects after the first paint
        if height is None:  # the whole view; with --height: that first screen only
            content = frame.evaluate("document.documentElement.scrollHeight")
            top = iframe.bounding_box()["y"]
            page.set_viewport_size({"width": width, "height": int(top + content + 8)})
            page.wait_for_timeout(800)  # charts resize to the new size
        page.screenshot(path=out)
        browser.close()
    return shown


def main() -> int:
    ap = argparse.ArgumentParser(description="Screenshot of the gpuprof dashboard in TensorBoard")
    ap.add_argument("logdir")
    ap.add_argument("out", help="PNG file to write")
    ap.add_argument("--run", default=None,
                    help="run to show (default: the one the dashboard opens on)")
    ap.add_argument("--view", choices=VIEWS, default="dashboard")
    ap.add_argument("--width", type=int, default=1440)
    ap.add_argument("--height", type=int, default=None,
                    help="a first screen of this height (default: the whole view)")
    ap.add_argument("--dark", action="store_true", help="dark color scheme")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    if not os.path.isdir(args.logdir):
        print(f"screenshot: error: {args.logdir}: not a directory", file=sys.stderr)
        return 2
    if not os.path.exists(args.chromium):
        print(f"screenshot: error: no Chromium at {args.chromium} (apt-get install chromium)",
              file=sys.stderr)
        return 2
    with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as log:
        log_path = log.name
    proc, base = start_tensorboard(args.logdir, log_path)
    try:
        wait_for_run(base, args.run)
        shown = capture(base, args.run, args.out, args.view, args.width, args.dark,
                        args.chromium, args.height)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(log_path)
    print(f"wrote {args.out} (run {shown}, view {args.view})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
