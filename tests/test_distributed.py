"""Distributed training on CPU: a real 2-process torch.distributed (gloo) DDP run with the hook,
launched like torchrun (RANK/WORLD_SIZE/MASTER_* in the environment), rank 1 slowed by a real
sleep per iteration; then the stored files and reports, the cross-rank analysis and the
/distributed route over TensorBoard's own WSGI app.

Run as ``python -m tests.test_distributed LOGDIR`` it is one rank of that training job.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import REPO

RUN = "ddp"
SINGLE_RUN = "single"
WORLD_SIZE = 2
ITERATIONS = 8
WINDOW = (3, 6)  # iter_start, iter_stop: the report is stored at step 5
STRAGGLER_RANK = 1
STRAGGLER_SLEEP_S = 0.15  # host time rank 1 spends per iteration outside any operator (well
# above the ~30 ms of timing noise seen on 2 busy cores)
WORKER_TIMEOUT_S = 240

_cache: dict[str, Path] = {}


def train_one_rank(logdir: str) -> None:
    """One rank of the job: DDP over gloo, the hook with a window, rank 1 sleeping."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tb_gpuprof.torch import GpuProfiler

    torch.set_num_threads(1)  # two ranks on a 2-core CI machine
    dist.init_process_group("gloo")  # env:// as torchrun sets it up
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with GpuProfiler(os.path.join(logdir, RUN), iter_start=WINDOW[0], iter_stop=WINDOW[1],
                     model=model) as prof:
        for _ in range(ITERATIONS):
            x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == STRAGGLER_RANK:
                time.sleep(STRAGGLER_SLEEP_S)
            prof.step()
    assert prof.report is not None, "the window produced no report"
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ddp(logdir: Path) -> None:
    """Start WORLD_SIZE ranks the way torchrun does and wait for all of them."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": str(WORLD_SIZE), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.test_distributed", str(logdir)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD_SIZE)]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=WORKER_TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a rank did not finish in {WORKER_TIMEOUT_S}s")
    for r, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{out[-4000:]}"
        assert "GpuProfWarning" not in out, f"rank {r} switched a feature off:\n{out[-4000:]}"


def train_single_process(run_dir: Path) -> None:
    import torch

    from tb_gpuprof.torch import GpuProfiler

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with GpuProfiler(run_dir, iter_start=1, iter_stop=3) as prof:
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            prof.step()


def ddp_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log directory with the 2-rank DDP run and a single-process run, made once per session
    (the browser test of the Distributed view uses it too)."""
    if "logdir" not in _cache:
        logdir = tmp_path_factory.mktemp("ddp-logdir")
        launch_ddp(logdir)
        train_single_process(logdir / SINGLE_RUN)
        _cache["logdir"] = logdir
    return _cache["logdir"]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ddp_logdir(tmp_path_factory)


def _rank_dirs(logdir: Path) -> dict[int, Path]:
    return {0: logdir / RUN, 1: logdir / RUN / "rank1"}


@pytest.fixture(scope="module")
def reports(logdir: Path) -> dict[int, dict[str, Any]]:
    """Each rank's stored report, read back from its own run directory."""
    from tb_gpuprof.store import schema
    from tb_gpuprof.store.reader import stored_reports

    out = {}
    for rank, run_dir in _rank_dirs(logdir).items():
        (stored,) = stored_reports(str(run_dir))
        assert (stored.step, stored.rank) == (WINDOW[1] - 1, rank)
        out[rank] = schema.decode_report(stored.blob, stored.content, str(run_dir))
    return out


def test_each_rank_writes_its_own_event_file_trace_and_report(logdir: Path) -> None:
    from tb_gpuprof.store.reader import event_files, find_runs

    assert set(find_runs(str(logdir))) == {RUN, f"{RUN}/rank1", SINGLE_RUN}
    for rank, run_dir in _rank_dirs(logdir).items():
        files = event_files(str(run_dir))
        assert [os.path.basename(f).rsplit(".", 1)[-1] for f in files] == [f"rank{rank}"]
        traces = os.listdir(run_dir / "plugins" / "gpuprof" / "traces")
        assert traces == [f"step_{WINDOW[1] - 1}" + (f".rank{rank}" if rank else "")]


