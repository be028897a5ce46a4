"""A Kineto trace decoded in two byte ranges at once (this process and a forked child) must
build exactly the model the read in one builds, in every layout; whatever goes wrong with the
split (no safe cut, a cut between nested objects, a failing child) must end in the read in one,
with its result or its error."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import pytest

from tb_gpuprof.errors import TraceReadError
from tb_gpuprof.readers import forked, kineto
from tb_gpuprof.readers.kineto import read_kineto


def _model(p):
    """Everything the reader builds, exactly (key order of the metadata included)."""
    py, mem = p.python, p.memory
    return (p.gpu, p.cpu_ops, p.runtime, p.annotations, p.devices, list(p.metadata.items()),
            None if mem is None else [getattr(mem, f).tobytes() for f in mem.__slots__],
            None if py is None else (py.start.tobytes(), py.dur.tobytes(), py.tid.tobytes(),
                                     py.name))


@pytest.fixture(scope="module")
def trace_text(kineto_trace: Path) -> bytes:
    return gzip.decompress(kineto_trace.read_bytes())


def _layout(name: str, text: bytes) -> bytes:
    if name == "kineto":
        return text
    doc = json.loads(text)
    if name == "one_line":
        return json.dumps(doc).encode()
    if name == "compact_bare_list":
        return json.dumps(doc["traceEvents"], separators=(",", ":")).encode()
    raise ValueError(name)


@pytest.mark.parametrize("python_calls", [True, False])
@pytest.mark.parametrize("layout", ["kineto", "one_line", "compact_bare_list"])
def test_split_read_builds_the_model_of_the_read_in_one(layout, python_calls, trace_text,
                                                        tmp_path, monkeypatch):
    path = tmp_path / f"{layout}.json"
    path.write_bytes(_layout(layout, trace_text))
    monkeypatch.setattr(kineto, "BLOCK_BYTES", 256 << 10)  # several blocks on either side
    two = kineto._read_in_two(str(path), python_calls)
    assert two is not None, "the trace was not split"
    assert _model(two) == _model(kineto._read_in_one(str(path), python_calls))


@pytest.mark.parametrize("at", [0.1, 0.5, 0.9])
def test_any_split_point_gives_the_same_model(at, trace_text, tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_bytes(trace_text)
    monkeypatch.setattr(kineto, "SPLIT_AT", at)
    two = kineto._read_in_two(str(path), True)
    assert two is not None
    assert _model(two) == _model(kineto._read_in_one(str(path), True))


def test_read_kineto_splits_a_big_plain_file_only(trace_text, tmp_path, monkeypatch):
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(trace_text)
    packed.write_bytes(gzip.compress(trace_text, 1))
    splits = []
    read_in_two = kineto._read_in_two
    monkeypatch.setattr(kineto, "_read_in_two", lambda *a: splits.append(a) or read_in_two(*a))
    monkeypatch.setattr(forked, "can_fork", lambda: True)
    read_kineto(plain)
    assert not splits, "a file under SPLIT_MIN_BYTES was split"
    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    read_kineto(packed)
    assert not splits, "a gzip file cannot be split at a byte offset"
    read_kineto(plain)
    assert len(splits) == 1


def test_a_failing_child_leaves_the_read_in_one(trace_text, tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_bytes(trace_text)

    def crash(*_args):
        raise MemoryError

    monkeypatch.setattr(kineto, "_read_from", crash)
    assert kineto._read_in_two(str(path), True) is None
    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(forked, "can_fork", lambda: True)
    assert _model(read_kineto(path)) == _model(kineto._read_in_one(str(path), True))


def test_a_cut_between_nested_objects_is_refused(tmp_path, monkeypatch):
    """Each event's args hold a long list of objects that start with the events' first key:
    the split point lands inside one, and the part before it does not decode."""
    nested = [{"ph": "n", "v": i} for i in range(400)]
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": float(i),
               "dur": 1.0, "args": {"correlation": i, "nested": nested}} for i in range(300)]
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert kineto._read_in_two(str(path), True) is None
    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(forked, "can_fork", lambda: True)
    assert [k.name for k in read_kineto(path).gpu] == [e["name"] for e in events]


def test_a_truncated_big_file_fails_as_the_read_in_one_does(trace_text, tmp_path, monkeypatch):
    path = tmp_path / "cut.json"
    path.write_bytes(trace_text[: len(trace_text) * 3 // 4])
    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(forked, "can_fork", lambda: True)
    with pytest.raises(TraceReadError) as one:
        kineto._read_in_one(str(path), True)
    with pytest.raises(TraceReadError) as split:
        read_kineto(path)
    assert str(split.value) == str(one.value)


def test_no_fork_while_other_threads_run():
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not forked.can_fork()
    finally:
        stop.set()
        other.join()


def test_a_child_that_dies_is_reaped_and_reported():
    def killed():
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
        yield 1

    with forked.ForkedJob(killed) as job, pytest.raises(forked.ChildFailed):
        list(job.results())


def test_a_childs_items_come_back_in_order():
    with forked.ForkedJob(lambda n: iter(range(n)), 5) as job:
        assert list(job.results()) == [0, 1, 2, 3, 4]


def test_no_fork_possible_leaves_the_read_in_one(trace_text, tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_bytes(trace_text)

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(forked.os, "fork", no_fork)
    assert kineto._read_in_two(str(path), True) is None
