"""Each view of the gpuprof dashboard shows the data the plugin routes answer, in a real
Chromium against a real TensorBoard over imported real profiles."""

from __future__ import annotations

import pytest

from .conftest import (
    RUN_HOSTILE,
    RUN_KINETO,
    RUN_LOOP,
    RUN_OUTLIER,
    RUN_UNREADABLE,
    RUN_XPLANE,
    screenshot,
)
from .dom import column, eventually, fmt_ms, fmt_num, fmt_pct, fmt_us, open_tab, select_run


@pytest.mark.parametrize("run", [RUN_KINETO, RUN_XPLANE])
def test_dashboard_view_shows_the_report(page, server, run) -> None:
    report = server.route("report", run=run)
    select_run(page, run)
    page.wait_for_selector("[data-testid=view-dashboard]")
    it = report["iterations"]
    eventually(lambda: page.locator("[data-testid=card-iter] .value").text_content(),
               fmt_ms(it["mean_ms"]), what="average iteration card")
    assert page.locator("[data-testid=card-count] .value").text_content() == fmt_num(it["count"])
    assert page.locator("[data-testid=card-gputime] .value").text_content() == \
        fmt_us(report["gpu_time_us"])
    tc = report["tensor_cores"]
    # the share of GPU time on Tensor Cores is the big number (issue 17), efficiency below it
    assert page.locator("[data-testid=card-tc] .value").text_content() == fmt_pct(tc["tc_pct"])
    assert fmt_pct(tc["tc_kernel_efficiency_pct"]) in \
        page.locator("[data-testid=card-tc] .sub").text_content()
    mfu = (report.get("throughput") or {}).get("mfu_pct")
    assert page.locator("[data-testid=card-mfu] .value").text_content() == \
        (fmt_pct(mfu) if mfu is not None else "—")

    top = report["kernels"][:10]
    assert column(page, "top-kernels", "name") == [k["name"] for k in top]
    assert column(page, "top-kernels", "count") == [fmt_num(k["count"]) for k in top]
    assert column(page, "top-kernels", "total_us") == [fmt_us(k["total_us"]) for k in top]
    assert column(page, "top-kernels", "category") == [k["category"] for k in top]
    # the full name is the hover text of a (possibly truncated) name cell
    first = page.locator("[data-testid=top-kernels] tbody td[data-col=name] span").first
    assert first.get_attribute("title").startswith(top[0]["name"])

    pie_rows = page.locator("[data-testid=tc-table] tr").all_text_contents()
    assert fmt_pct(tc["tc_pct"]) in pie_rows[0] and fmt_pct(tc["memory_pct"]) in pie_rows[3]
    for chart in ("iter-chart", "tc-pie", "breakdown-chart"):
        assert page.locator(f"[data-testid={chart}] canvas").count() >= 1, chart

    recs = report["recommendations"]
    cards = page.locator("[data-testid=recommendation]")
    assert cards.count() == len(recs)
    for i, rec in enumerate(recs):
        card = cards.nth(i)
        assert card.locator("h3").text_content() == rec["title"]
        assert rec["problem"] in card.text_content()
        for key, label in (("pytorch", "PyTorch"), ("keras", "Keras"), ("jax", "JAX")):
            if rec["fix"].get(key):
                card.get_by_role("tab", name=label).click()
                assert card.locator("[data-testid=fix]").text_content() == rec["fix"][key]

    system = page.locator("[data-testid=system]").text_content()
    assert report["system"]["gpu_name"] in system
    screenshot(page, f"dashboard-{run}")


def test_iterations_view_has_one_bar_group_per_iteration(page, server) -> None:
    report = server.route("report", run=RUN_KINETO)
    items = report["iterations"]["items"]
    select_run(page, RUN_KINETO)
    open_tab(page, "iterations")
    page.wait_for_selector("[data-testid=iterations-table]")
    rows = page.locator("[data-testid=iterations-table] tbody tr")
    assert rows.count() == len(items)
    for i, item in enumerate(items):
        cells = rows.nth(i).locator("td").all_text_contents()
        assert cells[1] == fmt_ms(item["wall_ms"])
        assert cells[3] == fmt_ms(item["breakdown_ms"]["tc_compute"])
        assert cells[-1] == fmt_ms(item["breakdown_ms"]["idle"])
    assert page.locator("[data-testid=iterations-chart] canvas").count() >= 1
    screenshot(page, "iterations")


KEY_CHARTS = ("sm", "tensor", "dram", "power", "memory", "clocks")


