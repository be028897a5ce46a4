"""Kineto reader on the real H200 trace, its layout variants, and the format's special events.

Expected values come from an independent plain ``json.load`` of the same file, never from the
reader's own output.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from tb_gpuprof.errors import EmptyProfileError
from tb_gpuprof.model import DATALOADER, KERNEL, MEMCPY, MEMSET, OPTIMIZER, STEP, USER
from tb_gpuprof.readers import kineto, load_profile
from tb_gpuprof.readers.kineto import is_user_frame, read_kineto


@pytest.fixture(scope="module")
def trace_doc(kineto_trace: Path) -> dict:
    with gzip.open(kineto_trace, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def profile(kineto_trace: Path):
    return load_profile(kineto_trace)


def _events(doc, cat):
    return [e for e in doc["traceEvents"] if e.get("cat") == cat and e.get("ph") == "X"]


def _summary(p):
    """Everything a layout variant must reproduce exactly."""
    return (
        [(a.kind, a.name, a.start_us, a.dur_us, a.correlation, a.grid, a.bytes) for a in p.gpu],
        [(o.name, o.start_us, o.external_id, o.input_shapes, o.input_types, o.stack)
         for o in p.cpu_ops],
        [(r.name, r.start_us, r.correlation) for r in p.runtime],
        [(a.name, a.kind, a.on_gpu, a.step) for a in p.annotations],
        p.devices,
        {k: v for k, v in p.metadata.items() if k != "traceName"},
    )


def test_counts_match_an_independent_json_load(profile, trace_doc):
    kinds = Counter(a.kind for a in profile.gpu)
    assert kinds[KERNEL] == len(_events(trace_doc, "kernel")) > 0
    assert kinds[MEMCPY] == len(_events(trace_doc, "gpu_memcpy")) > 0
    assert kinds[MEMSET] == len(_events(trace_doc, "gpu_memset")) > 0
    assert len(profile.cpu_ops) == len(_events(trace_doc, "cpu_op")) > 0
    assert len(profile.runtime) == (len(_events(trace_doc, "cuda_runtime"))
                                    + len(_events(trace_doc, "cuda_driver")))
    assert Counter(r.name for r in profile.runtime) == Counter(
        e["name"] for e in _events(trace_doc, "cuda_runtime") + _events(trace_doc, "cuda_driver"))
    host = _events(trace_doc, "user_annotation")
    gpu = _events(trace_doc, "gpu_user_annotation")
    assert sum(not a.on_gpu for a in profile.annotations) == len(host)
    assert sum(a.on_gpu for a in profile.annotations) == len(gpu)
    assert profile.metadata["events"] == len(trace_doc["traceEvents"])


def test_kernel_fields_match_the_json(profile, trace_doc):
    by_corr = {a.correlation: a for a in profile.gpu if a.kind == KERNEL}
    for e in _events(trace_doc, "kernel"):
        k, args = by_corr[e["args"]["correlation"]], e["args"]
        assert (k.name, k.start_us, k.dur_us) == (e["name"], e["ts"], e["dur"])
        assert (k.device, k.stream, k.external_id) == (
            args["device"], args["stream"], args["External id"])
        assert k.grid == tuple(args["grid"]) and k.block == tuple(args["block"])
        assert k.registers == args["registers per thread"]
        assert k.shared_mem == args["shared memory"]
        assert k.blocks_per_sm == args["blocks per SM"]
        assert k.occupancy == args["est. achieved occupancy %"]
    copies = {a.correlation: a for a in profile.gpu if a.kind != KERNEL}
    for e in _events(trace_doc, "gpu_memcpy") + _events(trace_doc, "gpu_memset"):
        assert copies[e["args"]["correlation"]].bytes == e["args"]["bytes"]


def test_cpu_ops_carry_shapes_and_types(profile, trace_doc):
    by_ext = {o.external_id: o for o in profile.cpu_ops}
    for e in _events(trace_doc, "cpu_op"):
        op = by_ext[e["args"]["External id"]]
        assert op.name == e["name"] and op.tid == e["tid"]
        assert op.input_shapes == e["args"].get("Input Dims")
        assert op.input_types == e["args"].get("Input type")
    # launches link to ops through external ids, kernels to launches through correlation ids
    launches = {r.correlation: r for r in profile.runtime}
    linked = [k for k in profile.kernels if k.correlation in launches]
    assert len(linked) == len(profile.kernels)
    assert all(launches[k.correlation].external_id == k.external_id for k in linked)


def test_devices_and_metadata(profile, trace_doc):
    props = trace_doc["deviceProperties"]
    assert [(d.id, d.name, d.compute_major, d.compute_minor, d.num_sms, d.total_memory)
            for d in profile.devices] == [
        (p["id"], p["name"], p["computeMajor"], p["computeMinor"], p["numSms"],
         p["totalGlobalMem"]) for p in props]
    for key in ("cuda_driver_version", "cuda_runtime_version", "cupti_version", "with_stack",
                "record_shapes", "with_flops", "baseTimeNanoseconds", "traceName"):
        assert profile.metadata[key] == trace_doc[key]


def test_annotation_kinds(profile, trace_doc):
    expected = Counter()
    for e in _events(trace_doc, "user_annotation") + _events(trace_doc, "gpu_user_annotation"):
        kind = (OPTIMIZER if e["name"].startswith("Optimizer.step#") else
                STEP if e["name"].startswith("ProfilerStep#") else
                DATALOADER if e["name"].startswith("enumerate(DataLoader)#") else USER)
        expected[(e["name"], kind, e["cat"] == "gpu_user_annotation")] += 1
    assert Counter((a.name, a.kind, a.on_gpu) for a in profile.annotations) == expected
    assert any(a.kind == OPTIMIZER for a in profile.annotations)


def test_python_stacks_are_the_enclosing_user_frames(profile, trace_doc):
    frames = [e for e in _events(trace_doc, "python_function") if is_user_frame(e["name"])]
    with_stack = [o for o in profile.cpu_ops if o.stack]
    assert with_stack, "the fixture was recorded with_stack=True"
    for op in with_stack[:: max(1, len(with_stack) // 200)]:  # brute force on a sample
        enclosing = [f for f in frames if f["tid"] == op.tid
                     and f["ts"] <= op.start_us <= f["ts"] + f["dur"]]
        enclosing.sort(key=lambda f: (f["ts"], -f["dur"]))
        assert op.stack == [f["name"] for f in reversed(enclosing)][: kineto.MAX_STACK_FRAMES]
    assert all(is_user_frame(f) for o in with_stack for f in o.stack)


@pytest.mark.parametrize("frame,user", [
    ("torch_probe2.py(53): <module>", True),
    ("/home/me/project/train.py(12): step", True),
    ("models/resnet.py(88): forward", True),
    ("torch/nn/modules/module.py(1783): _call_impl", False),
    ("<built-in method linear of PyCapsule object at 0x7f>", False),
    ("nn.Module: TransformerEncoderLayer_0", False),
    ("typing.py(2154): cast", False),
    ("<frozen os>(779): getenv", False),
    ("/usr/lib/python3.11/threading.py(1002): run", False),
    ("/venv/lib/python3.11/site-packages/timm/models/vit.py(40): forward", False),
])
def test_user_frame_rule(frame, user):
    assert is_user_frame(frame) is user


def _write(path: Path, text: str) -> Path:
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def _kineto_layout(events) -> str:
    """Kineto's own writer: one event per "  {\\n...\\n  }," block."""
    return "[\n" + ",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in events) + "\n]\n"


