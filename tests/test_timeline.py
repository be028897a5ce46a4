"""The /timeline level of detail (tb_gpuprof.plugin.timeline) on a real launch-bound H200 window:
every event is counted once, no lane gets more bars than pixels, a deep zoom shows exactly the
events of the range, and a clicked kernel names the op that launched it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.plugin import timeline
from tb_gpuprof.plugin.timeline import CATEGORIES, TimelineError, TimelineIndex
from tb_gpuprof.readers import load_profile

TRACE = Path(__file__).parent / "data" / "h200_loops" / "gpt2_eager.json.gz"


@pytest.fixture(scope="module")
def window():
    profile = load_profile(TRACE)
    report = build_report(profile)
    return profile, report, TimelineIndex(profile, report)


def _bars(answer):
    b = answer["bars"]
    return [dict(zip(b, vals, strict=True)) for vals in zip(*b.values(), strict=True)]


def test_whole_window_counts_every_event_once_within_the_pixel_budget(window) -> None:
    profile, _, index = window
    width = 800
    answer = index.window(None, None, width)
    bars = _bars(answer)
    total = len(profile.cpu_ops) + len(profile.runtime) + len(profile.gpu)
    assert answer["events"] == total
    assert sum(b["count"] for b in bars) == total
    lanes: dict[tuple[int, int], list] = {}
    for b in bars:
        lanes.setdefault((b["row"], b["lane"]), []).append(b)
    for lane in lanes.values():
        assert len(lane) <= width + 1
        starts = [b["start"] for b in lane]
        assert starts == sorted(starts)
        # bars are at least a pixel apart (times are rounded to the nanosecond)
        px = answer["px_us"]
        for a, b in itertools.pairwise(lane):
            assert b["start"] - a["end"] >= px - 2e-3
    assert any(b["count"] > 1 for b in bars) and len(bars) < total / 3

    kinds = [r["kind"] for r in answer["rows"]]
    assert kinds.count("gpu") >= 1 and kinds.count("cpu") >= 1
    assert sum(r["events"] for r in answer["rows"]) == total


def test_pre_merged_copies_give_the_same_bars_as_merging_every_event(window, monkeypatch) -> None:
    profile, report, exact = window
    assert all(len(lane.levels) == 1 for lane in exact.lanes)  # short lanes: every event
    monkeypatch.setattr(timeline, "COARSE_MIN_EVENTS", 1000)
    monkeypatch.setattr(timeline, "COARSE_PIXELS", 2048)
    index = TimelineIndex(profile, report)
    assert any(len(lane.levels) > 1 for lane in index.lanes)
    span = index.t1 - index.t0
    for width in (300, 1600):
        assert index.window(0, span, width)["bars"] == exact.window(0, span, width)["bars"]
    # inside a range the same too, but for each lane's first and last bar: a pre-merged
    # entry across an edge also counts its events beyond it
    lo, hi = span / 3, span / 2

    def inner(answer):
        lanes: dict[tuple[int, int], list] = {}
        for b in _bars(answer):
            lanes.setdefault((b["row"], b["lane"]), []).append(
                {**b, "name": answer["names"][b["name"]]})
        return {k: v[1:-1] for k, v in lanes.items()}

    coarse, fine = inner(index.window(lo, hi, 200)), inner(exact.window(lo, hi, 200))
    assert coarse == fine and sum(map(len, fine.values())) > 10


def test_deep_zoom_shows_exactly_the_events_of_the_range(window) -> None:
    profile, _, index = window
    kernels = sorted((a for a in profile.gpu), key=lambda a: a.start_us)
    mid = kernels[len(kernels) // 2]
    lo = mid.start_us - index.t0 - 50.0
    hi = lo + 100.0
    answer = index.window(lo, hi, 4000)  # 25 ns per pixel
    bars = _bars(answer)
    gpu_rows = {r["id"] for r in answer["rows"] if r["kind"] == "gpu"}
    shown = {b["id"] for b in bars if b["row"] in gpu_rows}
    expected = {i for i, e in enumerate(index.events)
                if i >= len(profile.cpu_ops) + len(profile.runtime)
                and e.start_us - index.t0 <= hi and e.start_us + e.dur_us - index.t0 >= lo}
    assert -1 not in shown and shown == expected
    assert mid.name in [answer["names"][b["name"]] for b in bars]
    assert {CATEGORIES[b["cat"]] for b in bars if b["row"] in gpu_rows} <= {"kernel", "memcpy",
                                                                             "memset", "nccl"}


def test_a_clicked_kernel_names_its_op_shapes_and_stack(window) -> None:
    profile, _, index = window
    by_external = {op.external_id: op for op in profile.cpu_ops if op.external_id is not None}
    offset = len(profile.cpu_ops) + len(profile.runtime)
    i, kernel = next((i, a) for i, a in enumerate(profile.gpu)
                     if a.external_id in by_external and by_external[a.external_id].input_shapes)
    details = index.event(offset + i)
    op = by_external[kernel.external_id]
    assert details["name"] == kernel.name and details["category"] in ("kernel", "nccl")
    assert details["op"] == op.name and details["input_shapes"] == op.input_shapes
    assert details["grid"] == kernel.grid and details["dur_us"] == kernel.dur_us
    with pytest.raises(TimelineError):
        index.event(len(index.events))


def test_iterations_carry_their_bottleneck(window) -> None:
    _, report, index = window
    marks = index.iterations
    items = report["iterations"]["items"]
    assert [m["step"] for m in marks] == [it["step"] for it in items]
    for mark, shares in zip(marks, report["bottleneck"]["items"], strict=True):
        ms = {k: v for k, v in shares.items() if k != "step"}
        assert mark["bound"] == max(ms, key=ms.__getitem__)
        assert mark["end_us"] > mark["start_us"]


@pytest.mark.parametrize(("start", "end", "width"), [(10.0, 5.0, 100), (0.0, 1.0, 0),
                                                     (0.0, 1.0, 10**6)])
def test_bad_ranges_are_typed_errors(window, start, end, width) -> None:
    with pytest.raises(TimelineError):
        window[2].window(start, end, width)
