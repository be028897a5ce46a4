"""The Kineto reader's fast path (one struct per category, tagged by "cat") against its plain
path (one _Event struct for every event), on real traces and on synthetic ones with what the
fast path has to hand back: unknown and missing categories, old spellings, metadata and
instant events mid-batch, step markers written as CPU ops next to annotations of the same
start, flows with a real category. Both must build the same model, field by field.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tb_gpuprof.readers import kineto

_DATA = Path(__file__).parent / "data"
_REAL_TRACES = sorted(_DATA.rglob("*.json.gz"))


def _everything(p) -> tuple:
    series = [list(map(list, (getattr(s, f) for f in type(s).__slots__)))
              for s in (p.python, p.memory) if s is not None]
    return (p.gpu, p.cpu_ops, p.runtime, p.annotations, p.devices, p.metadata, series)


class _Counting:
    """Wraps _BatchDecoder.decode: how many batches came back as tagged structs, how many
    as plain _Event structs."""

    def __init__(self, monkeypatch) -> None:
        self.tagged = self.plain = 0
        decode = kineto._BatchDecoder.decode

        def counted(decoder, batch):
            events = decode(decoder, batch)
            if any(type(ev) is kineto._Event for ev in events):
                self.plain += 1
            elif events:
                self.tagged += 1
            return events

        monkeypatch.setattr(kineto._BatchDecoder, "decode", counted)


def _streamed_and_plain(path: Path) -> tuple[tuple, tuple]:
    streamed = kineto._ProfileBuilder(str(path))
    kineto._stream_decode(str(path), streamed)  # raises if it had to fall back
    plain = kineto._ProfileBuilder(str(path))
    kineto._full_decode(str(path), plain)
    return _everything(streamed.finish()), _everything(plain.finish())


@pytest.mark.parametrize("path", _REAL_TRACES, ids=lambda p: str(p.relative_to(_DATA)))
def test_real_traces_take_the_tagged_structs_and_build_the_plain_model(path, monkeypatch):
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 256 << 10)
    count = _Counting(monkeypatch)
    streamed, plain = _streamed_and_plain(path)
    assert streamed == plain
    assert count.tagged > 0
    assert count.plain <= 1  # at most the batch with the trailing "M" events


def test_every_category_spelling_has_its_own_tagged_struct():
    tags = {t.__struct_config__.tag: t for t in kineto._READ_TYPES}
    assert set(kineto._CATEGORY) | {"Trace"} == set(tags)
    assert all(t.cat == tag for tag, t in tags.items())
    for cat, kind in kineto._CATEGORY.items():
        assert issubclass(tags[cat], kineto._STRUCT_OF_KIND[kind])


def _x(cat, name, ts, dur=1.0, tid=7, **args):
    ev = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def _odd_events(n: int, seed: int) -> list[dict]:
    """Every kind of event the reader knows and some it does not, shuffled into batches."""
    rng = random.Random(seed)
    events: list[dict] = []
    for i in range(n):
        ts = float(rng.randrange(0, 40))  # many equal starts in every batch: ties matter
        r = rng.random()
        if r < 0.25:
            events.append(_x(rng.choice(["cpu_op", "operator", "Operator"]),
                             rng.choice(["aten::mm", "aten::conv2d", "aten::add_"]), ts,
                             **{"External id": i, "Input Dims": [[i % 3 + 1, 4], [4, 2]],
                                "Input type": ["float", rng.choice(["float", "c10::Half"])],
                                "Concrete Inputs": ["", "[1, 1]"], "Input Strides": [[4, 1]],
                                "flops": float(i)}))
        elif r < 0.3:
            events.append(_x("cpu_op", f"ProfilerStep#{i}", ts))  # an older torch's step
        elif r < 0.35:
            events.append(_x(rng.choice(["user_annotation", "gpu_user_annotation"]),
                             rng.choice(["ProfilerStep#3", "Optimizer.step#SGD.step", "fwd"]),
                             ts))
        elif r < 0.5:
            events.append(_x(rng.choice(["python_function", "python", "Python"]),
                             rng.choice(["train.py(12): step", "torch/nn/modules/module.py(1):"
                                         " _call_impl", "<built-in method x>"]), ts, dur=5.0,
                             **{"Python id": i, "Python parent id": None}))
        elif r < 0.6:
            events.append(_x(rng.choice(["cuda_runtime", "cuda_driver", "Runtime"]),
                             "cudaLaunchKernel", ts, **{"External id": i, "correlation": i,
                                                        "cbid": 211}))
        elif r < 0.7:
            events.append(_x(rng.choice(["kernel", "Kernel"]), f"k{i % 5}", ts, tid=3,
                             **{"device": 0, "stream": 7, "correlation": i, "grid": [2, 1, 1],
                                "block": [128], "registers per thread": 32,
                                "shared memory": 0, "blocks per SM": 0.5,
                                "est. achieved occupancy %": 12}))
        elif r < 0.74:
            events.append(_x(rng.choice(["gpu_memcpy", "Memcpy", "gpu_memset", "Memset"]),
                             "Memcpy HtoD", ts, tid=3, **{"device": 0, "stream": 7,
                                                           "correlation": i, "bytes": 4096}))
        elif r < 0.78:
            events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                           "pid": 1, "tid": 7, "ts": ts,
                           "args": {"Total Reserved": 1 << 20, "Total Allocated": i,
                                    "Bytes": 512, "Device Id": 0, "Device Type": 1,
                                    "Addr": i}})
        elif r < 0.88:
            events.append({"ph": rng.choice(["s", "f"]), "id": i, "pid": 1, "tid": 7, "ts": ts,
                           "cat": rng.choice(["ac2g", "fwdbwd"]), "name": "ac2g"})
        elif r < 0.9:  # a flow with a category the model reads: both paths take it as one
            events.append({"ph": "f", "id": i, "pid": 1, "tid": 7, "ts": ts, "cat": "cpu_op",
                           "name": "aten::flow_like", "bp": "e"})
        elif r < 0.93:  # categories in no list: learnt by the fast path
            events.append(_x(rng.choice(["my_new_kind", "cuda_sync", "overhead"]), "x", ts))
        elif r < 0.97:
            events.append({"ph": "X", "cat": "Trace", "ts": ts, "dur": 99.0, "pid": "Spans",
                           "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)",
                           "args": {"Op count": 0}})
        else:
            events.append(_x(rng.choice(["kernel", "cpu_op"]), "late", ts))
    # Events no tagged struct takes (no category, an empty one) in one stretch mid-trace and
    # at the end, as Kineto writes its "M" events: those batches are decoded plainly.
    for at in (n // 2, len(events)):
        events[at:at] = [
            {"name": "thread_name", "ph": "M", "ts": 5.0, "pid": 1, "tid": at,
             "args": {"name": f"thread {at}"}},
            {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "",
             "tid": "", "ts": 6.0},
            _x("", "thread_name", 7.0)]
    return events


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("layout", ["line", "kineto"])
def test_odd_traces_build_the_same_model_both_ways(seed, layout, tmp_path, monkeypatch):
    events = _odd_events(3000, seed)
    doc = {"schemaVersion": 1, "traceEvents": events}
    if layout == "line":
        text = json.dumps(doc)
    else:
        text = '{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(
            "  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in events) + "\n]}\n"
    path = tmp_path / "odd.json"
    path.write_text(text)
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 8 << 10)  # dozens of batches
    count = _Counting(monkeypatch)
    streamed, plain = _streamed_and_plain(path)
    assert streamed == plain
    assert count.tagged > 50 and count.plain <= 3  # learning, mid-trace, end
    assert len(streamed[1]) > 500 and len(streamed[3]) > 100  # ops and annotations built


def test_a_new_category_costs_one_batch(tmp_path, monkeypatch):
    events = []
    for i in range(4000):
        events.append(_x("cpu_op", "aten::add", float(i), **{"External id": i}))
        events.append(_x("vendor_runtime", "vendorLaunch", float(i)))  # in no list
    path = tmp_path / "new_kind.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 16 << 10)
    count = _Counting(monkeypatch)
    streamed, plain = _streamed_and_plain(path)
    assert streamed == plain
    assert count.plain == 1 and count.tagged > 10


def test_uncategorised_events_everywhere_stop_the_tagged_decode(tmp_path, monkeypatch):
    events = []
    for i in range(4000):
        events.append(_x("cpu_op", "aten::add", float(i), **{"External id": i}))
        events.append({"name": "process_sort_index", "ph": "M", "pid": i, "args": {}})
    path = tmp_path / "metadata_everywhere.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 16 << 10)
    tried = []
    decode = kineto._BatchDecoder.decode

    def watch(decoder, batch):
        tried.append(decoder._tagged is not None)
        return decode(decoder, batch)

    monkeypatch.setattr(kineto._BatchDecoder, "decode", watch)
    streamed, plain = _streamed_and_plain(path)
    assert streamed == plain
    assert 2 <= tried.count(True) <= 4 and len(tried) > 30  # a quarter of the first batches


def test_an_op_name_with_more_distinct_shapes_than_kept_reads_the_same(tmp_path, monkeypatch):
    """_OpName keeps 16 texts per argument; past that the ops still get their own values."""
    rng = random.Random(3)
    events = [_x("cpu_op", "aten::mm", float(i), **{
        "External id": i, "Input Dims": [[rng.randrange(1, 60), 8], [8, 4]],
        "Input type": [rng.choice(["float", "c10::BFloat16", "c10::Half"])] * rng.randrange(
            1, 12)}) for i in range(5000)]
    path = tmp_path / "many_shapes.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 16 << 10)
    streamed, plain = _streamed_and_plain(path)
    assert streamed == plain
    ops = streamed[1]
    assert [o.input_shapes for o in ops] == [e["args"]["Input Dims"] for e in events]
    assert [o.input_types for o in ops] == [e["args"]["Input type"] for e in events]


def _sweep_each_op(frames, ops) -> None:
    """The stack sweep as it was, one step per op: the reference for kineto._sweep."""
    open_frames: list = []
    current = None
    i, n = 0, len(frames)
    for op in ops:
        t = op.start_us
        changed = False
        while i < n and frames[i][0] <= t:
            start, end, name = frames[i]
            i += 1
            while open_frames and open_frames[-1][0] <= start:
                open_frames.pop()
            open_frames.append((end, name))
            changed = True
        while open_frames and open_frames[-1][0] < t:
            open_frames.pop()
            changed = True
        if changed:
            top = open_frames[-kineto.MAX_STACK_FRAMES:]
            current = [name for _, name in reversed(top)] or None
        op.stack = current


@pytest.mark.parametrize("seed", range(40))
def test_the_stack_sweep_gives_every_op_what_a_step_per_op_gives(seed):
    from tb_gpuprof.model import CpuOp

    rng = random.Random(seed)
    span = rng.choice([5, 50, 500])  # few distinct times: many ties at starts and ends
    frames = []
    for k in range(rng.randrange(0, 60)):
        start = float(rng.randrange(span))
        frames.append((start, start + rng.choice([0.0, 1.0, float(rng.randrange(span))]),
                       f"f{k}.py(1): g"))
    if seed % 10 == 9:
        frames.append((float("nan"), 3.0, "nan.py(1): g"))
    frames.sort(key=lambda f: (f[0], -f[1]))
    starts = sorted(float(rng.randrange(span)) for _ in range(rng.randrange(0, 400)))
    if seed % 10 == 8:
        starts.insert(len(starts) // 2, float("nan"))
    fast = [CpuOp("op", t, 1.0) for t in starts]
    slow = [CpuOp("op", t, 1.0) for t in starts]
    kineto._sweep(frames, fast)
    _sweep_each_op(frames, slow)
    assert [o.stack for o in fast] == [o.stack for o in slow]


def test_the_stack_sweep_steps_op_by_op_past_a_nan_start():
    from tb_gpuprof.model import CpuOp

    frames = [(0.0, 3.0, "a.py(1): f"), (0.5, 2.0, "b.py(1): g")]
    starts = [1.0, 4.0, float("nan"), 6.0]  # a NaN leaves a list sorted by start unsorted
    fast = [CpuOp("op", t, 1.0) for t in starts]
    slow = [CpuOp("op", t, 1.0) for t in starts]
    kineto._sweep(frames, fast)
    _sweep_each_op(frames, slow)
    assert [o.stack for o in fast] == [o.stack for o in slow]
    assert fast[0].stack == ["b.py(1): g", "a.py(1): f"] and fast[1].stack is None


def test_tagged_structs_are_not_tracked_by_the_collector():
    import gc

    events = kineto._TAGGED_DECODER.decode(json.dumps([
        _x("cpu_op", "aten::mm", 1.0, **{"Input Dims": [[1]], "Input type": ["float"]}),
        _x("python_function", "a.py(1): f", 1.0), _x("kernel", "k", 1.0, grid=[1, 2, 3]),
        _x("Operator", "aten::mm", 1.0), {"ph": "s", "cat": "ac2g", "id": 1}]).encode())
    assert [type(ev).cat for ev in events] == ["cpu_op", "python_function", "kernel",
                                               "Operator", "ac2g"]
    for ev in events:
        assert not gc.is_tracked(ev)
        if hasattr(ev, "args"):
            assert not gc.is_tracked(ev.args)