@pytest.mark.parametrize("variant", ["bare_list.json", "compact.pt.trace.json",
                                     "compact_list.json.gz", "indent4.json.gz", "plain.json"])
def test_layout_variants_read_the_same(variant, kineto_trace, trace_doc, profile, tmp_path):
    if variant == "plain.json":
        text = gzip.decompress(kineto_trace.read_bytes()).decode()
    elif variant == "bare_list.json":
        text = _kineto_layout(trace_doc["traceEvents"])
    elif variant.startswith("compact_list"):
        text = json.dumps(trace_doc["traceEvents"])
    elif variant.startswith("compact"):
        text = json.dumps(trace_doc)
    else:
        text = json.dumps(trace_doc, indent=4)
    other = read_kineto(_write(tmp_path / variant, text))
    if "list" in variant:  # a bare list has no header: no devices, no flags
        assert _summary(other)[:4] == _summary(profile)[:4]
    else:
        assert _summary(other) == _summary(profile)


def test_small_blocks_and_full_decode_agree(kineto_trace, profile, monkeypatch):
    """Cutting at hundreds of block boundaries loses or duplicates nothing."""
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 64 << 10)
    streamed = kineto._ProfileBuilder(str(kineto_trace))
    kineto._stream_decode(str(kineto_trace), streamed)  # raises if it had to fall back
    assert _summary(streamed.finish()) == _summary(profile)
    builder = kineto._ProfileBuilder(str(kineto_trace))
    kineto._full_decode(str(kineto_trace), builder)
    assert _summary(builder.finish()) == _summary(profile)


