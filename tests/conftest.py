"""Shared test fixtures: the real H200 profiles, imported log directories, a real TensorBoard.

Fixture profiles are looked up in $TB_GPUPROF_FIXTURES, then <repo>/shared/fixtures, then
<repo>/../shared/fixtures, then tests/data; a missing one fails the test (never skips it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
KINETO_FIXTURE = "kineto_transformer_bf16_h200.json.gz"
XPLANE_FIXTURE = "jax_conv_h200.xplane.pb"
TENSORBOARD_START_TIMEOUT_S = 120.0
_TB_URL_RE = re.compile(r"TensorBoard \S+ at (http://[^/\s]+)/")


def fixture_path(name: str) -> Path:
    """Path of a real fixture profile; fails the calling test when it cannot be found."""
    candidates = []
    if os.environ.get("TB_GPUPROF_FIXTURES"):
        candidates.append(Path(os.environ["TB_GPUPROF_FIXTURES"]))
    candidates += [REPO / "shared" / "fixtures", REPO.parent / "shared" / "fixtures",
                   REPO / "tests" / "data"]
    for d in candidates:
        if (d / name).is_file():
            return d / name
    pytest.fail(f"fixture profile {name} not found in {', '.join(map(str, candidates))}")


@pytest.fixture(scope="session")
def kineto_trace() -> Path:
    return fixture_path(KINETO_FIXTURE)


@pytest.fixture(scope="session")
def xplane_trace() -> Path:
    return fixture_path(XPLANE_FIXTURE)


def run_cli(*args: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess:
    """`tb-gpuprof ARGS` in a fresh interpreter (the installed console script's code path)."""
    proc = subprocess.run([sys.executable, "-m", "tb_gpuprof", *args], capture_output=True,
                          text=True, timeout=300, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"tb-gpuprof {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def imported_logdir(tmp_path_factory: pytest.TempPathFactory, kineto_trace: Path,
                    xplane_trace: Path) -> Path:
    """A log directory with both real fixtures imported by `tb-gpuprof import` (runs "kineto"
    and "xplane"). Read-only for tests: copy it to change it."""
    logdir = tmp_path_factory.mktemp("imported")
    run_cli("import", str(kineto_trace), "--logdir", str(logdir), "--run", "kineto")
    run_cli("import", str(xplane_trace), "--logdir", str(logdir), "--run", "xplane")
    return logdir


def http_get(url: str, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a GET, for error statuses too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get_json(url: str) -> tuple[int, Any]:
    status, _, body = http_get(url)
    return status, json.loads(body)


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
               interval: float = 0.25) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class TensorBoardProcess:
    base_url: str
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def wsgi_client(logdir: Path | str) -> Any:
    """A werkzeug test client over TensorBoard's own WSGI app with this plugin, the data
    provider built as ``--load_fast=false`` builds it (TensorBoard's Python loader)."""
    from tensorboard import program
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_ingester
    from tensorboard.plugins.core import core_plugin
    from werkzeug.test import Client

    from tb_gpuprof.plugin.loader import GpuProfPluginLoader

    plugins = [core_plugin.CorePluginLoader, GpuProfPluginLoader]
    tb = program.TensorBoard(plugins=plugins)
    tb.configure(argv=["tensorboard", "--logdir", str(logdir), "--load_fast=false",
                       "--reload_interval=0", "--reload_task=blocking"])
    ingester = data_ingester.LocalDataIngester(tb.flags)
    ingester.start()
    app = application.TensorBoardWSGIApp(tb.flags, plugins, ingester.data_provider, None,
                                         ingester.deprecated_multiplexer)
    return Client(app)


def start_tensorboard(logdir: Path | str, *extra_args: str, log_dir: Path) -> TensorBoardProcess:
    """Start `tensorboard --logdir DIR --port 0` and return once it prints its URL."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"tensorboard-{time.monotonic_ns()}.log"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", "0",
             "--host", "127.0.0.1", *extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    tb = TensorBoardProcess("", proc, log_path)
    deadline = time.monotonic() + TENSORBOARD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        m = _TB_URL_RE.search(tb.log())
        if m:
            tb.base_url = m.group(1)
            return tb
        if proc.poll() is not None:
            pytest.fail(f"tensorboard exited with {proc.returncode}:\n{tb.log()[-3000:]}")
        time.sleep(0.2)
    tb.stop()
    pytest.fail(f"tensorboard printed no URL in {TENSORBOARD_START_TIMEOUT_S:.0f}s:\n"
                f"{tb.log()[-3000:]}")


@pytest.fixture(scope="session")
def tensorboard_factory(tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[Callable[..., TensorBoardProcess]]:
    """``factory(logdir, *extra_args)`` starts a real TensorBoard; all are stopped at the end."""
    started: list[TensorBoardProcess] = []
    log_dir = tmp_path_factory.mktemp("tensorboard-logs")

    def factory(logdir: Path | str, *extra_args: str) -> TensorBoardProcess:
        tb = start_tensorboard(logdir, *extra_args, log_dir=log_dir)
        started.append(tb)
        return tb

    yield factory
    for tb in started:
        tb.stop()


@pytest.fixture(scope="session")
def real_profiles(kineto_trace: Path, xplane_trace: Path) -> dict[str, Any]:
    """The fixture traces read by the real readers: {"kineto": Profile, "xplane": Profile}."""
    from tb_gpuprof.readers import load_profile

    return {"kineto": load_profile(str(kineto_trace)), "xplane": load_profile(str(xplane_trace))}


@pytest.fixture(scope="session")
def real_reports(real_profiles: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The real report builder over each fixture profile (whole trace, default key)."""
    from tb_gpuprof.analysis.report import build_report

    return {name: build_report(profile) for name, profile in real_profiles.items()}


WINDOW_RUN = "windows"
WINDOW_COUNT = 14  # more than the Python loader's default of 10 tensor samples per tag


@dataclass
class GpuProfLogdir:
    """A log directory with one run of every kind the plugin must handle.

    runs: kineto, xplane (imported by the CLI), windows (WINDOW_COUNT report windows at steps
    0, 10, 20, ...), future (schema_version 99), corrupt (a report blob that is not zlib),
    truncated (second of two reports cut mid-record), scalars_only, telemetry (NVML-style
    scalars and a topology blob), linked (its raw trace is a symlink out of the logdir).
    """

    path: Path
    expected: dict[tuple[str, int], dict[str, Any]]  # (run, step) -> report as JSON

    def latest(self, run: str) -> dict[str, Any]:
        return self.expected[max(k for k in self.expected if k[0] == run)]
    outside_file: Path  # what linked's trace symlink points at


def _as_json(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


@pytest.fixture(scope="session")
def gpuprof_logdir(tmp_path_factory: pytest.TempPathFactory, imported_logdir: Path,
                   real_profiles: dict[str, Any], real_reports: dict[str, dict[str, Any]]
                   ) -> GpuProfLogdir:
    import copy
    import shutil

    from tb_gpuprof.analysis.report import build_report
    from tb_gpuprof.store import layout, schema
    from tb_gpuprof.store.reader import load_run_report, stored_reports
    from tb_gpuprof.store.writer import EventWriter, _blob_summary

    root = tmp_path_factory.mktemp("gpuprof_logdir")
    logdir = root / "logs"
    shutil.copytree(imported_logdir, logdir)
    expected: dict[tuple[str, int], dict[str, Any]] = {}
    for run in ("kineto", "xplane"):
        (stored,) = stored_reports(str(logdir / run))
        expected[(run, stored.step)] = load_run_report(str(logdir / run))

    # Windows of the real kineto trace, one iteration each, alternating with the xplane one;
    # the generator field marks the window so that a mix-up between steps shows.
    n_iter = real_reports["kineto"]["iterations"]["count"]
    with EventWriter(logdir / WINDOW_RUN) as w:
        for i in range(WINDOW_COUNT):
            if i % 3 == 2:
                rep = copy.deepcopy(real_reports["xplane"])
            else:
                rep = build_report(real_profiles["kineto"], iter_start=i % n_iter,
                                   iter_stop=i % n_iter + 1)
            rep["generator"] = f"{rep.get('generator')} window {i}"
            w.add_scalar(layout.ITERATION_TIME_TAG, rep["iterations"]["mean_ms"] or 0.0, i * 10)
            w.add_report(rep, step=i * 10)
            expected[(WINDOW_RUN, i * 10)] = _as_json(rep)

    future = copy.deepcopy(real_reports["kineto"])
    future["schema_version"] = 99
    with EventWriter(logdir / "future") as w:
        w.add_report(future, step=3)

    with EventWriter(logdir / "corrupt") as w:
        content = schema.plugin_content("report", 1)
        summary = _blob_summary(layout.report_tag(3), b"this is not zlib data", content)
        w._write(w._event(summary, 3, None), flush=True)

    with EventWriter(logdir / "truncated") as w:
        w.add_report(real_reports["xplane"], step=1)
        cut_at = os.path.getsize(w.path) + 200
        w.add_report(real_reports["kineto"], step=2)
    with open(w.path, "r+b") as f:
        f.truncate(cut_at)
    expected[("truncated", 1)] = _as_json(real_reports["xplane"])

    with EventWriter(logdir / "scalars_only") as w:
        for s in range(5):
            w.add_scalar(layout.ITERATION_TIME_TAG, 30.0 + s, s)

    with EventWriter(logdir / "telemetry") as w:
        for s in range(20):
            w.add_scalars({"gpuprof/gpu0/sm_util_pct": 90.0 + s % 5, "gpuprof/gpu0/power_w":
                           600.0 + s, "gpuprof/gpu1/power_w": 100.0}, s)
        w.add_json(layout.TOPOLOGY_TAG, {"gpus": [{"index": 0, "name": "NVIDIA H200"}]}, 0)

    outside = root / "secret.txt"
    outside.write_text("outside the logdir")
    with EventWriter(logdir / "linked") as w:
        w.add_report(real_reports["xplane"], step=1)
    trace_dir = logdir / "linked" / "plugins" / "gpuprof" / "traces" / "step_1"
    trace_dir.mkdir(parents=True)
    (trace_dir / "trace.json").symlink_to(outside)
    expected[("linked", 1)] = _as_json(real_reports["xplane"])
    return GpuProfLogdir(logdir, expected, outside)


# Every report built in the test session (here, in CLI subprocesses and in the hooks' analysis
# child processes, which inherit the environment) is validated against the typed schema and a
# mismatch raises (tb_gpuprof/analysis/schema.py).
os.environ["TB_GPUPROF_STRICT_SCHEMA"] = "1"
