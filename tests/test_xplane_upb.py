"""The upb XPlane path (protobuf's C decoder, the project's schema) against the wire decoder.

The wire decoder (``read_xplane(path, decoder="wire")``, the reader before upb) is the
reference: on every real fixture and on synthetic planes with the odd
encodings (stats whose id is not first, aggregated events, unknown fields, negative values)
the two must build equal Profiles, field for field.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tb_gpuprof.readers import xplane_schema
from tb_gpuprof.readers.xplane import read_xplane
from tests import xplane_builder as xb

REPO = Path(__file__).resolve().parents[1]
REAL = [REPO / "tests" / "data" / "jax_conv_h200.xplane.pb",
        REPO / "tests" / "data" / "jax_steps_h200.xplane.pb"]


def _both(path: Path):
    return read_xplane(path, decoder="upb"), read_xplane(path, decoder="wire")


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_fixtures_decode_the_same(path):
    upb, wire = _both(path)
    assert upb.gpu and (upb.runtime or upb.cpu_ops)
    assert upb == wire


def _id_last(pb: xb.PlaneBuilder, name: str, value: int) -> bytes:
    """An XStat with its value before its metadata_id (legal; no writer we know does it)."""
    return xb.f_varint(3, value) + xb.f_varint(1, pb.stat_id(name))


def _aggregated(pb: xb.PlaneBuilder, name: str) -> bytes:
    return xb.f_varint(1, pb.event_id(name)) + xb.f_varint(3, 10) + xb.f_varint(5, 4)


def test_odd_encodings_decode_the_same(tmp_path):
    gpu = xb.PlaneBuilder("/device:GPU:0", id=1)
    gpu.add_plane_stat("core_count", 132)
    details = "regs:32 static_shared:0 dynamic_shared:0 grid:8,1,1 block:128,1,1 occ_pct:50.0"
    events = []
    for i in range(40):
        stats = [xb.xstat(gpu.stat_id("correlation_id"), 1000 + i, unsigned=True),
                 gpu.stat("kernel_details", details, as_ref=i % 2 == 0),
                 xb.xstat(gpu.stat_id("context_id"), 7000 + i, unsigned=True),
                 gpu.stat("hlo_op", f"fusion.{i % 3}", as_ref=True)]
        events.append(gpu.event(f"k{i % 3}", 1_000_000 * i, 500_000, stats,
                                canonical=i % 5 != 0))
    events.append(gpu.event("neg", 99_000_000, 7, [gpu.stat("correlation_id", -3)]))
    events.append(gpu.event("MemcpyDtoD", 5_000_000, 100_000, [
        gpu.stat("memcpy_details", "num_bytes:64"), _id_last(gpu, "correlation_id", 1)]))
    events.append(_aggregated(gpu, "k0"))
    gpu.line(1, "Stream #7(Compute)", 1000, events)
    gpu.line(3, "Counters", 1000, [gpu.event("noise", 0, 1)], events_first=True)
    host = xb.PlaneBuilder("/host:CPU", id=2)
    host.line(11, "python", 1000, [
        host.event("train", 0, 50_000_000, [host.stat("step_num", 4)]),
        host.event("cudaLaunchKernel", 10, 5_000, [host.stat("correlation_id", 1001)]),
        host.event("ThunkExecute", 20, 5_000, [_id_last(host, "correlation_id", 1002)]),
        host.event("my_range", 30, 7_000, [host.stat("other", "x")], canonical=False),
        host.event("instant", 40, 0),
        _aggregated(host, "my_range"),
    ], events_first=True)
    f = tmp_path / "odd.xplane.pb"
    f.write_bytes(xb.xspace([gpu, host]))
    upb, wire = _both(f)
    assert {a.correlation for a in upb.gpu} >= {1000, 1039, 1, -3}
    assert sorted(r.correlation for r in upb.runtime) == [1001, 1002]
    assert upb == wire


def test_schema_is_wire_compatible_with_the_tsl_field_numbers():
    """Our descriptor is built at import; its numbers are xplane.proto's (checked here by
    serializing with our full messages and reading back with the lazy ones)."""
    line = xplane_schema.XLine(id=3, name=b"Stream #1", timestamp_ns=10)
    ev = line.events.add(metadata_id=5, offset_ps=0, duration_ps=9)
    ev.stats.add(metadata_id=2, uint64_value=77)
    raw = line.SerializeToString()
    lazy = xplane_schema.XLineEvents.FromString(raw)
    assert (lazy.id, lazy.name, lazy.timestamp_ns) == (3, b"Stream #1", 10)
    (ev_bytes,) = lazy.events
    ev = xplane_schema.XEvent.FromString(ev_bytes)
    assert ev.HasField("offset_ps") and ev.duration_ps == 9
    assert ev.stats[0].uint64_value == 77
    fd = descriptor_pb2.FileDescriptorProto()
    xplane_schema.XLine.DESCRIPTOR.file.CopyToProto(fd)
    numbers = {f.name: f.number for m in fd.message_type if m.name == "XStat" for f in m.field}
    assert numbers == {"metadata_id": 1, "double_value": 2, "uint64_value": 3,
                       "int64_value": 4, "str_value": 5, "bytes_value": 6, "ref_value": 7}


def test_the_c_decoder_is_the_one_in_use():
    from google.protobuf.internal import api_implementation

    assert api_implementation.Type() == "upb"
    assert os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "upb") == "upb"


def _launch_sites(gpu: xb.PlaneBuilder, n: int) -> list[bytes]:
    """``n`` stream events from 7 launch sites: per-launch integers that differ every time,
    and the layouts the column decoder must group right or leave to upb."""
    details = [f"regs:{r} static_shared:0 dynamic_shared:0 grid:8,1,1 block:128,1,1 occ_pct:50"
               for r in (16, 32, 64)]
    corr, scope = gpu.stat_id("correlation_id"), gpu.stat_id("scope_range_id")
    events = []
    for i in range(n):
        site = i % 7
        stats = [xb.xstat(corr, 5000 + 37 * i, unsigned=True),
                 xb.xstat(scope, 10**15 + i * 1_000_003),  # per launch, not read: no key
                 gpu.stat("kernel_details", details[site % 3], as_ref=True),
                 gpu.stat("hlo_op", f"fusion.{site}", as_ref=True)]
        if site == 3:
            stats = stats[1:]  # no correlation id
        elif site == 4:
            stats.append(xb.xstat(corr, -(i + 1)))  # a second one (int64): the last counts
        elif site == 5:
            stats.append(gpu.stat("long_name", "x" * 600 + str(i % 2)))  # a key past KEY_CAP
        elif site == 6:
            stats.append(xb.xstat(gpu.stat_id("grid_x"), i % 3 + 1))  # a read int: in the key
        elif i % 10 == 2:  # a ref stat with two values: the last counts
            stats.append(xb.f_varint(1, gpu.stat_id("tf_op")) + xb.f_varint(7, corr)
                         + xb.f_varint(7, gpu.stat_id("hlo_op")))
        events.append(gpu.event(f"k{site}", 1_000_000 * i, 500_000 + i, stats))
    return events


def _host_thread(host: xb.PlaneBuilder, n: int) -> list[bytes]:
    """``n`` host events of every kind the host columns sort: steps (by stat and by name),
    runtime calls (by name and by correlation id), TF ops, weak steps, instants, frames."""
    events = [host.event("EagerExecute", 0, 10)]  # marks a TensorFlow profile: name:Type ops
    for i in range(n):
        t = 1_000_000 * i
        kind = i % 9
        if kind == 0:
            events.append(host.event("train", t, 900_000, [host.stat("step_num", i // 9)]))
        elif kind == 1:
            events.append(host.event("cudaLaunchKernel", t, 5_000,
                                     [xb.xstat(host.stat_id("correlation_id"), 5000 + i,
                                               unsigned=True)]))
        elif kind == 2:
            events.append(host.event("ThunkExecute", t, 5_000, [_id_last(host, "correlation_id",
                                                                         7000 + i)]))
        elif kind == 3:
            events.append(host.event("model/dense/MatMul:MatMul", t, 3_000))
        elif kind == 4:
            events.append(host.event(f"ProfilerStep#{i}", t, 800_000,
                                     [host.stat("correlation_id", 1)]))  # the step wins
        elif kind == 5:
            events.append(host.event("__inference_train_function_123", t, 700_000))
        elif kind == 6:
            events.append(host.event("$train.py:12 loop", t, 100))  # a Python frame: dropped
        elif kind == 7:
            events.append(host.event("my_range", t, 0))  # an instant: not a range
        else:
            events.append(host.event("cuMemcpyAsync", t, 0))
    return events


@pytest.mark.parametrize("chunk", [7, 64, 1 << 15])
def test_column_decoders_match_the_wire_decoder(tmp_path, monkeypatch, chunk):
    """Stream and host lines decoded column-wise, over several chunks, give what the wire
    decoder gives event by event; only the events the columns cannot group are parsed."""
    from tb_gpuprof.readers import xplane_upb

    monkeypatch.setattr(xplane_upb, "STREAM_CHUNK_EVENTS", chunk)
    monkeypatch.setattr(xplane_upb, "HOST_CHUNK_EVENTS", chunk)
    decoded = []
    decode = xplane_upb._StreamReader.decode
    monkeypatch.setattr(xplane_upb._StreamReader, "decode",
                        lambda self, ev: decoded.append(ev) or decode(self, ev))
    gpu = xb.PlaneBuilder("/device:GPU:0", id=1)
    gpu.add_plane_stat("core_count", 132)
    gpu.line(1, "Stream #7(Compute)", 1000, _launch_sites(gpu, 350))
    host = xb.PlaneBuilder("/host:CPU", id=2)
    host.line(11, "python", 1000, _host_thread(host, 300))
    f = tmp_path / "columns.xplane.pb"
    f.write_bytes(xb.xspace([gpu, host]))
    upb, wire = _both(f)
    assert len(upb.gpu) == 350 and {a.correlation for a in upb.gpu} >= {None, 5000, -5}
    assert any(a.kind == "step" for a in upb.annotations) and upb.runtime and upb.cpu_ops
    assert upb == wire
    alone = 50 + 50 + 15  # two correlation ids, a key past KEY_CAP, a stat with two values
    assert len(decoded) == alone + 7  # and one per launch key: sites 0-3, site 6's 3 grids


def test_real_fixtures_take_the_column_paths(monkeypatch):
    from tb_gpuprof.readers import xplane_upb

    def refuse(*args):
        raise AssertionError("an event layout the column decoder should have taken")

    monkeypatch.setattr(xplane_upb._StreamReader, "read_upb", refuse)
    monkeypatch.setattr(xplane_upb._HostLine, "read_upb", refuse)
    for path in REAL:
        assert read_xplane(path).gpu
