"""The rule registry (tb_gpuprof/analysis/rules/): declared precedence, and the topology passed
into the analysis so that ``gpu_placement`` fires for a real hook run on a multi-GPU host (the
host is fake NVML: tests/nvml_fake.py; the training loop and the analysis are real)."""

from __future__ import annotations

import copy

import pytest

from tb_gpuprof.analysis.rules import RULES, Rule, RuleDoc, recommend
from tb_gpuprof.store.reader import load_run_report
from tests.nvml_fake import FakeGpu, FakeNvml
from tests.test_nvml_advice import GIB_MIB, busy, summary

from .h200 import rec_ids, report

torch = pytest.importorskip("torch")

BUS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0", "00000000:AB:00.0"]


def test_rule_names_are_unique_and_precedence_names_real_rules() -> None:
    names = [r.id for r in RULES]
    assert len(names) == len(set(names))
    assert all(s in names for r in RULES for s in r.supersedes)


def test_input_pipeline_supersedes_the_nvml_batch_size_advice() -> None:
    # a real input-bound run, with telemetry that on its own says "raise the batch size"
    rep = copy.deepcopy(report("resnet18_slow_input"))
    rep["telemetry"] = summary({0: busy(20.0, 10 * GIB_MIB)})
    assert "input_pipeline" in rec_ids(rep)
    without = tuple(r for r in RULES if r.id != "input_pipeline")
    assert "batch_size" in [r["id"] for r in recommend(rep, rules=without)]
    assert "batch_size" not in [r["id"] for r in recommend(rep)]


def test_a_new_rule_is_one_registry_entry() -> None:
    rep = report("resnet50_fp32")
    extra = Rule("always", lambda inp: {"id": "always", "severity": "low", "title": "t",
                                        "problem": "p", "evidence": {}, "fix": {},
                                        "estimated_saving_ms": None,
                                        "estimated_saving_pct": None},
                 RuleDoc("always", "never", "not estimated"), {}, supersedes=("tf32",))
    ids = [r["id"] for r in recommend(rep, rules=(*RULES, extra))]
    assert "always" in ids and "tf32" not in ids
    assert "tf32" in [r["id"] for r in recommend(rep)]


@pytest.fixture
def four_gpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU0<->GPU1 and GPU2<->GPU3 NVLink pairs; the job gets GPUs 1 and 2 (SMP between)."""
    peers = {0: 1, 1: 0, 2: 3, 3: 2}
    FakeNvml([FakeGpu(f"GPU-{i}", BUS[i], nvlink_peers=[BUS[peers[i]]] * 18)
              for i in range(4)]).install(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")


def test_gpu_placement_fires_end_to_end_for_a_hook_run(tmp_path, four_gpu_host) -> None:
    from tb_gpuprof.torch import GpuProfiler
    from tests.test_torch_hook import batches, tiny_cnn, train

    run = str(tmp_path / "placed")
    with GpuProfiler(run, iter_start=2, iter_stop=4, nvml=True, nvml_interval_s=0.05) as prof:
        train(prof, tiny_cnn(), batches(6))
    rep = load_run_report(run)
    placement = [r for r in rep["recommendations"] if r["id"] == "gpu_placement"]
    assert placement, rec_ids(rep)
    assert placement[0]["evidence"]["job_gpus"] == [1, 2]
    assert "CUDA_VISIBLE_DEVICES=0,1" in placement[0]["fix"]["pytorch"]


def test_batch_size_advice_says_how_many_times_the_batch_fits() -> None:
    from tb_gpuprof.analysis.memory_parts import batch_headroom
    from tb_gpuprof.analysis.rules.trace import rule_batch_size

    gib = 2**30
    sizes = {"parameters": 1, "gradients": 0, "optimizer_state": 2, "activations": 3,
             "temporaries": 1, "before_window": 0}
    device = {"device": "cuda:0", "peak": {"allocated_bytes": 7 * gib, "reserved_bytes": 7 * gib},
              "peak_parts": {"allocated_bytes": 7 * gib, "backward_passes": 1,
                             "parts": [{"part": k, "bytes": v * gib} for k, v in sizes.items()],
                             "outside_pytorch": None}}
    report = {"bottleneck": {"corrected_ms": {"gpu": 3.0, "dispatch": 7.0}},
              "system": {"memory_peak_bytes": 7 * gib, "gpu_memory_bytes": 80 * gib},
              "breakdown": {"gpu_busy_us": 1.0, "wall_us": 1.0}, "kernels": [],
              "iterations": {"count": 1, "mean_ms": 10.0},
              "memory": {"devices": [{"device": "cpu", "peak": {}}, device]}}
    rec = rule_batch_size(report)
    assert rec is not None
    fits = batch_headroom(device, 80 * gib)
    assert fits is not None and rec["evidence"]["batch_fits_times"] == round(fits, 2)
    assert f"about {fits:.1f}x the current batch fits" in rec["problem"]
    device["peak_parts"]["backward_passes"] = 0
    rec = rule_batch_size(report)
    assert rec is not None and "batch_fits_times" not in rec["evidence"]