def _trace(tmp_path: Path, events, name="t.json", **header) -> Path:
    return _write(tmp_path / name, json.dumps({**header, "traceEvents": events}, indent=1))


def _x(cat, name, ts, dur=10.0, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def test_markers_flops_distributed_and_old_call_stack(tmp_path):
    events = [
        _x("user_annotation", "ProfilerStep#7", 0, 100),
        _x("cpu_op", "ProfilerStep#8", 100, 100),  # older torch wrote steps as cpu_op
        _x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1),
        _x("user_annotation", "Optimizer.zero_grad#SGD.zero_grad", 50),
        _x("cpu_op", "aten::mm", 5, 3, **{"External id": 4, "Input Dims": [[8, 16], [16, 4]],
                                         "Input type": ["float", "float"], "flops": 1024,
                                         "Call stack": "torch/functional.py(1): f;train.py(9): "
                                                       "step;train.py(20): <module>"}),
    ]
    p = read_kineto(_trace(tmp_path, events, distributedInfo={
        "backend": "nccl", "rank": 1, "world_size": 8, "pg_count": 3}))
    steps = {a.name: (a.kind, a.step) for a in p.annotations}
    assert steps["ProfilerStep#7"] == (STEP, 7) and steps["ProfilerStep#8"] == (STEP, 8)
    assert steps["Optimizer.zero_grad#SGD.zero_grad"] == (USER, None)
    assert steps["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"][0] == DATALOADER
    (op,) = p.cpu_ops
    assert op.flops == 1024 and op.input_shapes == [[8, 16], [16, 4]]
    assert op.stack == ["train.py(9): step", "train.py(20): <module>"]
    assert p.metadata["distributed"] == {"backend": "nccl", "rank": 1, "world_size": 8}


def test_tolerates_what_kineto_gets_wrong(tmp_path):
    """Raw control characters in names and unquoted N/A (torch-tb-profiler accepts both)."""
    text = ('{"traceEvents": [\n  {\n    "ph": "X", "cat": "cpu_op", "name": "a\tb", "pid": 1,'
            ' "tid": 1, "ts": 1, "dur": 2, "args": {"External id": 5, "Sequence number": N/A}'
            '\n  },\n  {\n    "ph": '
            '"X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1,'
            ' "args": {"correlation": 3}\n  }\n]}')
    p = read_kineto(_write(tmp_path / "odd.json", text))
    assert [o.name for o in p.cpu_ops] == ["a\tb"] and len(p.kernels) == 1


def test_trace_without_events_is_empty(tmp_path):
    with pytest.raises(EmptyProfileError, match="no kernels"):
        read_kineto(_trace(tmp_path, []))


# --- streaming: every layout is decoded in batches, never as one document ----------------------

