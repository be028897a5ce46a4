"""`tb-gpuprof report DIR` on a directory of rank traces: serial, process pool and Dask agree.

The rank traces are the real H200 Kineto fixture, one copy per rank with its own
``distributedInfo``; rank 2's copy runs every event 30% slower (timestamps and durations
stretched), so the cross-rank analysis has a real straggler to find.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tb_gpuprof import cli, parallel
from tb_gpuprof.analysis.distributed import cross_rank_summary
from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.readers import load_profile

from .conftest import run_cli

WORLD = 3
SLOW_RANK, STRETCH = 2, 1.3


def _stretch(doc: dict, factor: float) -> None:
    t0 = min(e["ts"] for e in doc["traceEvents"] if "ts" in e)
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = t0 + (e["ts"] - t0) * factor
        if "dur" in e:
            e["dur"] = e["dur"] * factor


@pytest.fixture(scope="module")
def rank_dir(kineto_trace: Path, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ranks")
    text = gzip.decompress(kineto_trace.read_bytes())
    for rank in range(WORLD):
        doc = json.loads(text)
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": WORLD}
        if rank == SLOW_RANK:
            _stretch(doc, STRETCH)
        with gzip.open(d / f"rank{rank}.pt.trace.json.gz", "wt", compresslevel=1) as f:
            json.dump(doc, f)
    (d / "rank0.env.json").write_text("{}")  # a side file the directory scan must skip
    return d


@pytest.fixture(scope="module")
def serial(rank_dir: Path) -> dict:
    return parallel.analyze_ranks(parallel.find_rank_traces(str(rank_dir)), workers=1)


def _canonical(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True)


def test_directory_scan_finds_the_rank_traces_only(rank_dir):
    names = [os.path.basename(p) for p in parallel.find_rank_traces(str(rank_dir))]
    assert names == [f"rank{r}.pt.trace.json.gz" for r in range(WORLD)]


def test_serial_summary_is_the_cross_rank_summary_of_each_report(rank_dir, serial):
    paths = parallel.find_rank_traces(str(rank_dir))
    by_hand = cross_rank_summary([build_report(load_profile(p)) for p in paths])
    assert _canonical(serial["summary"]) == _canonical(by_hand)
    rows = {r["rank"]: r for r in serial["summary"]["ranks"]}
    assert sorted(rows) == list(range(WORLD))
    assert rows[SLOW_RANK]["iteration_ms"] == pytest.approx(rows[0]["iteration_ms"] * STRETCH,
                                                            rel=0.02)
    assert serial["summary"]["straggler"]["rank"] == SLOW_RANK


def test_process_pool_gives_the_same_summary(rank_dir, serial):
    seen = []
    paths = parallel.find_rank_traces(str(rank_dir))
    pooled = parallel.run_local(paths, workers=2, on_done=lambda r: seen.append(os.getpid()))
    assert [r.path for r in pooled] == paths
    assert _canonical(cross_rank_summary([r.report for r in pooled])) == \
        _canonical(serial["summary"])
    # each worker measured its own peak memory, and it was not zero
    assert all(r.peak_bytes and r.peak_bytes > 0 for r in pooled)
    assert len(seen) == WORLD


def test_admission_is_bounded_by_cores_and_measured_memory(rank_dir):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    path = parallel.find_rank_traces(str(rank_dir))[0]
    # measured as a worker measures it: in a fresh process. In this one, earlier tests' freed
    # heap can hold the whole analysis, and its peak above the baseline reads 0.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        measured = pool.submit(parallel.analyze_trace, path).result(timeout=120)
    assert measured.peak_bytes and measured.peak_bytes > 0
    size = os.path.getsize(path)
    per_trace = measured.peak_bytes  # what one more trace of this size is expected to need
    adm = parallel.Admission(cores=4, budget=int(per_trace * 2.5))
    assert adm.admits({}, path)  # one always runs
    assert not adm.admits({"first": 1.0}, path)  # nothing measured: the first runs alone
    adm.learn(measured)
    assert adm.estimate(path) == pytest.approx(per_trace, rel=1e-6)
    one = {"a": adm.estimate(path)}
    two = {"a": adm.estimate(path), "b": adm.estimate(path)}
    assert adm.admits(one, path) and not adm.admits(two, path)  # memory binds at two
    roomy = parallel.Admission(cores=2, budget=None)
    roomy.learn(measured)
    assert roomy.admits(one, path) and not roomy.admits(two, path)  # cores bind at two
    assert size > 0


def test_dask_local_cluster_gives_the_same_summary(rank_dir, serial):
    distributed = pytest.importorskip("distributed")  # in the [test] extra: runs in CI
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        result = parallel.analyze_ranks(parallel.find_rank_traces(str(rank_dir)),
                                        dask_address=cluster.scheduler_address)
    assert _canonical(result["summary"]) == _canonical(serial["summary"])
    assert [t["path"] for t in result["traces"]] == [t["path"] for t in serial["traces"]]


def test_cli_report_on_a_rank_directory(rank_dir, serial):
    proc = run_cli("report", str(rank_dir), "--format", "json")
    out = json.loads(proc.stdout)
    assert _canonical(out["summary"]) == _canonical(serial["summary"])
    text = run_cli("report", str(rank_dir)).stdout
    assert f"{WORLD} rank traces" in text and f"rank{SLOW_RANK}.pt.trace.json.gz" in text


def test_cli_bad_rank_trace_is_one_line_exit_2(rank_dir, tmp_path):
    for p in rank_dir.glob("rank*.pt.trace.json.gz"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    (tmp_path / "rank9.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", ')
    proc = run_cli("report", str(tmp_path), "--jobs", "2", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "rank9.pt.trace.json" in line and "truncated" in line


def test_cli_unreachable_dask_scheduler_is_one_line(rank_dir, monkeypatch, capsys):
    pytest.importorskip("distributed")
    monkeypatch.setattr(parallel, "DASK_CONNECT_TIMEOUT_S", 1.0)
    code = cli.main(["report", str(rank_dir), "--dask", "tcp://127.0.0.1:9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Dask scheduler" in err[0]
