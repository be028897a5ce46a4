"""A kernel named `<img src=x onerror=...>` is shown as text and runs nothing, both in the
plugin document and inside TensorBoard's own page (the plugin's iframe)."""

from __future__ import annotations

from .conftest import PLUGIN, RUN_HOSTILE, RUN_KINETO, screenshot
from .dom import column, eventually, open_tab, select_run
from .kineto_synth import HOSTILE_KERNEL


def _assert_inert(scope) -> None:
    assert scope.evaluate("window.__xss") is None
    assert scope.locator("img").count() == 0


def test_hostile_kernel_name_is_text_in_every_view(page, server) -> None:
    names = [k["name"] for k in server.route("report", run=RUN_HOSTILE)["kernels"]]
    assert HOSTILE_KERNEL in names
    select_run(page, RUN_HOSTILE)
    eventually(lambda: column(page, "top-kernels", "name"), names, what="top kernels")
    _assert_inert(page)

    open_tab(page, "kernels")
    page.fill("[data-testid=kernel-search]", "onerror")
    eventually(lambda: column(page, "kernels-table", "name"), [HOSTILE_KERNEL], what="search")
    cell = page.locator("[data-testid=kernels-table] td[data-col=name] span").first
    assert cell.get_attribute("title") == HOSTILE_KERNEL
    _assert_inert(page)

    open_tab(page, "compare")
    page.check(f'[data-testid=compare-runs] input[value="{RUN_KINETO}"]')
    page.wait_for_selector("[data-testid=compare-kernels]")
    page.select_option("[data-testid=compare-status]", "")
    texts = page.locator("[data-testid=compare-kernels] tbody td span").all_text_contents()
    assert HOSTILE_KERNEL in texts
    # hover over each chart so any tooltip renders (ECharts tooltips must not be HTML)
    for chart in ("compare-iter", "compare-tc"):
        box = page.locator(f"[data-testid={chart}]").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    _assert_inert(page)
    screenshot(page, "hostile-compare")


def test_inside_tensorboards_page(browser, server) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        pg = context.new_page()
        pg.goto(f"{server.base}/#{PLUGIN}")
        iframe = pg.wait_for_selector(f'iframe[src*="plugin_entry.html?name={PLUGIN}"]',
                                      state="attached", timeout=60_000)
        frame = iframe.content_frame()
        frame.wait_for_selector("[data-testid=gpuprof-root]")
        select_run(frame, RUN_HOSTILE)
        eventually(lambda: column(frame, "top-kernels", "name"),
                   check=lambda n: HOSTILE_KERNEL in n, what="hostile kernel in the iframe")
        _assert_inert(frame)
        assert pg.evaluate("window.__xss") is None
        screenshot(pg, "tensorboard-hostile")
    finally:
        context.close()
