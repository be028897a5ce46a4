"""One answer per run: a report that an older analysis stored is rebuilt by the plugin from
the run's raw trace and stored context, the dashboard says so, and the CLI (`report RUN`,
`report RUN --reanalyze`, `compare`) gives the same answer. Real Chromium, real TensorBoard."""

from __future__ import annotations

import json

from tests.conftest import run_cli

from .conftest import OLD_GENERATOR, RUN_CPU, RUN_KINETO, RUN_STALE, screenshot
from .dom import select_run


def test_a_stale_report_is_refreshed_and_the_dashboard_says_so(page, server) -> None:
    select_run(page, RUN_STALE)
    notice = page.locator("[data-testid=refreshed-notice]")
    notice.wait_for(timeout=60_000)  # the first request re-analyses the trace
    text = notice.inner_text()
    assert "Refreshed report" in text and OLD_GENERATOR in text, text
    # the refreshed report's advice, not the stored empty list
    assert page.locator("[data-testid=recommendation]").count() >= 1
    screenshot(page, "refreshed_report")
    select_run(page, RUN_KINETO)  # a current report: no notice
    page.wait_for_selector("[data-testid=view-dashboard]")
    assert page.locator("[data-testid=refreshed-notice]").count() == 0


def test_plugin_and_cli_give_one_answer_for_the_stale_run(server, browser_logdir) -> None:
    route = server.route("report", run=RUN_STALE)
    assert route["refreshed"]["from_generator"] == OLD_GENERATOR
    assert route["refreshed"]["context"] == "stored"
    run_dir = str(browser_logdir / RUN_STALE)
    cli = json.loads(run_cli("report", run_dir, "--format", "json").stdout)
    again = json.loads(run_cli("report", run_dir, "--reanalyze", "--format", "json").stdout)
    assert cli == route
    assert again == route
    assert [r["id"] for r in route["recommendations"]][:1] == ["tf32"]  # FP32 ResNet-50
    # compare reads the same refreshed report (the compare of a run with itself)
    cmp = json.loads(run_cli("compare", run_dir, run_dir, "--format", "json").stdout)
    assert cmp["a"] == cmp["b"]
    assert cmp["a"]["mfu_pct"] == route["throughput"]["mfu_pct"]
    assert cmp["a"]["tensor_core_pct"] == route["tensor_cores"]["tc_pct"]


def test_a_cpu_only_run_is_listed_without_gpu_work(server) -> None:
    runs = {r["run"]: r for r in server.route("runs")["runs"]}
    assert runs[RUN_CPU]["gpu_work"] is False
    assert runs[RUN_KINETO]["gpu_work"] is True
