"""The Memory view in real Chromium over a real TensorBoard: a real CPU training loop under the
PyTorch hook (allocator events of the CPU allocator, Python stacks), a synthetic GPU trace whose
largest allocation is made by an op named like an HTML injection, and a trace without allocator
events. Also the Python rows the hook's with_stack window gives the Timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fixture_path, run_cli, wait_until

from .conftest import Server, chromium_or_skip, plugin_page, runs_loaded, screenshot
from .dom import DASH, eventually, fmt_num, open_tab, select_run
from .kineto_synth import HOSTILE_KERNEL, SynthKernel, write_kineto_trace

RUN_CPU = "cpu_loop"
RUN_GPU = "mem_hostile"
RUN_NONE = "no_memory"
RUN_BIG = "resnet50_amp"  # ~40k allocator events: the report keeps 2000 points of them
HOSTILE_OP = HOSTILE_KERNEL  # an op name from a trace is as untrusted as a kernel name


def fmt_bytes(v: float | None) -> str:
    """format.ts fmtBytes."""
    if v is None:
        return DASH
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while abs(v) >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    return f"{fmt_num(v, 1 if i else 0)} {units[i]}"


def _cpu_loop(run_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from tb_gpuprof.torch import GpuProfiler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with GpuProfiler(str(run_dir), iter_start=2, iter_stop=4, with_stack=True) as prof:
        for i in range(6):
            held = torch.ones(1_000_000) if i == 3 else None
            loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 64)),
                                                     torch.randint(0, 10, (32,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            del held
            prof.step()


@pytest.fixture(scope="module")
def mem_server(tmp_path_factory: pytest.TempPathFactory, tensorboard_factory: Any) -> Server:
    chromium_or_skip()
    logdir = tmp_path_factory.mktemp("memory-logdir")
    _cpu_loop(logdir / RUN_CPU)
    kernels = [SynthKernel("void small_kernel(float*)", 40.0, op="aten::add"),
               SynthKernel("void big_kernel(float*)", 90.0, op=HOSTILE_OP)]
    trace = write_kineto_trace(tmp_path_factory.mktemp("synth") / "mem.json", kernels,
                               memory=True)
    run_cli("import", str(trace), "--logdir", str(logdir), "--run", RUN_GPU)
    run_cli("import", str(fixture_path("kineto_transformer_bf16_h200.json.gz")), "--logdir",
            str(logdir), "--run", RUN_NONE)
    run_cli("import", str(Path(__file__).parents[1] / "data" / "h200_ladders" /
                          "resnet50_amp.json.gz"), "--logdir", str(logdir), "--run", RUN_BIG)
    tb = tensorboard_factory(logdir)
    wait_until(lambda: runs_loaded(tb.base_url, (RUN_CPU, RUN_GPU, RUN_NONE, RUN_BIG)),
               timeout=120,
               what="tensorboard to load the memory runs")
    return Server(tb)


@pytest.fixture
def mem_page(browser: Any, mem_server: Server) -> Any:
    yield from plugin_page(browser, mem_server)


def _open_memory(page: Any, run: str) -> None:
    select_run(page, run)
    page.wait_for_selector("[data-testid=view-dashboard]")
    open_tab(page, "memory")
    page.wait_for_selector("[data-testid=view-memory]")


def _peak_rows(page: Any) -> dict[str, str]:
    kv = page.locator("[data-testid=memory-peak]")
    keys, values = kv.locator("dt").all_text_contents(), kv.locator("dd").all_text_contents()
    return dict(zip(keys, values, strict=True))


def test_memory_view_of_a_real_loop_shows_the_peak_and_its_holders(mem_page, mem_server) -> None:
    report = mem_server.route("report", run=RUN_CPU)
    (dev,) = report["memory"]["devices"]
    _open_memory(mem_page, RUN_CPU)
    rows = eventually(lambda: _peak_rows(mem_page), check=bool, what="peak key values")
    assert rows["Peak allocated"] == fmt_bytes(dev["peak"]["allocated_bytes"])
    assert f"step {dev['peak']['step']}" in rows["At"] and dev["peak"]["step"] == 3
    assert rows["Reserved at the peak"] == DASH  # the CPU allocator keeps no reserve
    ops = mem_page.locator("[data-testid=memory-holder-op]").all_text_contents()
    assert ops == [h["op"] for h in dev["holders"]] and ops[0] == "aten::ones"
    first = mem_page.locator("[data-testid=memory-holders] tbody tr").first
    assert fmt_bytes(4_000_000) in first.text_content()
    steps = mem_page.locator("[data-testid=memory-iterations] tbody tr td:first-child")
    assert steps.all_text_contents() == [str(it["step"]) for it in dev["iterations"]]
    assert mem_page.locator("[data-testid=memory-chart] canvas").count() >= 1
    # a CPU run has no per-iteration GPU peaks: said in words
    assert "CUDA GPU" in mem_page.locator("[data-testid=view-memory]").text_content()
    screenshot(mem_page, "memory-cpu")


def test_memory_view_shows_a_hostile_op_name_as_text(mem_page, mem_server) -> None:
    report = mem_server.route("report", run=RUN_GPU)
    (dev,) = report["memory"]["devices"]
    assert dev["device"] == "cuda:0" and dev["holders"][0]["op"] == HOSTILE_OP
    _open_memory(mem_page, RUN_GPU)
    ops = mem_page.locator("[data-testid=memory-holder-op]")
    eventually(lambda: ops.all_text_contents(), [h["op"] for h in dev["holders"]],
               what="holder ops")
    assert ops.first.text_content() == HOSTILE_OP
    rows = _peak_rows(mem_page)
    assert rows["Peak allocated"] == fmt_bytes(dev["peak"]["allocated_bytes"])
    assert rows["Reserved at the peak"] == fmt_bytes(dev["peak"]["reserved_bytes"])
    assert mem_page.evaluate("window.__xss") is None
    assert mem_page.locator("img").count() == 0
    screenshot(mem_page, "memory-hostile")


def test_memory_view_without_allocator_events_says_how_to_get_them(mem_page,
                                                                   mem_server) -> None:
    report = mem_server.route("report", run=RUN_NONE)
    assert report["memory"]["recorded"] is False
    _open_memory(mem_page, RUN_NONE)
    empty = mem_page.locator("[data-testid=view-memory] [data-testid=empty]").first
    assert empty.text_content() == report["memory"]["note"]
    assert "record_memory=True" in empty.text_content()


def test_timeline_shows_the_python_rows_of_a_with_stack_window(mem_page, mem_server) -> None:
    whole = mem_server.route("timeline", run=RUN_CPU, width=1000)
    python = [r["label"] for r in whole["rows"] if r["kind"] == "python"]
    assert python
    select_run(mem_page, RUN_CPU)
    mem_page.wait_for_selector("[data-testid=view-dashboard]")
    open_tab(mem_page, "timeline")
    labels = mem_page.locator("[data-testid=timeline-rows] .tl-label")
    eventually(lambda: labels.all_text_contents(),
               ["iterations"] + [r["label"] for r in whole["rows"]], what="timeline rows")
    kinds = [labels.nth(i + 1).get_attribute("data-kind") for i in range(len(whole["rows"]))]
    assert kinds == [r["kind"] for r in whole["rows"]]
    eventually(lambda: int(mem_page.locator("[data-testid=timeline-canvas]").get_attribute(
        "data-bars") or 0) > 0, True, what="bars drawn")
    screenshot(mem_page, "timeline-python")


def test_a_zoomed_range_is_sampled_again_from_the_raw_trace(mem_page, mem_server) -> None:
    report = mem_server.route("report", run=RUN_BIG)
    (dev,) = [d for d in report["memory"]["devices"] if d["device"].startswith("cuda")]
    whole = dev["series"]
    assert whole["downsampled_from"] > len(whole["t_ms"])
    lo, hi = round(dev["peak"]["t_ms"] - 1.0, 3), round(dev["peak"]["t_ms"] + 1.0, 3)
    _open_memory(mem_page, RUN_BIG)
    bar = mem_page.locator("[data-testid=memory-range]")
    assert bar.get_attribute("data-source") == "report"
    mem_page.fill("[data-testid=memory-range-to]", str(hi))
    mem_page.locator("[data-testid=memory-range-to]").dispatch_event("change")
    mem_page.fill("[data-testid=memory-range-from]", str(lo))
    mem_page.locator("[data-testid=memory-range-from]").dispatch_event("change")
    eventually(lambda: bar.get_attribute("data-source"), check=lambda v: v == "trace",
               what="the zoomed series from the trace")
    answer = mem_server.route("memory", run=RUN_BIG, device=dev["device"], start_ms=lo,
                              end_ms=hi)
    in_report = sum(lo <= t <= hi for t in whole["t_ms"])
    points = int(bar.get_attribute("data-points") or 0)
    assert points == sum(lo <= t <= hi for t in answer["series"]["t_ms"]) > in_report
    assert fmt_bytes(dev["peak"]["allocated_bytes"]) in \
        mem_page.locator("[data-testid=memory-range-text]").text_content()
    mem_page.click("[data-testid=memory-range-reset]")
    eventually(lambda: bar.get_attribute("data-source"), check=lambda v: v == "report",
               what="the report's series again")
