"""The distributed analysis as pure functions: interval arithmetic, GPU communication/compute
overlap on profiles built from the model's own dataclasses (NCCL kernel names as Kineto
records them), the recommendation rules and the cross-rank summary."""

from __future__ import annotations

import copy
import itertools
import random

import pytest

from tb_gpuprof.analysis import distributed as d
from tb_gpuprof.analysis import intervals
from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.analysis.rules import distributed as rules
from tb_gpuprof.model import KERNEL, STEP, Annotation, GpuActivity, Profile

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
        "execute_segment_k_off_kernel__5x_cublas")
ITER_US = 10_000.0


def _cells(iv: list[tuple[float, float]]) -> set[int]:
    return {c for s, e in iv for c in range(int(s), int(e))}


def test_interval_operations_match_a_brute_force_count() -> None:
    rng = random.Random(7)
    for _ in range(300):
        def rand_iv() -> list[tuple[float, float]]:
            out = []
            for _ in range(rng.randint(0, 6)):
                s = rng.randint(0, 40)
                out.append((float(s), float(s + rng.randint(0, 12))))
            return out
        a_raw, b_raw = rand_iv(), rand_iv()
        a, b = intervals.merge(a_raw), intervals.merge(b_raw)
        ca, cb = _cells(a_raw), _cells(b_raw)
        assert _cells(a) == ca and all(x[1] < y[0] for x, y in itertools.pairwise(a))
        assert _cells(intervals.intersect(a, b)) == ca & cb
        assert _cells(intervals.subtract(a, b)) == ca - cb
        lo, hi = rng.randint(0, 30), rng.randint(30, 60)
        assert intervals.length(a, lo, hi) == len({c for c in ca if lo <= c < hi})


def synthetic_profile(comm: tuple[float, float], compute: tuple[float, float], *,
                      iterations: int = 3, backend: str = "nccl", world_size: int = 2,
                      comm_device: int = 0) -> Profile:
    """``iterations`` steps of ITER_US each: one GEMM on stream 7 and one NCCL all-reduce on
    stream 20 per step, at the given offsets (µs) inside the step."""
    gpu, annotations = [], []
    for i in range(iterations):
        t0 = i * ITER_US
        annotations.append(Annotation(f"ProfilerStep#{i}", t0, ITER_US, kind=STEP, step=i))
        gpu.append(GpuActivity(KERNEL, GEMM, t0 + compute[0], compute[1] - compute[0], stream=7))
        gpu.append(GpuActivity(KERNEL, NCCL, t0 + comm[0], comm[1] - comm[0], stream=20,
                               device=comm_device))
    return Profile("synthetic.json", "kineto", gpu=gpu, annotations=annotations, metadata={
        "distributed": {"rank": 0, "world_size": world_size, "backend": backend}})


def test_gpu_overlap_and_exposed_communication_per_iteration() -> None:
    comm, compute = (4000.0, 9000.0), (0.0, 6000.0)
    report = build_report(synthetic_profile(comm, compute))
    section = report["distributed"]
    overlap = compute[1] - comm[0]
    comm_len = comm[1] - comm[0]
    assert section["communication_source"] == "gpu_kernels"
    assert section["compute_source"] == "gpu_kernels"
    assert len(section["per_iteration"]) == 3
    for row in section["per_iteration"]:
        assert row["communication_ms"] == pytest.approx(comm_len / 1e3)
        assert row["overlap_ms"] == pytest.approx(overlap / 1e3)
        assert row["exposed_ms"] == pytest.approx((comm_len - overlap) / 1e3)
        assert row["compute_ms"] == pytest.approx((compute[1] - compute[0]) / 1e3)
    assert section["overlap_pct"] == pytest.approx(100 * overlap / comm_len, abs=0.1)
    assert section["exposed_pct"] == pytest.approx(100 * (comm_len - overlap) / ITER_US, abs=0.1)
    assert section["collectives"] == [{"name": NCCL, "count": 3,
                                       "total_us": pytest.approx(3 * comm_len)}]
    # the report's own breakdown counts the same kernels as communication
    assert report["breakdown"]["communication_us"] == pytest.approx(section["communication_us"])
    ids = {r["id"]: r for r in report["recommendations"]}
    assert ids["communication"]["severity"] == "high"  # 30% of the iteration exposed
    assert "distributed_backend" not in ids  # NCCL


def test_overlap_only_counts_compute_on_the_same_gpu() -> None:
    report = build_report(synthetic_profile((4000.0, 9000.0), (0.0, 6000.0), comm_device=1))
    assert report["distributed"]["overlap_us"] == 0
    assert report["distributed"]["exposed_us"] == report["distributed"]["communication_us"]