def _no_full_decode(*_args):
    raise AssertionError("fell back to decoding the whole file at once")


def _layout_text(layout: str, doc: dict) -> str:
    if layout == "one_line":  # json.dump's default: ", " and ": " separators
        return json.dumps(doc)
    if layout == "compact":  # trace mergers: no spaces at all
        return json.dumps(doc, separators=(",", ":"))
    if layout == "indent2":
        return json.dumps(doc, indent=2)
    if layout == "tabs_crlf":
        return json.dumps(doc, indent="\t").replace("\n", "\r\n")
    if layout == "bare_list_one_line":
        return json.dumps(doc["traceEvents"])
    if layout == "bare_list_kineto":
        return _kineto_layout(doc["traceEvents"])
    raise ValueError(layout)


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
@pytest.mark.parametrize("layout", ["one_line", "compact", "indent2", "tabs_crlf",
                                    "bare_list_one_line", "bare_list_kineto"])
def test_every_layout_streams_in_small_batches(layout, gz, trace_doc, profile, tmp_path,
                                               monkeypatch):
    """Hundreds of 64 KB batches; the result equals the reader's on Kineto's own file."""
    name = f"{layout}.json" + (".gz" if gz else "")
    path = _write(tmp_path / name, _layout_text(layout, trace_doc))
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr(kineto, "_full_decode", _no_full_decode)
    other = read_kineto(path)
    n = 4 if "list" in layout else 6  # a bare list has no header: no devices, no flags
    assert _summary(other)[:n] == _summary(profile)[:n]
    assert other.metadata["events"] == len(trace_doc["traceEvents"])


def test_event_gaps_inside_strings_and_nested_lists_are_not_cuts(tmp_path, monkeypatch):
    """'}, {' inside a name and inside a list of objects: wrong cuts that must be skipped."""
    tricky = 'kernel<{a}, {b}>"}, {"x'
    events = []
    for i in range(3000):
        events.append(_x("kernel", tricky + str(i), float(i), 1.0, correlation=i,
                         note=[{"k": 1}, {"k": 2}] * 3))
        events.append(_x("cpu_op", f"aten::op{i % 7}", float(i), 0.5, **{"External id": i}))
    path = _write(tmp_path / "tricky.json", json.dumps({"traceEvents": events}))
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 4 << 10)
    monkeypatch.setattr(kineto, "_full_decode", _no_full_decode)
    p = read_kineto(path)
    assert [k.name for k in p.kernels] == [e["name"] for e in events if e["cat"] == "kernel"]
    assert [o.external_id for o in p.cpu_ops] == list(range(3000))


def test_the_reader_leaves_the_garbage_collector_alone(kineto_trace):
    import gc

    assert gc.isenabled()
    before = gc.get_threshold()
    seen = []
    gc.callbacks.append(lambda phase, info: seen.append(gc.isenabled()))
    try:
        read_kineto(kineto_trace)
    finally:
        gc.callbacks.pop()
    assert gc.isenabled() and gc.get_threshold() == before
    assert seen  # collections ran while the reader built the model: it did not pause them


def test_decode_structs_are_not_tracked_by_the_collector():
    import gc

    (ev,) = kineto._EVENTS_DECODER.decode(b'[{"cat": "kernel", "args": {"grid": [1, 2, 3]}}]')
    assert not gc.is_tracked(ev) and not gc.is_tracked(ev.args)


def test_phases_the_fast_path_does_not_know_still_stream(tmp_path, monkeypatch):
    """Counters ("C"), async ("b"/"e") and events without "ph" take the plain decoder."""
    events = [_x("kernel", f"k{i}", float(i), 1.0, correlation=i) for i in range(2000)]
    events[500] = {"ph": "C", "name": "memory", "pid": 1, "ts": 500.0, "args": {"bytes": 5}}
    events[900] = {"ph": "b", "cat": "async", "name": "a", "id": 1, "ts": 900.0}
    events[1500] = {"cat": "kernel", "name": "no_ph", "pid": 0, "tid": 7, "ts": 1500.0,
                    "dur": 1.0, "args": {"correlation": 1500}}
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 16 << 10)
    monkeypatch.setattr(kineto, "_full_decode", _no_full_decode)
    p = read_kineto(_write(tmp_path / "phases.json", json.dumps({"traceEvents": events})))
    assert [k.correlation for k in p.kernels] == [i for i in range(2000) if i not in (500, 900)]
    assert p.metadata["events"] == 2000


