"""The out-of-memory report in the Memory view (issue 40, item 2) in real Chromium over a real
TensorBoard: a real CPU training loop under the PyTorch hook records a window, then its step
raises a CUDA out-of-memory error whose message carries an HTML injection; the view shows the
report's failure, largest part and advice as text, against /oom. A run that never failed
shows no such panel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until

from .conftest import Server, chromium_or_skip, plugin_page, runs_loaded
from .dom import open_tab, select_run

RUN_FAILED, RUN_FINE = "oom_failed", "oom_fine"
INJECTION = "<img src=x onerror=\"window['__xss']=1\">"
MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.11 GiB of which 1.50 GiB is free. Of the allocated memory 75.10 GiB is allocated "
           "by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated. " + INJECTION)


def _loop(run_dir: Path, fail_at: int | None) -> None:
    torch = pytest.importorskip("torch")
    from tb_gpuprof.torch import GpuProfiler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(torch.randn(48, 32), torch.randint(0, 10, (48,))) for _ in range(7)]
    try:
        with GpuProfiler(str(run_dir), iter_start=1, iter_stop=3, model=model, optimizer=opt,
                         nvml=False) as prof:
            for i, (x, y) in enumerate(prof.wrap(data)):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if i == fail_at:
                    raise torch.cuda.OutOfMemoryError(MESSAGE)
                prof.step()
    except torch.cuda.OutOfMemoryError:
        pass


@pytest.fixture(scope="module")
def oom_server(tmp_path_factory: pytest.TempPathFactory, tensorboard_factory: Any) -> Server:
    chromium_or_skip()
    logdir = tmp_path_factory.mktemp("oom-logdir")
    _loop(logdir / RUN_FAILED, 4)
    _loop(logdir / RUN_FINE, None)
    tb = tensorboard_factory(logdir)
    wait_until(lambda: runs_loaded(tb.base_url, (RUN_FAILED, RUN_FINE)), timeout=120,
               what="tensorboard to load the two runs")
    return Server(tb)


@pytest.fixture
def oom_page(browser: Any, oom_server: Server) -> Any:
    yield from plugin_page(browser, oom_server)


def _open_memory(page: Any, run: str) -> None:
    select_run(page, run)
    page.wait_for_selector("[data-testid=view-dashboard]")
    open_tab(page, "memory")
    page.wait_for_selector("[data-testid=view-memory]")


def test_the_memory_view_shows_the_out_of_memory_report_as_text(oom_page, oom_server) -> None:
    (report,) = oom_server.route("oom", run=RUN_FAILED)["reports"]
    _open_memory(oom_page, RUN_FAILED)
    panel = oom_page.wait_for_selector("[data-testid=panel-oom]")
    text = panel.inner_text()
    assert f"iteration {report['step']}" in text and f"batch size {report['batch_size']}" in text
    assert report["largest_part"] and report["largest_part"] in text
    rows = panel.query_selector_all("[data-testid=oom-advice] tbody tr")
    assert [r.query_selector("td").inner_text().split(" →")[0] for r in rows] == \
        [a["fix"] for a in report["advice"]]
    error = panel.query_selector("[data-testid=oom-error]").inner_text()
    assert INJECTION in error and error.startswith(report["error"]["type"])
    assert panel.query_selector("img") is None
    assert oom_page.evaluate("window.__xss") is None


def test_a_run_that_never_failed_shows_no_out_of_memory_panel(oom_page, oom_server) -> None:
    assert oom_server.route("oom", run=RUN_FINE)["reports"] == []
    _open_memory(oom_page, RUN_FINE)
    oom_page.wait_for_selector("[data-testid=memory-parts]")
    assert oom_page.query_selector("[data-testid=panel-oom]") is None