def test_fully_hidden_or_small_communication_is_not_recommended() -> None:
    hidden = build_report(synthetic_profile((1000.0, 5000.0), (0.0, 9000.0)))
    assert hidden["distributed"]["overlap_pct"] == 100.0
    assert hidden["distributed"]["exposed_us"] == 0
    small = build_report(synthetic_profile((9000.0, 9500.0), (0.0, 8000.0)))
    assert small["distributed"]["exposed_pct"] < rules.COMMUNICATION_MIN_EXPOSED_PCT
    for report in (hidden, small):
        assert "communication" not in [r["id"] for r in report["recommendations"]]


def test_single_process_without_collectives_has_no_section(real_reports) -> None:
    for report in real_reports.values():  # the single-GPU H200 fixtures
        assert report["distributed"] is None
        assert rules.rule_communication(report) is None
        assert rules.rule_distributed_backend(report) is None


def test_distributed_backend_rule_fires_only_for_non_nccl_on_gpus() -> None:
    report = build_report(synthetic_profile((4000.0, 9000.0), (0.0, 6000.0)))
    assert rules.rule_distributed_backend(report) is None  # nccl

    def with_backend(backend: str | None, world_size: int = 2, gpu: bool = True) -> dict:
        r = copy.deepcopy(report)
        r["system"]["distributed"] = {"rank": 0, "world_size": world_size, "backend": backend}
        r["system"]["gpu_name"] = "NVIDIA H200"
        if not gpu:
            r["gpu_time_us"] = 0.0
        return r

    rec = rules.rule_distributed_backend(with_backend("gloo"))
    assert rec is not None and rec["id"] == "distributed_backend" and rec["severity"] == "high"
    assert "gloo" in rec["problem"] and "nccl" in rec["fix"]["pytorch"]
    assert rules.rule_distributed_backend(with_backend("mpi")) is not None
    assert rules.rule_distributed_backend(with_backend("cpu:gloo,cuda:nccl")) is None
    assert rules.rule_distributed_backend(with_backend("gloo", world_size=1)) is None
    assert rules.rule_distributed_backend(with_backend("gloo", gpu=False)) is None  # CPU training
    assert rules.rule_distributed_backend(with_backend(None)) is None
    # build_report registers the rule: a gloo run with GPU kernels gets it
    gloo = build_report(synthetic_profile((4000.0, 9000.0), (0.0, 6000.0), backend="gloo"))
    assert "distributed_backend" in [r["id"] for r in gloo["recommendations"]]


def _rank_report(rank: int, compute_us: float, world_size: int = 4) -> dict:
    """A rank whose GEMM takes ``compute_us``; its all-reduce starts when the slowest rank
    (compute 8000 µs) is done, as a blocking collective does, and then takes 500 µs."""
    profile = synthetic_profile((compute_us, 8500.0), (0.0, compute_us), world_size=world_size)
    profile.metadata["distributed"]["rank"] = rank
    return build_report(profile)


def test_cross_rank_summary_names_the_straggler_and_the_imbalance() -> None:
    computes = {0: 5000.0, 1: 5200.0, 2: 8000.0, 3: 5100.0}
    reports = [_rank_report(r, c) for r, c in computes.items()]
    summary = d.cross_rank_summary(reports[::-1])
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]
    assert summary["missing_ranks"] == []
    s = summary["straggler"]
    others = sorted(c for r, c in computes.items() if r != 2)
    assert s["rank"] == 2 and s["significant"]
    assert s["slower_by_ms"] == pytest.approx((8000.0 - others[1]) / 1e3, abs=1e-3)
    mean = sum(computes.values()) / 4
    assert summary["load_imbalance"] == pytest.approx(8000.0 / mean, abs=1e-3)
    recs = {r["id"]: r for r in summary["recommendations"]}
    assert recs["straggler"]["evidence"]["rank"] == 2
    assert "compute takes longer" in recs["straggler"]["problem"]
    # the straggler waits least (500 µs of 10 ms): communication itself is cheap here
    assert "communication" not in recs


def test_cross_rank_summary_balanced_missing_and_single() -> None:
    reports = [_rank_report(r, 6000.0) for r in (0, 2)]
    summary = d.cross_rank_summary(reports)
    assert summary["missing_ranks"] == [1, 3]
    assert not summary["straggler"]["significant"]
    assert summary["recommendations"][0]["id"] == "communication"  # 2.5 ms of 10 exposed
    single = d.cross_rank_summary(reports[:1])
    assert single["straggler"] is None and single["load_imbalance"] is None
