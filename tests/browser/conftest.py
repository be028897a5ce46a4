"""Real browser, real server: Debian's Chromium driven by Playwright against a real
`tensorboard --logdir` over runs made by `tb-gpuprof import` (plus NVML telemetry recorded by
the real sampler over a fake libnvidia-ml, and a run whose report is unreadable).

Locally these tests skip when /usr/bin/chromium is missing; under CI=true they fail instead.
Screenshots go to <repo>/test-artifacts/ (gitignored).
"""

from __future__ import annotations

import io
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, TensorBoardProcess, fixture_path, get_json, run_cli, wait_until
from tests.runs import tiny_cpu_hook_run

from .kineto_synth import hostile_kernels, many_kernels, write_kineto_trace

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = REPO / "test-artifacts"
PLUGIN = "gpuprof"

RUN_KINETO = "transformer_bf16"
RUN_XPLANE = "jax_conv"
RUN_HOSTILE = "hostile"
RUN_UNREADABLE = "unreadable"
RUN_MANY = "many_kernels"
RUN_OUTLIER = "warmup_outlier"
RUN_LOOP = "gpt2_eager"  # a launch-bound loop recorded through the hook (tests/data/h200_loops)
RUN_SYNC = "host_sync"  # per-iteration .item() syncs (tests/data/h200_loops): evidence as a table
RUN_STALE = "stale_report"  # a report stored by an older analysis: the plugin refreshes it
RUN_CPU = "cpu_only"  # a real CPU-only training loop through the hook, written last
RUNS = (RUN_HOSTILE, RUN_XPLANE, RUN_MANY, RUN_KINETO, RUN_UNREADABLE, RUN_OUTLIER, RUN_LOOP,
        RUN_SYNC, RUN_STALE, RUN_CPU)
OLD_GENERATOR = "tb_gpuprof 0.0.9"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)


def chromium_or_skip() -> str:
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{CHROMIUM} is missing but CI=true: install Debian's chromium package")
    pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)")


def record_fake_telemetry(run_dir: Path) -> None:
    """`tb-gpuprof dmon --logdir RUN` code path (real sampler, writer and topology) over a fake
    two-GPU libnvidia-ml with two NVLinks between the GPUs."""
    from tb_gpuprof.nvml.dmon import run_dmon
    from tests.nvml_fake import FakeGpu, FakeNvml

    bus = ["00000000:18:00.0", "00000000:2A:00.0"]
    gpus = [FakeGpu("GPU-aaaa-1111", bus[0], nvlink_peers=[bus[1]] * 2, util=71),
            FakeGpu("GPU-bbbb-2222", bus[1], nvlink_peers=[bus[0]] * 2, util=42)]
    with pytest.MonkeyPatch.context() as mp:
        FakeNvml(gpus).install(mp)
        run_dmon(0.01, 5, str(run_dir), out=io.StringIO(), cuda_visible_devices="0,1")


def write_warmup_outlier_run(run_dir: Path) -> None:
    """A real report plus iteration times whose first is 1000x the rest (cuDNN autotuning,
    compilation), all in one event file as the hooks write them."""
    from tb_gpuprof.analysis.report import build_report
    from tb_gpuprof.readers import load_profile
    from tb_gpuprof.store.writer import EventWriter

    trace = REPO / "tests" / "data" / "h200" / "resnet18_batch8.json.gz"
    report = build_report(load_profile(trace))
    with EventWriter(run_dir) as w:
        for step in range(12):
            w.add_scalar("gpuprof/iteration_time_ms", 100000.0 if step == 0 else 20.0 + step % 3,
                         step=step)
        w.add_report(report, step=11)


def write_stale_run(run_dir: Path) -> None:
    """A run as an older tb_gpuprof left it: the raw trace and its context, and a report whose
    analysis id and figures are not what the installed analysis makes of that trace."""
    from tb_gpuprof.analysis.context import AnalysisContext
    from tb_gpuprof.pipeline import analyse_trace
    from tb_gpuprof.store.writer import EventWriter, save_context, save_raw_trace

    trace = REPO / "tests" / "data" / "h200" / "resnet50_fp32.json.gz"
    report = analyse_trace(str(trace))
    report.update(generator=OLD_GENERATOR, analysis_id="0123456789abcdef", recommendations=[])
    with EventWriter(run_dir) as w:
        w.add_report(report, step=23)
    save_raw_trace(run_dir, str(trace), 23)
    save_context(run_dir, 23, AnalysisContext().to_dict())


