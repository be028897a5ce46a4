"""The Roofline view in real Chromium: points and ceilings as report.roofline says, log-log axes
with units, a hostile kernel name shown as text (hover title and click detail), the link into
the Kernels view, the left-out count, and the Kernels table's "% of speed of light" column."""

from __future__ import annotations

from .conftest import RUN_HOSTILE, RUN_KINETO, RUN_XPLANE, screenshot
from .dom import column, eventually, fmt_pct, open_tab, select_run
from .kineto_synth import HOSTILE_KERNEL


def _open_roofline(page, run: str) -> None:
    select_run(page, run)
    open_tab(page, "roofline")
    page.wait_for_selector("[data-testid=view-roofline]")


def _inert(page) -> None:
    assert page.evaluate("window.__xss") is None
    assert page.locator("img").count() == 0


def test_points_and_ceilings_match_the_report(page, server) -> None:
    rf = server.route("report", run=RUN_KINETO)["roofline"]
    assert rf["points"], "the transformer trace has GEMM and attention points"
    _open_roofline(page, RUN_KINETO)
    points = page.locator("[data-testid=roofline-point]")
    eventually(points.count, len(rf["points"]), what="points drawn")
    # one compute ceiling per precision the points are bounded by, at the table's peak
    drawn = {c.get_attribute("data-precision"): float(c.get_attribute("data-peak"))
             for c in page.locator("[data-testid=roofline-ceiling]").all()}
    want = {p["ceiling"] for p in rf["points"]}
    assert drawn == {c: rf["ceilings"]["tflops"][c] for c in want}
    # each dtype has its slanted memory roof and its flat compute roof
    for c in want:
        assert page.locator(f"[data-testid=roofline-ceiling][data-precision={c}] line").count() == 2
    assert "FLOP/byte" in page.locator("[data-testid=roofline-x-label]").text_content()
    assert "TFLOP/s" in page.locator("[data-testid=roofline-y-label]").text_content()
    bw = page.locator("[data-testid=roofline-bandwidth]").text_content()
    assert f"{rf['ceilings']['hbm_gbps']:,.0f} GB/s" in bw
    # a point to the right is at a higher intensity (log x axis increases to the right)
    xs = [float(points.nth(i).get_attribute("cx")) for i in range(len(rf["points"]))]
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    intens = [rf["points"][i]["intensity"] for i in order]
    assert intens == sorted(intens)
    summary = page.locator("[data-testid=roofline-summary]").text_content()
    assert f"{rf['kernels_plotted']} of {rf['kernels_total']} kernels" in summary
    screenshot(page, "roofline-transformer")


def test_hostile_name_is_text_on_hover_and_click_and_links_to_kernels(page, server) -> None:
    rf = server.route("report", run=RUN_HOSTILE)["roofline"]
    idx = next(i for i, p in enumerate(rf["points"]) if p["name"] == HOSTILE_KERNEL)
    _open_roofline(page, RUN_HOSTILE)
    point = page.locator(f"[data-testid=roofline-point][data-index='{idx}']")
    point.hover()
    title = point.locator("title").text_content()
    assert title.splitlines()[0] == HOSTILE_KERNEL
    assert fmt_pct(rf["points"][idx]["pct_of_sol"]) in title
    point.click()
    name = page.locator("[data-testid=roofline-detail-name]")
    eventually(name.text_content, HOSTILE_KERNEL, what="clicked kernel")
    _inert(page)
    screenshot(page, "roofline-hostile")
    page.click("[data-testid=roofline-open-kernels]")
    eventually(lambda: column(page, "kernels-table", "name"), [HOSTILE_KERNEL],
               what="Kernels view filtered to the clicked kernel")
    _inert(page)


def test_xla_run_says_why_nothing_is_plotted(page, server) -> None:
    rf = server.route("report", run=RUN_XPLANE)["roofline"]
    _open_roofline(page, RUN_XPLANE)
    left = page.locator("[data-testid=roofline-left-out]")
    left.wait_for()
    assert rf["left_out"][0]["reason"] in left.text_content()
    assert "XLA" in left.text_content()
    assert page.locator("[data-testid=roofline-point]").count() == 0


def test_kernels_table_has_percent_of_speed_of_light(page, server) -> None:
    answer = server.route("kernels", run=RUN_KINETO, limit=50)
    select_run(page, RUN_KINETO)
    open_tab(page, "kernels")
    header = page.locator("[data-testid=kernels-table] th[data-col=pct_of_sol]")
    header.wait_for()
    assert header.text_content() == "% of speed of light"
    want = [fmt_pct(k.get("pct_of_sol")) for k in answer["kernels"]]
    assert any(v != "\u2014" for v in want)
    eventually(lambda: column(page, "kernels-table", "pct_of_sol"), want, what="% of SOL")
    header.click()  # sorted by the server, highest first
    by_sol = server.route("kernels", run=RUN_KINETO, sort="pct_of_sol", order="desc", limit=50)
    eventually(lambda: column(page, "kernels-table", "name"),
               [k["name"] for k in by_sol["kernels"]], what="sorted by % of SOL")
