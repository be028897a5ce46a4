"""The analysis child's job (tb_gpuprof.capture.window_child.run_job) on a real H200 trace: the raw
profile is stored in the run, gzipped, and the analysis reads the uncompressed file it still
has rather than decompressing the stored copy again."""

from __future__ import annotations

import gzip
import os
import shutil

import msgspec
import pytest

import tb_gpuprof.readers as readers
from tb_gpuprof.capture.window_child import StoreSpec, WindowJob, WindowResult, encode, run_job

HERE = os.path.dirname(__file__)
TRACE_GZ = os.path.join(HERE, "data", "kineto_transformer_bf16_h200.json.gz")


def job_for(raw: str, run_dir: str, gzip_raw: bool) -> WindowJob:
    return WindowJob(trace=raw, env={}, gpu_expected=True, no_gpu_warning="no GPU",
                     store=StoreSpec(run_dir=run_dir, step=3, gzip=gzip_raw,
                                     name="window_1_4.pt.trace.json"
                                     + (".gz" if gzip_raw else "")))


def raw_trace_and_reads(tmp_path, monkeypatch, name: str):
    """A raw H200 trace at ``tmp/<name>``, and the list of paths the analysis will read."""
    raw = tmp_path / "tmp" / name
    raw.parent.mkdir()
    with gzip.open(TRACE_GZ, "rb") as src, open(raw, "wb") as dst:
        shutil.copyfileobj(src, dst)
    read: list[str] = []
    real = readers.load_profile
    monkeypatch.setattr(readers, "load_profile",
                        lambda path, **kw: read.append(path) or real(path, **kw))
    return raw, read


def test_a_gzipped_store_keeps_the_raw_file_for_the_analysis_to_read(tmp_path, monkeypatch):
    raw, read = raw_trace_and_reads(tmp_path, monkeypatch, "window_1_4.pt.trace.json")
    out = run_job(job_for(str(raw), str(tmp_path / "run"), gzip_raw=True))
    assert out.error is None, out.error
    assert read == [str(raw)]  # not the stored .gz
    assert out.trace_path is not None and out.trace_path.endswith(".json.gz")
    with gzip.open(out.trace_path, "rb") as stored:
        assert stored.read() == raw.read_bytes()
    assert out.report is not None
    assert out.report["kernels_total"] > 0 and out.report["gpu_time_us"] > 0
    # the child writes the report's source itself: the stored copy, inside the run
    assert out.report["source"]["path"] == os.path.relpath(out.trace_path, tmp_path / "run")


def test_a_store_that_moves_the_raw_file_is_read_from_the_run(tmp_path, monkeypatch):
    raw, read = raw_trace_and_reads(tmp_path, monkeypatch, "profile.json")
    out = run_job(job_for(str(raw), str(tmp_path / "run"), gzip_raw=False))
    assert out.error is None, out.error
    assert not raw.exists() and read == [out.trace_path]


def test_the_child_runs_one_thread_and_leaves_this_process_environment_alone(
        tmp_path, monkeypatch):
    """numpy's OpenBLAS starts a thread per CPU at import unless told not to: the child is
    told (CHILD_THREAD_LIMITS, in its environment only). Without the limits the same count
    shows the extra threads, so the check can fail."""
    import sys

    from tb_gpuprof.capture import hookcore as _hookcore

    if not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2:
        pytest.skip("counts threads in /proc on a machine of several CPUs")
    for name in _hookcore.CHILD_THREAD_LIMITS:
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    raw, _ = raw_trace_and_reads(tmp_path, monkeypatch, "window_1_4.pt.trace.json")
    job = msgspec.structs.replace(job_for(str(raw), str(tmp_path / "run"), gzip_raw=True),
                                  store=None)
    limited = _hookcore.run_window_child(job)
    assert limited.error is None, limited.error
    assert limited.timing["threads"] == 1
    assert (limited.timing["cpu_s"] or 0) > 0 and (limited.timing["read_s"] or 0) > 0
    assert dict(os.environ) == before
    monkeypatch.setattr(_hookcore, "CHILD_THREAD_LIMITS", {})
    unlimited = _hookcore.run_window_child(job)
    assert (unlimited.timing["threads"] or 0) > 1


def test_the_result_reaches_the_parent_in_few_reads_even_unbuffered(tmp_path, monkeypatch):
    """Each read is a wake-up of the hook's analysis thread, which takes the GIL from
    training: the child writes its result at once, also under PYTHONUNBUFFERED=1 (a
    token-by-token ``json.dump`` made about 1,500 reads of this report)."""
    from tb_gpuprof.capture import hookcore as _hookcore

    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    raw, _ = raw_trace_and_reads(tmp_path, monkeypatch, "window_1_4.pt.trace.json")
    job = msgspec.structs.replace(job_for(str(raw), str(tmp_path / "run"), gzip_raw=True),
                                  store=None)
    reads: list[int] = []
    real_read = os.read

    def counted_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        reads.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counted_read)
    result = _hookcore.run_window_child(job)
    monkeypatch.setattr(os, "read", real_read)
    assert result.error is None, result.error
    received = sum(reads)
    assert received > 50_000  # the report came through these reads
    assert len(reads) <= 3 + received // 4096  # at worst one per pipe page, not per token


def test_job_and_result_cross_the_pipe_typed():
    """What one side writes the other decodes to the same Struct; a field the other side
    does not know, or a wrong type, is refused at once, not half-used later."""
    job = WindowJob(trace="/tmp/x.json", key="train", env={"flags": {"compiled": True}},
                    store=StoreSpec(run_dir="/tmp/run", step=7, rank=2, gzip=True,
                                    name="x.json.gz"))
    assert msgspec.json.decode(encode(job), type=WindowJob) == job
    result = WindowResult(report={"a": 1}, trace_path="p", warnings=["w"], timing={"s": 1.5})
    assert msgspec.json.decode(encode(result), type=WindowResult) == result
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"trace": "t", "store": {"run_dir": "r"}}', type=WindowJob)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"trace": "t", "stor": null}', type=WindowJob)


def test_a_bad_job_is_one_error_line_from_the_child(tmp_path):
    """The child answers a job it cannot read with a typed error result and status 2."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "tb_gpuprof.capture.window_child"],
                          input=b'{"trace": 3}', capture_output=True, timeout=120)
    assert proc.returncode == 2
    result = msgspec.json.decode(proc.stdout, type=WindowResult)
    assert result.error is not None and result.error.startswith("bad job:")
