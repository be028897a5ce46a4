"""Every recommendation id fires where it should and stays silent where its fix is in place.

All cases are real H200 profiles (tests/data/h200/README.md says how each was recorded).
"""

from __future__ import annotations

import copy

import pytest

from tb_gpuprof.analysis.rules import recommend

from .h200 import rec_ids, report

LADDER = ["resnet50_fp32", "resnet50_tf32", "resnet50_amp", "resnet50_amp_cl"]
NEXT_STEP = {"resnet50_fp32": "tf32", "resnet50_tf32": "amp", "resnet50_amp": "channels_last"}


@pytest.mark.parametrize("case", LADDER[:3])
def test_ladder_top_recommendation_is_the_next_step(case):
    ids = rec_ids(report(case))
    assert ids, f"{case}: no recommendation"
    assert ids[0] == NEXT_STEP[case], f"{case}: {ids}"


def test_ladder_end_has_none_of_the_precision_or_layout_fixes():
    ids = rec_ids(report("resnet50_amp_cl"))
    assert not {"tf32", "amp", "channels_last"} & set(ids), ids


@pytest.mark.parametrize("case,absent", [
    ("resnet50_tf32", "tf32"),             # TF32 already on
    ("resnet50_amp", "tf32"), ("resnet50_amp", "amp"),   # autocast on
    ("resnet50_amp_cl", "channels_last"),  # channels_last on
])
def test_silent_when_fix_in_place(case, absent):
    assert absent not in rec_ids(report(case))


def test_tf32_fires_from_evidence_alone_on_an_imported_trace():
    # No hook flags: the FP32 CUDA-core GEMM/conv time alone must trigger it.
    rep = report("resnet50_fp32", with_env=False)
    tf32 = next(r for r in rep["recommendations"] if r["id"] == "tf32")
    assert tf32["evidence"]["fp32_eligible_pct"] >= 10
    assert tf32["estimated_saving_ms"] > 0
    assert set(tf32["fix"]) == {"pytorch", "keras", "jax"}


def test_tf32_silent_when_flags_say_tf32_is_on():
    rep = copy.deepcopy(report("resnet50_fp32"))
    rep["system"]["flags"].update(allow_tf32_matmul=True, allow_tf32_cudnn=True)
    assert "tf32" not in [r["id"] for r in recommend(rep)]


def test_tf32_silent_before_ampere():
    rep = copy.deepcopy(report("resnet50_fp32", with_env=False))
    rep["system"]["compute_capability"] = "7.0"
    ids = [r["id"] for r in recommend(rep)]
    assert "tf32" not in ids and "amp" in ids


def test_channels_last_evidence_not_flags_keeps_it_silent_on_nhwc_run():
    # Without flags, the NHWC run has no layout transforms worth fixing.
    assert "channels_last" not in rec_ids(report("resnet50_amp_cl", with_env=False))


def test_input_pipeline_fires_on_slow_loader_and_not_on_synthetic_data():
    slow = report("resnet18_slow_input")
    rec = next(r for r in slow["recommendations"] if r["id"] == "input_pipeline")
    assert rec["evidence"]["input_bound_pct"] >= 5
    assert rec["evidence"]["data_loader_wait_ms"] > rec["evidence"]["host_outside_ops_ms"]
    assert rec_ids(slow)[0] == "input_pipeline"
    for case in LADDER:
        assert "input_pipeline" not in rec_ids(report(case)), case


def test_compile_fires_on_eager_launch_bound_and_not_when_compiled():
    assert "compile" in rec_ids(report("mlp_eager_small"))
    assert "compile" not in rec_ids(report("mlp_compiled_small"))


def test_compile_silent_on_gpu_bound_fp32():
    assert "compile" not in rec_ids(report("resnet50_fp32"))


def test_batch_size_fires_when_gpu_idle_and_memory_free():
    rep = report("resnet18_batch8")
    rec = next(r for r in rep["recommendations"] if r["id"] == "batch_size")
    assert rec["evidence"]["gpu_busy_pct"] < 60
    assert rec["evidence"]["memory_used_pct"] < 50


def test_batch_size_silent_when_gpu_busy_or_memory_unknown():
    assert "batch_size" not in rec_ids(report("resnet50_amp"))
    assert "batch_size" not in rec_ids(report("resnet18_batch8", with_env=False))


def test_recommendations_sorted_by_estimated_saving():
    for case in [*LADDER, "resnet18_slow_input", "mlp_eager_small"]:
        savings = [r["estimated_saving_ms"] or 0.0 for r in report(case)["recommendations"]]
        assert savings == sorted(savings, reverse=True), case