def test_report_of_the_run_directory_is_rank_0s(logdir: Path) -> None:
    from tb_gpuprof.store.reader import load_run_report

    # The rank sub-runs hold reports too; naming the run directory means rank 0's.
    assert load_run_report(str(logdir / RUN))["system"]["distributed"]["rank"] == 0
    assert load_run_report(str(logdir / RUN / "rank1"))["system"]["distributed"]["rank"] == 1


def test_text_report_has_the_distributed_line(logdir: Path) -> None:
    from tb_gpuprof.analysis.format import render
    from tb_gpuprof.store.reader import load_run_report

    text = render(load_run_report(str(logdir / RUN / "rank1")))
    assert f"distributed:       rank 1 of {WORLD_SIZE} (gloo)" in text


def test_reports_record_rank_world_size_backend_and_the_same_window(reports) -> None:
    for rank, report in reports.items():
        assert report["system"]["distributed"] == {"rank": rank, "world_size": WORLD_SIZE,
                                                   "backend": "gloo"}
        it = report["iterations"]
        assert it["method"] == "profiler_step"
        assert it["range"] == [WINDOW[0], WINDOW[1] - 1]
        assert it["count"] == WINDOW[1] - WINDOW[0]
        section = report["distributed"]
        assert (section["rank"], section["world_size"]) == (rank, WORLD_SIZE)
        # gloo runs collectives on the host: communication comes from its ranges
        assert section["communication_source"] == "cpu_ranges"
        assert section["compute_source"] == "cpu_ops"
        assert "gloo:all_reduce" in [c["name"] for c in section["collectives"]]
        assert len(section["per_iteration"]) == it["count"]
        for row in section["per_iteration"]:
            assert 0 < row["communication_ms"] <= row["wall_ms"]
            assert 0 <= row["overlap_ms"] <= row["communication_ms"]
            assert row["exposed_ms"] == pytest.approx(row["communication_ms"] - row["overlap_ms"],
                                                      abs=1e-3)


def test_cross_rank_analysis_finds_the_injected_straggler(reports) -> None:
    from tb_gpuprof.analysis.distributed import cross_rank_summary

    summary = cross_rank_summary([reports[1], reports[0]])  # order does not matter
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert summary["world_size"] == WORLD_SIZE and summary["missing_ranks"] == []
    s = summary["straggler"]
    assert s["rank"] == STRAGGLER_RANK and s["significant"]
    # the sleep is real time on rank 1 that rank 0 spends waiting inside the all-reduce
    assert s["slower_by_ms"] >= 0.6 * STRAGGLER_SLEEP_S * 1e3
    rows = {r["rank"]: r for r in summary["ranks"]}
    assert rows[0]["exposed_ms"] - rows[1]["exposed_ms"] >= 0.6 * STRAGGLER_SLEEP_S * 1e3
    # synchronous training: both ranks' iterations take about as long as the slow one's
    assert rows[0]["iteration_ms"] >= STRAGGLER_SLEEP_S * 1e3
    assert summary["load_imbalance"] >= 1.0
    recs = {r["id"]: r for r in summary["recommendations"]}
    assert recs["straggler"]["evidence"]["rank"] == STRAGGLER_RANK
    assert f"Rank {STRAGGLER_RANK}" in recs["straggler"]["title"]


def test_distributed_backend_rule_is_silent_on_a_cpu_gloo_run(reports) -> None:
    from tb_gpuprof.analysis.distributed import cross_rank_summary
    from tb_gpuprof.analysis.rules.distributed import rule_distributed_backend

    for report in reports.values():
        assert report["gpu_time_us"] == 0
        assert rule_distributed_backend(report) is None
        assert "distributed_backend" not in [r["id"] for r in report["recommendations"]]
    ids = [r["id"] for r in cross_rank_summary(list(reports.values()))["recommendations"]]
    assert "distributed_backend" not in ids


