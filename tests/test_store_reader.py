"""Reading stored reports back: run selection, truncated files, future schemas."""

from __future__ import annotations

import copy
import json
import os

import pytest

from tb_gpuprof.errors import RunNotFoundError, SchemaVersionError, StoredDataError
from tb_gpuprof.store import layout
from tb_gpuprof.store.reader import event_files, load_run_report
from tb_gpuprof.store.writer import EventWriter
from tests.conftest import run_cli


def as_json(obj):
    return json.loads(json.dumps(obj))


def tagged(report, marker):
    """A real report made distinguishable (its generator field names the window)."""
    out = copy.deepcopy(report)
    out["generator"] = f"{report.get('generator')} / {marker}"
    return out


def test_latest_step_by_default_and_any_step_on_request(tmp_path, real_reports):
    k, x = real_reports["kineto"], real_reports["xplane"]
    with EventWriter(tmp_path) as w:
        w.add_report(k, step=10)
        w.add_report(x, step=30)
        w.add_report(tagged(k, "w20"), step=20)  # written out of step order
    assert load_run_report(str(tmp_path)) == as_json(x)
    assert load_run_report(str(tmp_path), step=10) == as_json(k)
    assert load_run_report(str(tmp_path), step=20)["generator"].endswith("w20")
    with pytest.raises(RunNotFoundError, match="no report at step 11"):
        load_run_report(str(tmp_path), step=11)


def test_logdir_run_selection(tmp_path, real_reports):
    with EventWriter(tmp_path / "a") as w:
        w.add_report(real_reports["kineto"], step=1)
    with EventWriter(tmp_path / "group" / "b") as w:
        w.add_report(real_reports["xplane"], step=2)
    with EventWriter(tmp_path / "scalars_only") as w:
        w.add_scalar(layout.ITERATION_TIME_TAG, 3.0, 0)

    with pytest.raises(RunNotFoundError, match=r"2 runs hold reports \(a, group/b\).*--run"):
        load_run_report(str(tmp_path))
    assert load_run_report(str(tmp_path), run="group/b") == as_json(real_reports["xplane"])
    assert load_run_report(str(tmp_path / "a")) == as_json(real_reports["kineto"])
    with pytest.raises(RunNotFoundError, match="no tb_gpuprof report stored"):
        load_run_report(str(tmp_path), run="scalars_only")
    with pytest.raises(RunNotFoundError, match="no run named 'nope'"):
        load_run_report(str(tmp_path), run="nope")
    with pytest.raises(RunNotFoundError, match="no such directory"):
        load_run_report(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunNotFoundError, match="no TensorBoard event files"):
        load_run_report(str(tmp_path / "empty"))


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_tail_keeps_the_complete_reports(tmp_path, real_reports, damage):
    with EventWriter(tmp_path) as w:
        w.add_report(real_reports["xplane"], step=1)
        size_after_first = os.path.getsize(w.path)
        w.add_report(real_reports["kineto"], step=2)
    (path,) = event_files(str(tmp_path))
    if damage == "truncate":  # a writer killed mid-record
        with open(path, "r+b") as f:
            f.truncate(size_after_first + 100)
    else:
        with open(path, "ab") as f:
            f.write(os.urandom(64))
    expected = real_reports["xplane"] if damage == "truncate" else real_reports["kineto"]
    assert load_run_report(str(tmp_path)) == as_json(expected)


def test_future_schema_is_refused_with_one_line(tmp_path, real_reports):
    future = copy.deepcopy(real_reports["kineto"])
    future["schema_version"] = 99
    with EventWriter(tmp_path / "future") as w:
        w.add_report(future, step=5)
    with pytest.raises(SchemaVersionError, match="schema_version 99 is newer"):
        load_run_report(str(tmp_path / "future"))
    proc = run_cli("report", str(tmp_path / "future"), check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "schema_version 99" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupt_blob_is_a_clear_error(tmp_path, real_reports):
    with EventWriter(tmp_path) as w:
        w.add_report(real_reports["kineto"], step=5)
    (path,) = event_files(str(tmp_path))
    data = bytearray(open(path, "rb").read())
    # Flip bytes inside the compressed report (the record framing stays valid for our
    # reader, which leaves payload integrity to zlib's checksum).
    mid = len(data) - 2000
    data[mid:mid + 16] = bytes(16)
    open(path, "wb").write(bytes(data))
    with pytest.raises(StoredDataError, match="step 5"):
        load_run_report(str(tmp_path))
