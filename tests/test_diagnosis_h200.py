"""The verdict and the first recommendation on real loops recorded on an H200 through our hooks
(tests/data/h200_loops and its README): not the textbook ResNet only."""

from __future__ import annotations

import pytest

from tests.h200 import loop_env, loop_report, rec_ids

# case -> (bound, minimum share of the (un-profiled) iteration in %, first recommendation)
CASES = {
    "numpy_prep": ("host", 70, "input_pipeline"),  # PIL + numpy per batch, no DataLoader
    "tokenize": ("host", 55, "input_pipeline"),  # slow tokenizer in the loop
    "pageable": ("copy", 75, "pinned_memory"),  # 256 MiB pageable input copy per step
    "slow_loader": ("data_wait", 70, "input_pipeline"),  # 2 workers, slow samples
    "gpt2_eager": ("dispatch", 50, "compile"),  # HF GPT-2 124M bf16, eager, batch 4x256
    "lightning_auto": ("gpu", 80, "channels_last"),  # ResNet-34 bf16-mixed, closure optimizer
    "keras_jax_small": ("dispatch", 70, "dispatch_overhead"),  # Keras 3 on JAX, batch 32
    "jax_host_prep": ("host", 75, "input_pipeline"),  # jax.profiler XPlane, numpy prep
    "resnet50_fp32": ("gpu", 95, "tf32"),
    "resnet50_tf32": ("gpu", 95, "amp"),
    "resnet50_amp": ("gpu", 85, "channels_last"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verdict_names_the_bound_and_the_first_fix_addresses_it(case):
    bound, share, first = CASES[case]
    rep = loop_report(case)
    bn = rep["bottleneck"]
    assert bn["bound"] == bound, bn["verdict"]
    assert bn["corrected_pct"][bound] >= share, bn["corrected_pct"]
    assert rec_ids(rep)[0] == first, rec_ids(rep)


@pytest.mark.parametrize("case", sorted(CASES))
def test_shares_sum_to_the_iteration(case):
    rep = loop_report(case)
    bn = rep["bottleneck"]
    for item, wall in zip(bn["items"], rep["iterations"]["items"], strict=True):
        assert sum(v for k, v in item.items() if k != "step") == pytest.approx(
            wall["wall_ms"], rel=1e-3)
    assert sum(bn["corrected_ms"].values()) == pytest.approx(
        rep["iterations"]["unprofiled_median_ms"], rel=1e-3)


def test_ladder_ends_with_no_precision_or_layout_advice():
    assert not {"tf32", "amp", "channels_last"} & set(rec_ids(loop_report("resnet50_amp_cl")))


def test_pinned_copies_need_no_pinned_memory_advice():
    assert "pinned_memory" not in rec_ids(loop_report("pinned"))
    assert "pinned_memory" in rec_ids(loop_report("pageable"))


def test_compile_is_not_the_answer_to_host_work_or_data():
    for case in ("numpy_prep", "slow_loader", "pageable", "jax_host_prep"):
        assert "compile" not in rec_ids(loop_report(case)), case


def test_input_pipeline_says_where_the_time_went():
    loader = next(r for r in loop_report("slow_loader")["recommendations"]
                  if r["id"] == "input_pipeline")
    ev = loader["evidence"]
    assert ev["data_loader_wait_ms"] > 10 * ev["host_outside_ops_ms"]
    inline = next(r for r in loop_report("numpy_prep")["recommendations"]
                  if r["id"] == "input_pipeline")
    assert inline["evidence"]["host_outside_ops_ms"] > 100
    assert inline["evidence"]["data_loader_wait_ms"] == 0
    assert "DataLoader workers" in inline["problem"]


def test_host_sync_names_item_and_its_source_line():
    rep = loop_report("host_sync")
    rec = next(r for r in rep["recommendations"] if r["id"] == "host_sync")
    site = rec["evidence"]["sites"][0]
    assert site["op"] == "aten::item"
    assert site["count_per_iteration"] == 9  # loss.item() + eight float(grad.norm())
    assert site["source"].startswith("diagnosis_cases.py(")


def test_profiler_overhead_is_measured_and_flagged_on_the_launch_bound_loop():
    rep = loop_report("gpt2_eager")
    it = rep["iterations"]
    assert it["profiler_overhead_ratio"] > 2.0  # 61.7 ms profiled vs 25.2 ms without
    assert any("profiler slowed" in w for w in rep["warnings"])
    uncorrected = loop_report("gpt2_eager", corrected=False)
    assert uncorrected["iterations"]["unprofiled_median_ms"] is None
    assert uncorrected["bottleneck"]["basis"] == "profiled"
    # uncorrected, the profiler's own host overhead makes the loop look far more host-bound
    assert (uncorrected["bottleneck"]["mean_pct"]["dispatch"]
            > rep["bottleneck"]["corrected_pct"]["dispatch"] + 20)


def test_closure_optimizer_phases_are_forward_and_backward():
    ph = loop_report("lightning_auto")["phases"]
    assert ph["backward_ms"] > ph["forward_ms"] > 5 * ph["optimizer_ms"]


def _rec(case: str, rid: str) -> dict:
    return next(r for r in loop_report(case)["recommendations"] if r["id"] == rid)


def test_savings_see_what_bounds_the_iteration():
    # a GPU speed-up on the launch-bound GPT-2 buys (almost) nothing; compiling it does
    assert "compile" in rec_ids(loop_report("gpt2_tf32"))
    amp = next((r for r in loop_report("gpt2_tf32")["recommendations"] if r["id"] == "amp"),
               None)
    assert amp is None or amp["estimated_saving_pct"] < 10
    # compiling it does, and the predicted rung is the one measured beside it (same process)
    compiled = _rec("gpt2_bf16", "compile")
    measured = loop_env("gpt2_bf16_compile")["unprofiled"]["median_ms"]
    assert compiled["estimated_saving_pct"] > 20
    assert abs(compiled["predicted_iteration_ms"] - measured) <= 0.15 * measured
    # on GPU-bound rungs the saving is the kernels' own, and its range brackets it
    tf32 = _rec("resnet50_fp32", "tf32")
    low, high = tf32["estimated_range_pct"]
    assert 40 < low <= tf32["estimated_saving_pct"] <= high < 70
    assert tf32["severity"] == "high" and "re-timed" in tf32["estimate_basis"]


def test_amp_after_tf32_is_counted_from_tf32_speed():
    recs = loop_report("resnet50_fp32")["recommendations"]
    assert [r["id"] for r in recs][:2] == ["tf32", "amp"]
    assert recs[1]["predicted_iteration_ms"] < recs[0]["predicted_iteration_ms"]
