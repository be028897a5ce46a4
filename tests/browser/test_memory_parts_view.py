"""The Memory view's peak decomposition (issue 40, item 4) in real Chromium over a real
TensorBoard: two real CPU training loops under the PyTorch hook with model= and optimizer=
(batch 256 and 1024, one module named like an HTML injection), the bar's segments and legend
against /report's peak_parts, a part's holders on click, the time filter, and the second run's
bar with the per-part differences."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until

from .conftest import Server, chromium_or_skip, plugin_page, runs_loaded, screenshot
from .dom import DASH, eventually, fmt_ms, fmt_num, fmt_pct, open_tab, select_run
from .test_memory_view import fmt_bytes

RUN_SMALL, RUN_LARGE = "parts_b256", "parts_b1024"
# a module name from a model is as untrusted as a kernel name (no dot: add_module forbids it)
HOSTILE_MODULE = "<img src=x onerror=\"window['__xss']=1\">"
LABELS = {"parameters": "parameters", "gradients": "gradients",
          "optimizer_state": "optimizer state", "activations": "activations",
          "temporaries": "temporaries", "before_window": "from before the window"}


def _loop(run_dir: Path, batch: int) -> None:
    torch = pytest.importorskip("torch")
    from tb_gpuprof.torch import GpuProfiler

    torch.manual_seed(0)
    model = torch.nn.Sequential(OrderedDict([
        ("embed", torch.nn.Linear(64, 256)), ("act", torch.nn.ReLU()),
        (HOSTILE_MODULE, torch.nn.Linear(256, 256)), ("act2", torch.nn.ReLU()),
        ("head", torch.nn.Linear(256, 10))]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(torch.randn(batch, 64), torch.randint(0, 10, (batch,))) for _ in range(7)]
    with GpuProfiler(str(run_dir), iter_start=3, iter_stop=5, model=model, optimizer=opt,
                     with_stack=True, nvml=False) as prof:
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()


@pytest.fixture(scope="module")
def parts_server(tmp_path_factory: pytest.TempPathFactory, tensorboard_factory: Any) -> Server:
    chromium_or_skip()
    logdir = tmp_path_factory.mktemp("parts-logdir")
    _loop(logdir / RUN_SMALL, 256)
    _loop(logdir / RUN_LARGE, 1024)
    tb = tensorboard_factory(logdir)
    wait_until(lambda: runs_loaded(tb.base_url, (RUN_SMALL, RUN_LARGE)), timeout=120,
               what="tensorboard to load the two runs")
    return Server(tb)


@pytest.fixture
def parts_page(browser: Any, parts_server: Server) -> Any:
    yield from plugin_page(browser, parts_server)


def _open_memory(page: Any, run: str) -> None:
    select_run(page, run)
    page.wait_for_selector("[data-testid=view-dashboard]")
    open_tab(page, "memory")
    page.wait_for_selector("[data-testid=memory-parts]")


def _device(server: Server, run: str) -> dict[str, Any]:
    (dev,) = server.route("report", run=run)["memory"]["devices"]
    return dev


def test_the_peak_bar_shows_each_part_with_its_bytes_and_share(parts_page, parts_server) -> None:
    dev = _device(parts_server, RUN_SMALL)
    pp = dev["peak_parts"]
    parts = {p["part"]: p for p in pp["parts"]}
    assert all(parts[k]["bytes"] is not None for k in LABELS)  # model= and optimizer= given
    assert parts["activations"]["bytes"] > 0 and parts["parameters"]["bytes"] > 0
    total = sum(p["bytes"] for p in pp["parts"])
    _open_memory(parts_page, RUN_SMALL)
    bar = parts_page.locator(f"[data-testid=memory-parts-bar][data-run={RUN_SMALL}]")
    segs = bar.locator(".pp-seg")
    drawn = [p["part"] for p in pp["parts"] if p["bytes"] > 0]
    eventually(lambda: [segs.nth(i).get_attribute("data-part") for i in range(segs.count())],
               drawn, what="bar segments")
    bar_width = bar.bounding_box()["width"]
    for i, name in enumerate(drawn):
        b = parts[name]["bytes"]
        share = fmt_pct(100 * b / total)
        assert segs.nth(i).get_attribute("title") == f"{LABELS[name]}: {fmt_bytes(b)} ({share})"
        # the segment's width is its share of the bar (one run: the bar's scale is the total)
        w = segs.nth(i).bounding_box()["width"]
        assert abs(w - bar_width * b / total) <= 2.0, (name, w, bar_width * b / total)
    assert parts_page.locator("[data-testid=memory-parts-total]").first.text_content() == \
        fmt_bytes(total)
    legend = parts_page.locator("[data-testid=memory-parts-legend]")
    for name, label in LABELS.items():
        row = legend.locator(f"tr[data-part={name}]")
        assert row.locator("td[data-col=part]").text_content() == label
        assert row.locator("td[data-col=bytes]").text_content() == fmt_bytes(parts[name]["bytes"])
        assert row.locator("td[data-col=share]").text_content() == \
            fmt_pct(100 * parts[name]["bytes"] / total)
        assert row.locator("td[data-col=holders]").text_content() == \
            fmt_num(parts[name]["holders_total"])
    # the CPU allocator keeps no reserve and NVML was off: said in words, beside the parts
    assert "no reserve" in legend.locator("tr[data-part=fragmentation]").text_content()
    assert "not known" in legend.locator("tr[data-part=outside_pytorch]").text_content()
    # the weights made before the window are parts the CPU allocator does not count
    assert pp["uncounted_bytes"] > 0
    assert fmt_bytes(pp["uncounted_bytes"]) in \
        parts_page.locator("[data-testid=memory-parts-notes]").text_content()
    screenshot(parts_page, "memory-parts")


def test_a_part_lists_its_holders_and_a_hostile_module_is_text(parts_page,
                                                               parts_server) -> None:
    pp = _device(parts_server, RUN_SMALL)["peak_parts"]
    params = next(p for p in pp["parts"] if p["part"] == "parameters")
    assert HOSTILE_MODULE in {h["module"] for h in params["holders"]}
    _open_memory(parts_page, RUN_SMALL)
    assert parts_page.locator("[data-testid=memory-part-holders]").count() == 0
    parts_page.click("[data-testid=memory-parts-bar] .pp-seg[data-part=parameters]")
    table = parts_page.locator("[data-testid=memory-part-holders][data-part=parameters]")
    modules = table.locator("td[data-col=module]")
    eventually(lambda: modules.all_text_contents(), [h["module"] for h in params["holders"]],
               what="parameter holders")
    assert table.locator("td[data-col=bytes]").all_text_contents() == \
        [fmt_bytes(h["bytes"]) for h in params["holders"]]
    assert parts_page.evaluate("window.__xss") is None
    assert parts_page.locator("img").count() == 0
    # activations are charged to ops (and source lines), not modules
    acts = next(p for p in pp["parts"] if p["part"] == "activations")
    parts_page.click("[data-testid=memory-parts-legend] tr[data-part=activations] button")
    ops = parts_page.locator("[data-testid=memory-part-holders][data-part=activations] "
                             "td[data-col=op]")
    eventually(lambda: ops.all_text_contents(), [h["op"] or DASH for h in acts["holders"]],
               what="activation holders")


def test_the_time_filter_narrows_the_timeline(parts_page, parts_server) -> None:
    series = _device(parts_server, RUN_SMALL)["series"]
    t = series["t_ms"]
    end = t[-1]
    _open_memory(parts_page, RUN_SMALL)
    rng = parts_page.locator("[data-testid=memory-range]")
    assert rng.get_attribute("data-points") == str(len(t))
    lo, hi = round(end * 0.25, 3), round(end * 0.5, 3)
    parts_page.fill("[data-testid=memory-range-to]", str(hi))
    parts_page.locator("[data-testid=memory-range-to]").dispatch_event("change")
    parts_page.fill("[data-testid=memory-range-from]", str(lo))
    parts_page.locator("[data-testid=memory-range-from]").dispatch_event("change")
    inside = [i for i, x in enumerate(t) if lo <= x <= hi]
    assert 0 < len(inside) < len(t)
    eventually(lambda: (rng.get_attribute("data-lo"), rng.get_attribute("data-hi"),
                        rng.get_attribute("data-points")),
               (str(lo), str(hi), str(len(inside))), what="filtered range")
    top = max(inside, key=lambda i: series["allocated_bytes"][i])
    text = parts_page.locator("[data-testid=memory-range-text]").text_content()
    assert text.startswith(f"{fmt_ms(lo)} to {fmt_ms(hi)} of {fmt_ms(end)}: {len(inside)} points")
    assert f"highest {fmt_bytes(series['allocated_bytes'][top])} at {fmt_ms(t[top])}" in text
    parts_page.click("[data-testid=memory-range-reset]")
    eventually(lambda: rng.get_attribute("data-points"), str(len(t)), what="whole window")


def test_a_second_runs_bar_and_the_per_part_differences(parts_page, parts_server) -> None:
    small, large = ({p["part"]: p["bytes"] for p in _device(parts_server, r)["peak_parts"]["parts"]}
                    for r in (RUN_SMALL, RUN_LARGE))
    assert large["activations"] > small["activations"]  # 4x the batch
    assert large["parameters"] == small["parameters"]
    _open_memory(parts_page, RUN_SMALL)
    parts_page.select_option("[data-testid=memory-compare-select]", RUN_LARGE)
    bars = parts_page.locator("[data-testid=memory-parts-bar]")
    eventually(lambda: [bars.nth(i).get_attribute("data-run") for i in range(bars.count())],
               [RUN_SMALL, RUN_LARGE], what="both runs' bars")
    diff = parts_page.locator("[data-testid=memory-parts-diff]")
    act = diff.locator("tr[data-part=activations]")
    delta = large["activations"] - small["activations"]
    assert act.locator("td[data-col=a]").text_content() == fmt_bytes(small["activations"])
    assert act.locator("td[data-col=b]").text_content() == fmt_bytes(large["activations"])
    assert act.locator("td[data-col=diff]").text_content() == f"+{fmt_bytes(delta)}"
    assert diff.locator("tr[data-part=parameters] td[data-col=diff]").text_content() == "0 B"
    # one scale for both bars: the larger run's activations segment is the wider
    w = [bars.nth(i).locator(".pp-seg[data-part=activations]").bounding_box()["width"]
         for i in range(2)]
    assert w[1] > w[0] * 1.5, w
    screenshot(parts_page, "memory-parts-compare")