_DATA = Path(__file__).parent / "data"
_REAL_TRACES = sorted(p for p in _DATA.rglob("*.json.gz") if p.name != "nvml_h200.json")


def _everything(p) -> tuple:
    """Every event of every kind, field by field, and the column series (Python calls,
    allocator events), so two reads agree only if they built the same model."""
    series = [list(map(list, (getattr(s, f) for f in type(s).__slots__)))
              for s in (p.python, p.memory) if s is not None]
    return (p.gpu, p.cpu_ops, p.runtime, p.annotations, p.devices, p.metadata, series)


@pytest.mark.parametrize("path", _REAL_TRACES, ids=lambda p: str(p.relative_to(_DATA)))
def test_streamed_fast_path_builds_what_the_plain_decode_builds(path, monkeypatch):
    """The streaming path (tagged structs; flows skipped by their own kind; python_function
    names judged once; 1 MB batches) against the plain full decode (one _Event list, flows
    with their real category), on every real trace in tests/data: the same model."""
    streamed = kineto._ProfileBuilder(str(path))
    kineto._stream_decode(str(path), streamed)  # raises if it had to fall back
    plain = kineto._ProfileBuilder(str(path))
    kineto._full_decode(str(path), plain)
    assert _everything(streamed.finish()) == _everything(plain.finish())
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 8 << 20)  # the block size before perf4
    big = kineto._ProfileBuilder(str(path))
    kineto._stream_decode(str(path), big)
    assert _everything(big.finish()) == _everything(read_kineto(path))


def test_a_batch_whose_views_outlive_it_does_not_stop_the_stream(trace_doc, profile, tmp_path,
                                                                  monkeypatch):
    """A Dask worker's sampling profiler can hold a frame of the decode, and with it a batch's
    Raw views into the buffer: the buffer then cannot shrink in place (CI saw BufferError)."""
    path = _write(tmp_path / "t.json", _layout_text("compact", trace_doc))
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr(kineto, "_full_decode", _no_full_decode)
    held: list = []
    add_events = kineto._ProfileBuilder.add_events

    def add_and_hold(self, events):
        held.append(events)  # what a frame held by another thread keeps alive
        return add_events(self, events)

    monkeypatch.setattr(kineto._ProfileBuilder, "add_events", add_and_hold)
    other = read_kineto(path)
    assert len(held) > 3  # several batches, each still viewed when the next one came
    assert _summary(other) == _summary(profile)
    assert other.metadata["events"] == len(trace_doc["traceEvents"])


def test_a_read_without_python_calls_gives_the_same_model_and_report_less_the_rows():
    """`tb-gpuprof report` reads with python_calls=False: Profile.python (the Timeline's rows)
    is left out, everything else, the ops' user stacks included, and the report are the same."""
    from tb_gpuprof.analysis.format import render
    from tb_gpuprof.analysis.report import build_report

    with_rows = 0
    for path in _REAL_TRACES:
        full = load_profile(path)
        lean = load_profile(path, python_calls=False)
        assert lean.python is None
        with_rows += full.python is not None and len(full.python) > 0
        try:
            report = render(build_report(full), fmt="json")
        except EmptyProfileError:
            report = None
        full.python = None
        assert _everything(lean) == _everything(full)
        if report is not None:
            assert render(build_report(lean), fmt="json") == report
    assert with_rows >= 2  # traces recorded with stacks: the option had rows to leave out
    xplane = load_profile(_DATA / "jax_conv_h200.xplane.pb", python_calls=False)  # not Kineto's
    assert xplane.gpu