def write_unreadable_run(run_dir: Path) -> None:
    """A report from a future tb_gpuprof (schema_version 99): the plugin must answer 422."""
    from tb_gpuprof.store.writer import EventWriter

    with EventWriter(run_dir) as w:
        w.add_report({"schema_version": 99, "kernels": []}, step=5)


@pytest.fixture(scope="session")
def browser_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chromium_or_skip()  # do not spend a minute importing traces for nothing
    logdir = tmp_path_factory.mktemp("browser-logdir")
    run_cli("import", str(fixture_path("kineto_transformer_bf16_h200.json.gz")), "--logdir",
            str(logdir), "--run", RUN_KINETO)
    run_cli("import", str(fixture_path("jax_conv_h200.xplane.pb")), "--logdir", str(logdir),
            "--run", RUN_XPLANE)
    synth = tmp_path_factory.mktemp("synth")
    trace = write_kineto_trace(synth / "hostile.json", hostile_kernels())
    run_cli("import", str(trace), "--logdir", str(logdir), "--run", RUN_HOSTILE)
    trace = write_kineto_trace(synth / "many.json", many_kernels(180), steps=2)
    run_cli("import", str(trace), "--logdir", str(logdir), "--run", RUN_MANY)
    write_warmup_outlier_run(logdir / RUN_OUTLIER)
    run_cli("import", str(REPO / "tests" / "data" / "h200_loops" / "gpt2_eager.json.gz"),
            "--logdir", str(logdir), "--run", RUN_LOOP)
    run_cli("import", str(REPO / "tests" / "data" / "h200_loops" / "host_sync.json.gz"),
            "--logdir", str(logdir), "--run", RUN_SYNC)
    record_fake_telemetry(logdir / RUN_KINETO)
    write_unreadable_run(logdir / RUN_UNREADABLE)
    write_stale_run(logdir / RUN_STALE)
    # last: the most recent run, and it has no GPU work (a real CPU loop through the hook)
    tiny_cpu_hook_run(str(logdir / RUN_CPU), iterations=6)
    return logdir


class Server:
    """A running TensorBoard plus JSON access to the gpuprof routes."""

    def __init__(self, tb: TensorBoardProcess) -> None:
        self.tb = tb
        self.base = tb.base_url

    @property
    def plugin_url(self) -> str:
        """The document TensorBoard puts in the plugin's iframe (plugin_entry.html)."""
        return f"{self.base}/data/plugin_entry.html?name={PLUGIN}"

    def route(self, name: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        status, body = get_json(f"{self.base}/data/plugin/{PLUGIN}/{name}?{query}")
        assert status == 200, f"/{name}?{query} answered {status}: {body}"
        return body

    def route_status(self, name: str, **params: Any) -> tuple[int, Any]:
        query = urllib.parse.urlencode(params)
        return get_json(f"{self.base}/data/plugin/{PLUGIN}/{name}?{query}")


def runs_loaded(base: str, names: tuple[str, ...]) -> bool:
    try:
        status, body = get_json(f"{base}/data/plugin/{PLUGIN}/runs")
    except OSError:
        return False
    if status != 200:
        return False
    have = {r["run"]: r for r in body["runs"]}
    return all(n in have and have[n]["reports"] for n in names)


@pytest.fixture(scope="session")
def server(browser_logdir: Path, tensorboard_factory: Any) -> Server:
    tb = tensorboard_factory(browser_logdir)
    wait_until(lambda: runs_loaded(tb.base_url, RUNS), timeout=120,
               what=f"tensorboard to load runs {RUNS}")
    return Server(tb)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    exe = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


class PageErrors(list):
    pass


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[Any]:
    """A fresh page on the plugin document; fails the test on any uncaught script error."""
    yield from plugin_page(browser, server)


def plugin_page(browser: Any, server: Server) -> Iterator[Any]:
    """:func:`page` for another module's server: ``yield from plugin_page(browser, srv)``."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = context.new_page()
    errors = PageErrors()
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    pg.goto(server.plugin_url)
    pg.wait_for_selector("[data-testid=gpuprof-root]")
    yield pg
    context.close()
    assert not errors, f"uncaught errors in the dashboard: {errors}"


def screenshot(pg: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
