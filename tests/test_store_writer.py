"""The TF-free event writer: TensorBoard reads what it writes, from threads, processes, ranks."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub import errors as tb_stub_errors
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

from tb_gpuprof.store import layout, records, schema
from tb_gpuprof.store.reader import event_files, iter_events
from tb_gpuprof.store.writer import EventWriter, save_raw_trace


def tb_events(path: str) -> list:
    """Events as TensorBoard's own record reader reads them, checking both CRCs of every record
    (its TF-free one; the plugin tests read through TensorBoard's loaders too)."""
    reader = PyRecordReader_New(path)
    events = []
    while True:
        try:
            reader.GetNext()
        except tb_stub_errors.OutOfRangeError:
            return events
        events.append(event_pb2.Event.FromString(reader.record()))


def only_file(run_dir: Path) -> str:
    files = event_files(str(run_dir))
    assert len(files) == 1, files
    return files[0]


def test_round_trip_through_tensorboard_reader(tmp_path, real_reports):
    report = real_reports["kineto"]
    with EventWriter(tmp_path / "run") as w:
        w.add_scalar("gpuprof/iteration_time_ms", 12.5, step=3)
        w.add_scalars({"gpuprof/gpu0/power_w": 500.0, "gpuprof/gpu0/sm_util_pct": 97.0}, step=4)
        w.add_report(report, step=7)
        w.add_json(layout.TOPOLOGY_TAG, {"gpus": [{"index": 0}]}, step=7)
    events = tb_events(only_file(tmp_path / "run"))
    assert events[0].file_version == "brain.Event:2"
    values = {(e.step, v.tag): v for e in events[1:] for v in e.summary.value}
    assert values[(3, "gpuprof/iteration_time_ms")].simple_value == 12.5
    assert values[(4, "gpuprof/gpu0/sm_util_pct")].simple_value == 97.0
    stored = values[(7, layout.report_tag(7))]
    assert stored.metadata.plugin_data.plugin_name == "gpuprof"
    assert stored.metadata.data_class == summary_pb2.DATA_CLASS_BLOB_SEQUENCE
    assert [d.size for d in stored.tensor.tensor_shape.dim] == [1]
    content = schema.parse_plugin_content(stored.metadata.plugin_data.content)
    assert content["schema_version"] == report["schema_version"]
    decoded = schema.decode_report(stored.tensor.string_val[0],
                                   stored.metadata.plugin_data.content, "test")
    assert decoded == json.loads(json.dumps(report))
    topo = values[(7, layout.TOPOLOGY_TAG)]
    assert schema.decode_json(topo.tensor.string_val[0], "t") == {"gpus": [{"index": 0}]}


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 170, 4096, 1 << 20])
def test_framing_is_byte_for_byte_tensorboards(size):
    import io
    import random

    from tensorboard.summary.writer.record_writer import RecordWriter

    data = random.Random(size).randbytes(size)
    buf = io.BytesIO()
    RecordWriter(buf).write(data)
    assert records.frame(data) == buf.getvalue()


def test_a_bad_length_crc_ends_the_file_there(tmp_path):
    path = tmp_path / "events.out.tfevents.1.h"
    good = [event_pb2.Event(step=i, wall_time=1.0).SerializeToString() for i in range(3)]
    framed = [records.frame(d) for d in good]
    torn = bytearray(framed[1])
    torn[9] ^= 0x10  # a bit of the second record's length CRC (the length itself is intact)
    path.write_bytes(framed[0] + bytes(torn) + framed[2])
    assert [e.step for e in iter_events(str(path))] == [0]