def test_gpu_view_is_curated_key_charts_then_all_metrics(page, server) -> None:
    tel = server.route("telemetry", run=RUN_KINETO)
    assert tel["series"], "the fixture run should hold NVML scalars"
    by_metric: dict[str, list] = {}
    for key, points in tel["series"].items():
        by_metric.setdefault(key.split("/", 1)[1], []).extend(p[2] for p in points)
    flat = {m for m, vs in by_metric.items() if not any(v != 0 for v in vs)}
    assert flat, "the fake GPUs report some metrics as zero (encoder, decoder)"
    select_run(page, RUN_KINETO)
    open_tab(page, "gpu")
    page.wait_for_selector("[data-testid=key-charts]")
    panels = page.locator("[data-testid=key-charts] > section")
    ids = [p.get_attribute("data-testid").removeprefix("key-chart-") for p in panels.all()]
    assert ids == [c for c in KEY_CHARTS if c in ids] and {"sm", "power", "memory"} <= set(ids)
    in_key = set()
    for p in panels.all():
        assert p.locator("canvas").count() >= 1
        in_key |= set(p.locator("[data-metrics]").get_attribute("data-metrics").split(","))
    assert "sm_util_pct" in in_key and "power_limit_w" in in_key
    # always-zero metrics are named, not drawn; the rest is one click away
    hidden = page.locator("[data-testid=hidden-metrics]").get_attribute("data-metrics").split(",")
    assert set(hidden) == flat - in_key
    assert page.locator("[data-testid=all-metrics] canvas").count() == 0
    page.click("[data-testid=all-metrics-toggle]")
    rest = sorted(set(by_metric) - in_key - flat)
    for metric in rest:
        chart = page.locator(f'[data-testid="telemetry-{metric}"]')
        eventually(lambda c=chart: c.locator("canvas").count() >= 1, True, what=metric)
        assert "_" not in chart.locator("h2").text_content(), metric  # a human label
    for metric in flat - in_key:
        assert page.locator(f'[data-testid="telemetry-{metric}"]').count() == 0
    topo = tel["topology"]
    head = page.locator("[data-testid=topology] thead th").all_text_contents()
    assert head[1:1 + len(topo["labels"])] == topo["labels"]
    first_row = page.locator("[data-testid=topology] tbody tr").first.locator("td")
    assert first_row.all_text_contents()[:len(topo["matrix"][0])] == topo["matrix"][0]
    screenshot(page, "gpu")

    select_run(page, RUN_XPLANE)
    eventually(lambda: page.locator("[data-testid=empty]").all_text_contents(),
               check=lambda t: "no NVML telemetry recorded for this run" in t,
               what="empty telemetry state")


def test_unreadable_report_is_a_clear_message_and_other_runs_still_work(page, server) -> None:
    status, body = server.route_status("report", run=RUN_UNREADABLE)
    assert status == 422
    select_run(page, RUN_UNREADABLE)
    box = page.locator("[data-testid=error]").first
    eventually(lambda: box.text_content() if box.count() else "",
               check=lambda t: body["error"] in t, what="error box")
    screenshot(page, "unreadable")
    select_run(page, RUN_HOSTILE)
    page.wait_for_selector("[data-testid=top-kernels]")
    assert page.locator("[data-testid=error]").count() == 0


def test_window_selector_lists_each_report_step(page, server) -> None:
    runs = {r["run"]: r for r in server.route("runs")["runs"]}
    for name, run in runs.items():
        select_run(page, name)
        steps = {r["step"] for r in run["reports"]}
        selector = page.locator("[data-testid=step-select]")
        if len(steps) > 1:
            eventually(lambda s=selector: s.count(), 1, what=f"window selector of {name}")
        else:
            assert selector.count() == 0


def test_dark_mode_follows_the_system_setting(browser, server) -> None:
    context = browser.new_context(color_scheme="dark", viewport={"width": 1440, "height": 900})
    try:
        pg = context.new_page()
        pg.goto(server.plugin_url)
        pg.wait_for_selector("[data-testid=view-dashboard]")
        assert "dark" in pg.locator("[data-testid=gpuprof-root]").get_attribute("class").split()
        screenshot(pg, "dashboard-dark")
    finally:
        context.close()


def test_iteration_chart_caps_warm_up_outliers(page, server) -> None:
    points = server.route("scalars", run=RUN_OUTLIER, tag="gpuprof/iteration_time_ms")["points"]
    values = sorted(p[2] for p in points)
    cap = values[len(values) // 2] * 4
    above = sum(v > cap for v in values)
    assert above == 1, points  # the 100 s first iteration
    select_run(page, RUN_OUTLIER)
    eventually(lambda: page.locator("[data-testid=iter-clipped]").count(), 1,
               what="the clipped-outlier note")
    assert page.locator("[data-testid=iter-clipped]").text_content().startswith(
        "1 warm-up iteration above")
    # a run without outliers shows no note
    select_run(page, RUN_KINETO)
    page.wait_for_selector("[data-testid=iter-chart] canvas")
    assert page.locator("[data-testid=iter-clipped]").count() == 0


def test_verdict_and_top_fix_come_first(page, server) -> None:
    report = server.route("report", run=RUN_LOOP)
    bn = report["bottleneck"]
    assert bn["bound"] == "dispatch"  # the imported launch-bound GPT-2 window
    select_run(page, RUN_LOOP)
    verdict = page.locator("[data-testid=verdict]")
    eventually(lambda: verdict.locator("[data-testid=verdict-text]").text_content(),
               bn["verdict"], what="verdict")
    assert verdict.get_attribute("data-bound") == "dispatch"
    top = report["recommendations"][0]
    fix_text = page.locator("[data-testid=verdict-fix]").text_content()  # below the verdict
    assert top["title"] in fix_text
    low, high = top["estimated_range_pct"]  # the re-timed saving's range is on the first screen
    assert f"range {round(low)}%–{round(high)}%" in fix_text
    card = page.locator("[data-testid=recommendation]").first
    assert top["estimate_basis"] in card.locator("[data-testid=estimate-basis]").text_content()
    # one bar segment per class that holds at least half a percent, widths as the shares
    pct = bn["mean_pct"]  # imported: no un-profiled time to correct with
    shown = {s.get_attribute("data-share") for s in
             verdict.locator("[data-testid=share-bar] span").all()}
    assert shown == {k for k, v in pct.items() if v >= 0.5}
    assert bn["note"] in verdict.text_content()
    # first on the page: above the summary cards, inside the first screen (900 px here)
    box = verdict.bounding_box()
    cards = page.locator("[data-testid=summary-cards]").bounding_box()
    assert box["y"] < cards["y"] and box["y"] + box["height"] < 900
    screenshot(page, "dashboard-verdict")
