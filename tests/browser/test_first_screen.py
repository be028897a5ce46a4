"""The first screen (1600x1000, no scrolling) answers what bounds the run and what to change;
evidence is words, units and small tables with kernel links into the Kernels view; the
dashboard opens on the most recent run that has GPU work. Real Chromium, real TensorBoard,
imported profiles."""

from __future__ import annotations

import pytest

from .conftest import RUN_KINETO, RUN_LOOP, RUN_MANY, RUN_SYNC, RUN_XPLANE, screenshot
from .dom import column, eventually, fmt_ms, fmt_pct, select_run

FIRST_SCREEN = {"width": 1600, "height": 1000}
FRAMEWORK_FIX = {"pytorch": "pytorch", "jax": "jax", "keras": "keras", "tensorflow": "keras"}


@pytest.fixture
def wide(browser, server):
    context = browser.new_context(viewport=FIRST_SCREEN)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server.plugin_url)
    pg.wait_for_selector("[data-testid=gpuprof-root]")
    yield pg
    context.close()
    assert not errors, errors


def _inside_first_screen(pg, testid: str) -> None:
    box = pg.locator(f"[data-testid={testid}]").first.bounding_box()
    assert box is not None, testid
    assert box["y"] >= 0 and box["y"] + box["height"] <= FIRST_SCREEN["height"], (testid, box)
    assert box["x"] + box["width"] <= FIRST_SCREEN["width"], (testid, box)


@pytest.mark.parametrize("run", [RUN_LOOP, RUN_KINETO, RUN_XPLANE])
def test_first_screen_holds_verdict_fix_and_key_numbers(wide, server, run) -> None:
    report = server.route("report", run=run)
    select_run(wide, run)
    wide.wait_for_selector("[data-testid=key-cards]")
    eventually(lambda: wide.locator("[data-testid=verdict-text]").text_content(),
               report["bottleneck"]["verdict"], what="verdict")
    assert wide.evaluate("window.scrollY") == 0
    for testid in ("verdict", "verdict-fix", "card-iter", "card-busy", "card-tc", "card-mfu"):
        _inside_first_screen(wide, testid)

    top = report["recommendations"][0]
    assert wide.locator("[data-testid=top-fix-title]").text_content() == top["title"]
    saving = wide.locator("[data-testid=top-fix-saving]").text_content()
    assert f"saves ~{fmt_ms(top['estimated_saving_ms'])}" in saving
    framework = FRAMEWORK_FIX.get(report["system"].get("framework") or "", "pytorch")
    want = framework if top["fix"].get(framework) else next(iter(top["fix"]))
    code = wide.locator("[data-testid=top-fix-code]")
    assert code.get_attribute("data-framework") == want
    assert code.text_content() == top["fix"][want]
    _inside_first_screen(wide, "top-fix-code")

    it = report["iterations"]
    unprofiled = it.get("unprofiled_median_ms")
    value = lambda t: wide.locator(f"[data-testid={t}] .value").text_content()  # noqa: E731
    assert value("card-iter") == fmt_ms(unprofiled if unprofiled is not None else it["mean_ms"])
    b = report["breakdown"]
    assert value("card-busy") == fmt_pct(100 * b["gpu_busy_us"] / b["wall_us"])
    # the big number is the share of GPU time on Tensor Cores, not TC kernel efficiency
    tc = report["tensor_cores"]
    assert value("card-tc") == fmt_pct(tc["tc_pct"])
    assert fmt_pct(tc["tc_kernel_efficiency_pct"]) in \
        wide.locator("[data-testid=card-tc] .sub").text_content()
    mfu = (report.get("throughput") or {}).get("mfu_pct")
    assert value("card-mfu") == (fmt_pct(mfu) if mfu is not None else "\u2014")
    screenshot(wide, f"first-screen-{run}")


def test_opens_on_the_most_recent_run_in_a_stable_order(browser, server) -> None:
    runs = server.route("runs")["runs"]
    usable = [r for r in runs if r["reports"] and not r["error"]]
    newest = max(usable, key=lambda r: r["wall_time"])
    assert newest["gpu_work"] is False  # the CPU-only run, written last: not the one to open
    with_gpu = [r for r in usable if r["gpu_work"]]
    latest = max(with_gpu, key=lambda r: max(x["wall_time"] for x in r["reports"]))["run"]
    for _ in range(2):  # a second visit (fresh storage) opens the same run, same order
        context = browser.new_context(viewport=FIRST_SCREEN)
        try:
            pg = context.new_page()
            pg.goto(server.plugin_url)
            pg.wait_for_selector("[data-testid=view-dashboard]")
            assert pg.locator("[data-testid=run-select]").input_value() == latest
            options = pg.locator("[data-testid=run-select] option").evaluate_all(
                "os => os.map(o => o.value)")
            assert options == sorted(r["run"] for r in runs)
        finally:
            context.close()


def _rec_card(pg, rec_id: str):
    return pg.locator(f"[data-testid=recommendation][data-rec-id={rec_id}]")


def test_evidence_is_words_and_kernel_lists_link_to_the_kernels_view(page, server) -> None:
    report = server.route("report", run=RUN_MANY)
    rec = next(r for r in report["recommendations"] if r["evidence"].get("top_fp32_kernels"))
    names = rec["evidence"]["top_fp32_kernels"]
    select_run(page, RUN_MANY)
    card = _rec_card(page, rec["id"])
    card.wait_for()
    evidence = card.locator("[data-testid=evidence]")
    text = evidence.text_content()
    assert "{" not in text and "[" not in text and "_pct" not in text and "(%)" not in text
    share = rec["evidence"]["fp32_eligible_pct"]
    row = evidence.locator("dt[data-key=fp32_eligible_pct] + dd")
    assert row.text_content() == fmt_pct(share)
    links = evidence.locator("[data-testid=kernel-links] a")
    assert links.all_text_contents() == names  # templated names stay text
    links.nth(1).click()
    page.wait_for_selector("[data-testid=view-kernels]")
    assert page.locator("[data-testid=kernel-search]").input_value() == names[1]
    eventually(lambda: column(page, "kernels-table", "name"), [names[1]],
               what="kernels view filtered to the linked kernel")
    screenshot(page, "evidence-kernel-link")


def test_sync_sites_are_a_small_table(page, server) -> None:
    report = server.route("report", run=RUN_SYNC)
    rec = next(r for r in report["recommendations"] if r["id"] == "host_sync")
    sites = rec["evidence"]["sites"]
    select_run(page, RUN_SYNC)
    card = _rec_card(page, "host_sync")
    card.wait_for()
    table = card.locator("dt[data-key=sites] + dd [data-testid=evidence-table]")
    head = table.locator("thead th").all_text_contents()
    assert "Op" in head and "Times per iteration" in head
    rows = table.locator("tbody tr")
    assert rows.count() == len(sites)
    ops = [s["op"] for s in sites]
    col = head.index("Op")
    assert [rows.nth(i).locator("td").nth(col).text_content() for i in range(len(sites))] == ops
    assert "{" not in card.locator("[data-testid=evidence]").text_content()
    blocked = card.locator("dt[data-key=blocked_ms] + dd").text_content()
    assert blocked == fmt_ms(rec["evidence"]["blocked_ms"])