def test_writer_pulls_in_no_framework(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from tb_gpuprof.store.writer import EventWriter
        import tb_gpuprof.store.reader, tb_gpuprof.store.importer
        with EventWriter({str(tmp_path)!r}) as w:
            w.add_scalar("a", 1.0, 0)
            w.add_report({{"schema_version": 1, "kernels": []}}, 0)
        print(",".join(m for m in ("tensorflow", "torch", "jax", "keras") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_concurrent_threads_write_whole_records(tmp_path):
    n_threads, n_each = 8, 200
    writer = EventWriter(tmp_path)
    report = {"schema_version": 1, "kernels": [{"name": "k", "total_us": 1.0}]}

    def work(i: int) -> None:
        for s in range(n_each):
            writer.add_scalar(f"t{i}", float(s), s)
            if s % 50 == 0:
                writer.add_report(report, step=i * 1000 + s)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    seen = [(v.tag, e.step) for e in tb_events(writer.path) for v in e.summary.value]
    scalars = [x for x in seen if x[0].startswith("t")]
    assert sorted(scalars) == sorted((f"t{i}", s) for i in range(n_threads) for s in range(n_each))
    assert len([x for x in seen if layout.parse_report_tag(x[0])]) == n_threads * (n_each // 50)


WRITER_SCRIPT = """
import sys
from tb_gpuprof.store.writer import EventWriter
w = EventWriter(sys.argv[1], rank=int(sys.argv[3]) if sys.argv[3:] else None)
for s in range(300):
    w.add_scalar("gpuprof/iteration_time_ms", float(s), s)
w.add_report({"schema_version": 1, "kernels": [{"name": sys.argv[2], "total_us": 1.0}]}, 299)
w.close()
"""


def _spawn(run_dir: Path, marker: str, rank: str | None) -> subprocess.Popen:
    # a launcher's rank in the environment is not the writer's business: only the parameter
    env = {**os.environ, "RANK": "7", "SLURM_PROCID": "7"}
    args = [rank] if rank is not None else []
    return subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(run_dir), marker, *args],
                            env=env)


@pytest.mark.parametrize("ranks", [(None, None), ("0", "1")], ids=["two-processes", "two-ranks"])
def test_processes_sharing_a_run_dir_do_not_clobber(tmp_path, ranks):
    procs = [_spawn(tmp_path, f"proc{i}", rank) for i, rank in enumerate(ranks)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    files = event_files(str(tmp_path))
    assert len(files) == 2
    markers = set()
    report_tags = set()
    for path in files:
        events = tb_events(path)
        steps = [e.step for e in events for v in e.summary.value
                 if v.tag == "gpuprof/iteration_time_ms"]
        assert steps == list(range(300))
        for e in events:
            for v in e.summary.value:
                if layout.parse_report_tag(v.tag):
                    report_tags.add(v.tag)
                    rep = schema.decode_report(v.tensor.string_val[0],
                                               v.metadata.plugin_data.content, path)
                    markers.add(rep["kernels"][0]["name"])
    assert markers == {"proc0", "proc1"}
    if ranks[0] is not None:
        assert sorted(os.path.basename(f).split(".gpuprof")[1] for f in files) == [".rank0",
                                                                                   ".rank1"]
        # Both ranks' windows stay addressable: rank 0 keeps the plain tag.
        assert report_tags == {layout.report_tag(299), layout.report_tag(299, rank=1)}


def test_flushes_at_interpreter_exit_without_close(tmp_path):
    code = textwrap.dedent(f"""
        from tb_gpuprof.store.writer import EventWriter
        w = EventWriter({str(tmp_path)!r})
        w.add_report({{"schema_version": 1, "kernels": []}}, 5)
        for s in range(1000):  # buffered: written after the report's flush
            w.add_scalar("x", float(s), s)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    steps = [e.step for e in tb_events(only_file(tmp_path)) for v in e.summary.value
             if v.tag == "x"]
    assert steps == list(range(1000))


def test_rejects_bad_arguments(tmp_path):
    with EventWriter(tmp_path) as w:
        with pytest.raises(ValueError):
            w.add_scalar("", 1.0, 0)
        with pytest.raises(ValueError):
            w.add_scalar("t", 1.0, -1)
        with pytest.raises(ValueError):
            w.add_report({"kernels": []}, 0)  # no schema_version
        with pytest.raises(ValueError):
            w.add_json(layout.report_tag(3), {}, 3)
    with pytest.raises(ValueError):
        w.add_scalar("t", 1.0, 0)  # closed


def test_report_over_the_size_bound_keeps_its_largest_kernels(tmp_path, monkeypatch,
                                                              real_reports):
    report = copy.deepcopy(real_reports["kineto"])
    base = report["kernels"]
    # Thousands of distinct kernels, largest first as the builder orders them.
    kernels = []
    for i in range(6000):
        k = dict(base[i % len(base)])
        k["name"] = f"{k['name']}_{os.urandom(12).hex()}"
        k["total_us"] = 1e6 - i
        kernels.append(k)
    report["kernels"] = kernels
    report["kernels_total"] = len(kernels)
    bound = 256 * 1024
    monkeypatch.setattr(schema, "MAX_COMPRESSED_BYTES", bound)

    with EventWriter(tmp_path) as w:
        w.add_report(report, step=1)
    (value,) = [v for e in iter_events(only_file(tmp_path)) for v in e.summary.value]
    blob = value.tensor.string_val[0]
    assert len(blob) <= bound
    stored = schema.decode_report(blob, value.metadata.plugin_data.content, "t")
    n = len(stored["kernels"])
    assert 0 < n < len(kernels)
    assert stored["kernels"] == kernels[:n]
    assert stored["kernels_total"] == len(kernels)
    assert any("cut" in w for w in stored["warnings"])
    # The largest prefix that fits: one more kernel would not.
    blob_plus, _ = schema._compress({**stored, "kernels": kernels[: n + 1]})
    assert len(blob_plus) > bound


def test_save_raw_trace_copies_beside_the_run(tmp_path, xplane_trace):
    dest = save_raw_trace(tmp_path / "run", xplane_trace, step=12, rank=0)
    assert Path(dest).read_bytes() == xplane_trace.read_bytes()
    assert Path(dest).parent == tmp_path / "run" / "plugins" / "gpuprof" / "traces" / "step_12"
    ranked = save_raw_trace(tmp_path / "run", xplane_trace, step=12, rank=3)
    assert Path(ranked).parent.name == "step_12.rank3"