class _RecordingSampler:
    """Stands in for NvmlSampler (no GPU here): records which CUDA devices it was asked for."""

    created: ClassVar[list[list[int] | None]] = []
    interval_s = 0.5

    def __init__(self, devices: list[int] | None = None, **kwargs: Any) -> None:
        type(self).created.append(devices)

    def start(self) -> bool:
        return True

    def stop(self) -> None:
        pass

    def drain(self) -> list[Any]:
        return []


@pytest.mark.parametrize(("world_size", "expected"), [(2, [1]), (1, None)])
def test_each_rank_samples_only_its_own_gpu(tmp_path, monkeypatch, world_size, expected) -> None:
    import torch

    from tb_gpuprof.nvml import sampler
    from tb_gpuprof.torch import GpuProfiler

    # a process that sees CUDA device 1 as its current device, rank 1 of the job
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(sampler, "NvmlSampler", _RecordingSampler)
    monkeypatch.setenv("RANK", "1" if world_size > 1 else "0")
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    _RecordingSampler.created = []
    prof = GpuProfiler(tmp_path / "run", nvml=True, memory=False, nvtx=False,
                       cuda_profiler_api=False)
    with pytest.warns(Warning):  # CUDA events cannot be recorded without a GPU: switched off
        prof.start()
    prof.close()
    assert _RecordingSampler.created == [expected]
    run = tmp_path / "run"
    assert prof.run_dir == str(run / "rank1" if world_size > 1 else run)


# -- the /distributed route over TensorBoard's WSGI app (Python loader) -----------------------

PREFIX = "/data/plugin/gpuprof"


@pytest.fixture(scope="module")
def client(logdir: Path):
    from tests.conftest import wsgi_client

    return wsgi_client(logdir)


def get_json(client: Any, route: str, **params: Any) -> tuple[int, Any]:
    response = client.get(f"{PREFIX}{route}?{urllib.parse.urlencode(params)}")
    assert response.mimetype == "application/json"
    return response.status_code, json.loads(response.get_data())


def test_route_returns_both_ranks_and_the_straggler(client, reports) -> None:
    status, body = get_json(client, "/distributed", run=RUN)
    assert status == 200, body
    assert (body["run"], body["step"], body["world_size"]) == (RUN, WINDOW[1] - 1, WORLD_SIZE)
    assert [(r["rank"], r["run"]) for r in body["ranks"]] == [(0, RUN), (1, f"{RUN}/rank1")]
    for row in body["ranks"]:
        report = reports[row["rank"]]
        assert row["iteration_ms"] == report["iterations"]["mean_ms"]
        assert row["communication_ms"] == report["distributed"]["mean_ms"]["communication_ms"]
        assert row["backend"] == "gloo"
    assert body["straggler"]["rank"] == STRAGGLER_RANK and body["straggler"]["significant"]
    assert "straggler" in [r["id"] for r in body["recommendations"]]
    # a rank's sub-run names the same job; an explicit step is honoured
    assert get_json(client, "/distributed", run=f"{RUN}/rank1") == (200, body)
    assert get_json(client, "/distributed", run=RUN, step=WINDOW[1] - 1) == (200, body)


def test_route_single_process_and_errors(client) -> None:
    status, body = get_json(client, "/distributed", run=SINGLE_RUN)
    assert status == 200, body
    assert body["world_size"] == 1 and [r["rank"] for r in body["ranks"]] == [0]
    assert body["straggler"] is None and body["recommendations"] == []
    status, body = get_json(client, "/distributed", run="no-such-run")
    assert status == 404 and "no-such-run" in body["error"]
    status, body = get_json(client, "/distributed", run=RUN, step=999)
    assert status == 404 and "step 999" in body["error"]
    status, body = get_json(client, "/distributed", run=RUN, step="x")
    assert status == 400
    status, body = get_json(client, "/distributed")
    assert status == 400 and "run" in body["error"]


if __name__ == "__main__":
    train_one_rank(sys.argv[1])
