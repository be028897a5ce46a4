"""The report's memory section from a real tiny CPU training loop under the PyTorch hook (the
CPU allocator's ``profile_memory`` events), the option that turns it off, down-sampling, and
the Python rows the same window gives the Timeline."""

from __future__ import annotations

import gzip
import json
import random
from array import array

import pytest

torch = pytest.importorskip("torch")

from tb_gpuprof.analysis.iterations import IterationWindow  # noqa: E402
from tb_gpuprof.analysis.memory import MAX_POINTS, NOT_RECORDED, memory_section  # noqa: E402
from tb_gpuprof.model import CpuOp, MemoryEvents, Profile  # noqa: E402
from tb_gpuprof.plugin.timeline import TimelineIndex  # noqa: E402
from tb_gpuprof.readers import load_profile  # noqa: E402
from tb_gpuprof.torch import GpuProfiler  # noqa: E402

HELD = 2_000_000  # floats held through iteration HELD_AT: 8,000,000 bytes
HELD_AT = 4


def _loop(run: str, **options: object) -> GpuProfiler:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(9)]
    with GpuProfiler(run, iter_start=3, iter_stop=6, **options) as prof:
        for i, (x, y) in enumerate(data):
            held = torch.ones(HELD) if i == HELD_AT else None
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            del held
            prof.step()
    assert prof.report is not None and prof.trace_path is not None
    return prof


def _raw_memory_events(trace_path: str) -> list[dict]:
    """The allocator events of the stored trace, read with the standard library's json."""
    with gzip.open(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "i" and e.get("name") == "[memory]"]


@pytest.fixture(scope="module")
def with_memory(tmp_path_factory: pytest.TempPathFactory) -> GpuProfiler:
    return _loop(str(tmp_path_factory.mktemp("mem") / "run"), with_stack=True)


def test_the_peak_is_the_allocators_and_names_the_op_that_held_it(with_memory) -> None:
    report = with_memory.report
    mem = report["memory"]
    assert mem["recorded"] and mem["note"] is None
    (cpu,) = mem["devices"]
    assert cpu["device"] == "cpu" and cpu["series"]["reserved_bytes"] is None
    # truth: the CPU allocator's own running total, from the stored raw trace, inside the
    # analyzed iterations
    items = report["iterations"]["items"]
    lo = items[0]["start_us"]
    hi = items[-1]["start_us"] + items[-1]["wall_ms"] * 1e3
    raw = [e for e in _raw_memory_events(with_memory.trace_path) if lo <= e["ts"] <= hi]
    assert raw and cpu["events"] == len(raw)
    truth = max(e["args"]["Total Allocated"] for e in raw)
    assert cpu["peak"]["allocated_bytes"] == truth
    assert cpu["peak"]["step"] == HELD_AT
    assert truth >= HELD * 4
    # the held tensor is live at the peak, charged to aten::ones at this file's line
    top = cpu["holders"][0]
    assert top["op"] == "aten::ones" and top["bytes"] == HELD * 4 and top["allocations"] == 1
    assert top["source"] and "test_memory.py(" in top["source"]
    assert sum(h["bytes"] for h in cpu["holders"]) + cpu["held_before_window_bytes"] \
        <= truth
    # per iteration: the held tensor's iteration is the highest, by the tensor's size
    per = {it["step"]: it["allocated_bytes"] for it in cpu["iterations"]}
    assert sorted(per) == [3, 4, 5]
    assert max(per, key=per.__getitem__) == HELD_AT
    assert per[HELD_AT] - max(per[3], per[5]) >= HELD * 4 * 0.99
    series = cpu["series"]
    assert len(series["t_ms"]) == len(raw) <= MAX_POINTS  # few events: every one kept
    assert max(series["allocated_bytes"]) == truth
    assert series["t_ms"] == sorted(series["t_ms"])
    assert mem["scalar_tags"]["allocated_peak_mb"] == "gpuprof/memory_allocated_peak_mb"


