"""The Distributed view in a real Chromium against a real TensorBoard over a real 2-process
gloo DDP run (rank 1 a straggler) and a single-process run (tests/test_distributed.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.test_distributed import RUN, SINGLE_RUN, STRAGGLER_RANK, ddp_logdir

from .conftest import Server, runs_loaded, screenshot
from .dom import eventually, fmt_ms, fmt_pct, open_tab, select_run


@pytest.fixture(scope="module")
def dist_server(tmp_path_factory: pytest.TempPathFactory, tensorboard_factory: Any) -> Server:
    logdir: Path = ddp_logdir(tmp_path_factory)
    tb = tensorboard_factory(logdir)
    runs = (RUN, f"{RUN}/rank1", SINGLE_RUN)
    wait_until(lambda: runs_loaded(tb.base_url, runs), timeout=120,
               what=f"tensorboard to load runs {runs}")
    return Server(tb)


@pytest.fixture
def dist_page(browser: Any, dist_server: Server) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(dist_server.plugin_url)
    pg.wait_for_selector("[data-testid=gpuprof-root]")
    yield pg
    context.close()
    assert not errors, f"uncaught errors in the dashboard: {errors}"


def test_distributed_view_shows_every_rank_and_the_straggler(dist_page, dist_server) -> None:
    body = dist_server.route("distributed", run=RUN)
    pg = dist_page
    select_run(pg, RUN)
    open_tab(pg, "distributed")
    pg.wait_for_selector("[data-testid=dist-ranks]")
    rows = pg.locator("[data-testid=dist-ranks] tbody tr")
    assert rows.count() == len(body["ranks"]) == 2
    for i, rank in enumerate(body["ranks"]):
        row = rows.nth(i)
        assert row.get_attribute("data-rank") == str(rank["rank"])
        cell = lambda col, row=row: row.locator(f"td[data-col={col}]").text_content()  # noqa: E731
        assert cell("iteration_ms") == fmt_ms(rank["iteration_ms"])
        assert cell("working_ms") == fmt_ms(rank["working_ms"])
        assert cell("compute_ms") == fmt_ms(rank["compute_ms"])
        assert cell("communication_ms") == fmt_ms(rank["communication_ms"])
        assert cell("overlap_pct") == fmt_pct(rank["overlap_pct"])
        assert cell("exposed_ms") == fmt_ms(rank["exposed_ms"])
        assert cell("backend") == "gloo"
    # the straggler row, and only it, is highlighted
    badges = pg.locator("[data-testid=straggler-badge]")
    assert badges.count() == 1
    slow = pg.locator("[data-testid=dist-ranks] tbody tr.straggler")
    assert slow.get_attribute("data-rank") == str(STRAGGLER_RANK)
    assert pg.locator("[data-testid=card-straggler] .value").text_content() == \
        f"rank {STRAGGLER_RANK}"
    for chart in ("dist-iter-chart", "dist-comm-chart"):
        assert pg.locator(f"[data-testid={chart}] canvas").count() >= 1, chart
    cards = pg.locator("[data-testid=panel-dist-recommendations] [data-testid=recommendation]")
    assert [cards.nth(i).get_attribute("data-rec-id") for i in range(cards.count())] == \
        [r["id"] for r in body["recommendations"]]
    screenshot(pg, "distributed")

    # each rank's telemetry/topology: the GPU tab of that rank's run
    slow.locator("[data-testid=open-gpu]").click()
    pg.wait_for_selector("[data-testid=view-gpu]")
    eventually(lambda: pg.locator("[data-testid=run-select]").input_value(), f"{RUN}/rank1",
               what="selected run")


def test_distributed_view_empty_state_for_a_single_process(dist_page) -> None:
    select_run(dist_page, SINGLE_RUN)
    open_tab(dist_page, "distributed")
    view = dist_page.locator("[data-testid=view-distributed]")
    view.wait_for()
    text = view.locator("[data-testid=empty]").text_content()
    assert "single process" in text
    assert dist_page.locator("[data-testid=dist-ranks]").count() == 0
