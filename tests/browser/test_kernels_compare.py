"""Kernels view (backend-paged sorting, search, filters) and the Compare view."""

from __future__ import annotations

from .conftest import RUN_HOSTILE, RUN_KINETO, RUN_MANY, RUN_XPLANE, screenshot
from .dom import column, eventually, fmt_ms, fmt_num, open_tab, select_run

PAGE = 50


def _names(page) -> list[str]:
    return column(page, "kernels-table", "name")


def _open_kernels(page, run: str) -> None:
    select_run(page, run)
    open_tab(page, "kernels")
    page.wait_for_selector("[data-testid=kernels-table]")


def test_kernels_view_lists_the_backend_page(page, server) -> None:
    answer = server.route("kernels", run=RUN_KINETO, limit=PAGE)
    _open_kernels(page, RUN_KINETO)
    eventually(lambda: _names(page), [k["name"] for k in answer["kernels"]], what="first page")
    total = page.locator("[data-testid=kernel-total]").get_attribute("data-total")
    assert int(total) == answer["total"]
    row = answer["kernels"][0]
    assert column(page, "kernels-table", "registers")[0] == fmt_num(row["registers"])
    assert column(page, "kernels-table", "ops")[0] == ", ".join(row["ops"] or []) or "\u2014"
    screenshot(page, "kernels")


def test_header_click_sorts_by_that_column_both_ways(page, server) -> None:
    _open_kernels(page, RUN_KINETO)
    header = page.locator("[data-testid=kernels-table] th[data-col=count]")
    header.click()
    desc = server.route("kernels", run=RUN_KINETO, sort="count", order="desc", limit=PAGE)
    eventually(lambda: _names(page), [k["name"] for k in desc["kernels"]], what="sorted desc")
    assert header.get_attribute("aria-sort") == "descending"
    counts = [int(c.replace(",", "")) for c in column(page, "kernels-table", "count")]
    assert counts == sorted(counts, reverse=True)

    header.click()
    asc = server.route("kernels", run=RUN_KINETO, sort="count", order="asc", limit=PAGE)
    eventually(lambda: _names(page), [k["name"] for k in asc["kernels"]], what="sorted asc")
    assert header.get_attribute("aria-sort") == "ascending"

    page.locator("[data-testid=kernels-table] th[data-col=name]").click()
    by_name = server.route("kernels", run=RUN_KINETO, sort="name", order="asc", limit=PAGE)
    eventually(lambda: _names(page), [k["name"] for k in by_name["kernels"]], what="by name")


def test_search_and_filters_narrow_the_list(page, server) -> None:
    report = server.route("report", run=RUN_KINETO)
    _open_kernels(page, RUN_KINETO)

    # the start of a kernel name that matches some kernels but not all
    for k in report["kernels"][1:]:
        word = k["name"].replace("<", " ").split()[0][:12]
        expect = server.route("kernels", run=RUN_KINETO, q=word, limit=PAGE)
        if 0 < expect["total"] < report["kernels_total"]:
            break
    else:
        raise AssertionError("no kernel name narrows the search")
    page.fill("[data-testid=kernel-search]", word)
    eventually(lambda: _names(page), [k["name"] for k in expect["kernels"]],
               what=f"search {word!r}")
    page.fill("[data-testid=kernel-search]", "")

    category = max(report["category_us"], key=report["category_us"].get)
    page.select_option("[data-testid=filter-category]", category)
    expect = server.route("kernels", run=RUN_KINETO, category=category, limit=PAGE)
    eventually(lambda: _names(page), [k["name"] for k in expect["kernels"]], what="category")
    assert set(column(page, "kernels-table", "category")) == {category}
    page.select_option("[data-testid=filter-category]", "")

    page.select_option("[data-testid=filter-tc]", "true")
    expect = server.route("kernels", run=RUN_KINETO, tc="true", limit=PAGE)
    eventually(lambda: _names(page), [k["name"] for k in expect["kernels"]], what="TC filter")
    assert set(column(page, "kernels-table", "uses_tensor_cores")) == {"TC"}
    page.select_option("[data-testid=filter-tc]", "")

    precision = "fp32"
    page.select_option("[data-testid=filter-precision]", precision)
    expect = server.route("kernels", run=RUN_KINETO, precision=precision, limit=PAGE)
    eventually(lambda: _names(page), [k["name"] for k in expect["kernels"]], what="precision")
    assert set(column(page, "kernels-table", "precision")) == {precision}


def test_pager_moves_through_the_list(page, server) -> None:
    first = server.route("kernels", run=RUN_MANY, limit=PAGE)
    assert first["total"] > 2 * PAGE
    _open_kernels(page, RUN_MANY)
    eventually(lambda: _names(page), [k["name"] for k in first["kernels"]], what="page 1")
    assert page.locator("[data-testid=page-prev]").is_disabled()
    page.locator("[data-testid=page-next]").click()
    second = server.route("kernels", run=RUN_MANY, offset=PAGE, limit=PAGE)
    eventually(lambda: _names(page), [k["name"] for k in second["kernels"]], what="page 2")
    assert page.locator("[data-testid=page-range]").text_content() == \
        f"{PAGE + 1}–{2 * PAGE} of {fmt_num(first['total'])}"
    # a new sort starts again at the first page
    page.locator("[data-testid=kernels-table] th[data-col=name]").click()
    by_name = server.route("kernels", run=RUN_MANY, sort="name", order="asc", limit=PAGE)
    eventually(lambda: _names(page), [k["name"] for k in by_name["kernels"]], what="sorted")
    assert page.locator("[data-testid=page-range]").text_content().startswith("1–")


def test_compare_view_shows_runs_side_by_side(page, server) -> None:
    runs = [RUN_KINETO, RUN_XPLANE, RUN_HOSTILE]
    answer = server.route("compare", runs=",".join(runs))
    open_tab(page, "compare")
    boxes = page.locator("[data-testid=compare-runs] input[type=checkbox]")
    for i in range(boxes.count()):
        boxes.nth(i).uncheck()
    for run in runs:
        page.check(f'[data-testid=compare-runs] input[value="{run}"]')
    summary = page.locator("[data-testid=compare-summary] tbody tr")
    eventually(lambda: [summary.nth(i).get_attribute("data-run") for i in range(summary.count())],
               runs, what="compared runs")
    for i, r in enumerate(answer["runs"]):
        cells = summary.nth(i).locator("td").all_text_contents()
        assert cells[1] == str(r["step"])
        assert cells[2] == fmt_ms(r["iterations"]["mean_ms"])
    for chart in ("compare-iter", "compare-tc"):
        assert page.locator(f"[data-testid={chart}] canvas").count() >= 1

    for status in ("appeared", "vanished", "changed", "same"):
        expected = [k["name"] for k in answer["kernels"] if k["status"] == status]
        page.select_option("[data-testid=compare-status]", status)
        rows = page.locator("[data-testid=compare-kernels] tbody tr")
        got = eventually(lambda r=rows: [r.nth(i).locator("td span").first.text_content()
                                         for i in range(r.count())],
                         check=lambda g, e=expected: g == e[:len(g)] and len(g) == min(len(e), 50),
                         what=f"{status} kernels")
        assert len(got) == min(len(expected), 50)
    screenshot(page, "compare")