def test_the_window_gives_the_timeline_python_rows(with_memory) -> None:
    profile = load_profile(with_memory.trace_path)
    index = TimelineIndex(profile, with_memory.report)
    answer = index.window(None, None, 1000)
    rows = answer["rows"]
    python = [r for r in rows if r["kind"] == "python"]
    assert python, rows
    # a thread's Python row follows its CPU row (threads with Python calls only come last)
    cpu_threads = {r["label"].split()[-1]: r["id"] for r in rows if r["kind"] == "cpu"}
    assert any(r["label"].split()[-1] in cpu_threads for r in python)
    for r in python:
        tid = r["label"].split()[-1]
        assert r["id"] == cpu_threads[tid] + 1 if tid in cpu_threads else r["id"] > max(
            cpu_threads.values())
    cat = answer["categories"].index("python")
    bars = answer["bars"]
    rows_of_python_bars = {row for row, c in zip(bars["row"], bars["cat"], strict=True)
                           if c == cat}
    assert rows_of_python_bars == {r["id"] for r in python}
    assert sum(n for n, c in zip(bars["count"], bars["cat"], strict=True) if c == cat) == \
        sum(r["events"] for r in python)
    single = next(i for i, c in zip(bars["id"], bars["cat"], strict=True) if c == cat and i >= 0)
    ev = index.event(single)
    assert ev["category"] == "python" and ev["name"] in set(profile.python.name)


def test_record_memory_off_records_no_allocator_events(tmp_path) -> None:
    prof = _loop(str(tmp_path / "off"), record_memory=False)
    assert _raw_memory_events(prof.trace_path) == []
    mem = prof.report["memory"]
    assert mem["recorded"] is False and mem["devices"] == [] and mem["note"] == NOT_RECORDED
    assert "record_memory=True" in mem["note"] and "profile_memory=True" in mem["note"]


def test_record_memory_is_checked() -> None:
    with pytest.raises(TypeError, match="record_memory"):
        GpuProfiler("x", iter_start=1, record_memory="yes")  # type: ignore[arg-type]


def test_down_sampling_keeps_the_peak_and_the_troughs() -> None:
    """A 200,000-event sawtooth with one spike: at most MAX_POINTS points, the spike and the
    lowest value among them, in time order."""
    rng = random.Random(7)
    mem = MemoryEvents()
    total, t = 0, 0.0
    live: list[tuple[int, int]] = []
    spike_at = 123_457
    for i in range(200_000):
        t += rng.uniform(0.5, 1.5)
        if i == spike_at:
            size = 10**9
        elif live and (rng.random() < 0.5 or len(live) > 50):
            addr, size = live.pop(rng.randrange(len(live)))
            size = -size
        else:
            size = rng.randrange(1, 1 << 20)
        if size > 0:
            live.append((i + 1, size))
            addr = i + 1
        total += size
        for col, v in ((mem.ts, t), (mem.nbytes, size), (mem.allocated, total),
                       (mem.reserved, -1), (mem.addr, addr), (mem.device_type, 0),
                       (mem.device_id, -1), (mem.tid, 1)):
            col.append(v)
    profile = Profile(source="synthetic", format="kineto", memory=mem,
                      cpu_ops=[CpuOp("aten::spike", mem.ts[spike_at] - 0.1, 0.2, tid=1)])
    windows = [IterationWindow(0, 0, 0.0, t / 2), IterationWindow(1, 1, t / 2, t + 1)]
    (dev,) = memory_section(profile, windows, None)["devices"]
    series = dev["series"]
    assert dev["events"] == 200_000 and series["downsampled_from"] == 200_000
    assert len(series["t_ms"]) <= MAX_POINTS
    assert series["t_ms"] == sorted(series["t_ms"])
    assert max(series["allocated_bytes"]) == max(mem.allocated) == dev["peak"]["allocated_bytes"]
    assert min(series["allocated_bytes"]) == min(mem.allocated)
    assert dev["peak"]["step"] == 1
    assert dev["holders"][0] == {"op": "aten::spike", "source": None, "stack": None,
                                 "bytes": 10**9, "allocations": 1}
    # live at the peak = the allocator's total (nothing predates the trace)
    assert dev["held_before_window_bytes"] == 0
    assert sum(h["bytes"] for h in dev["holders"]) <= dev["peak"]["allocated_bytes"]
    assert array("q", [i["allocated_bytes"] for i in dev["iterations"]]).tolist() == [
        max(mem.allocated[i] for i in range(len(mem.ts)) if mem.ts[i] <= t / 2),
        max(mem.allocated[i] for i in range(len(mem.ts)) if mem.ts[i] >= t / 2)]
