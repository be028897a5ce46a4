"""The report on real profiles: iterations, kernel table, Tensor Core pie, breakdown, phases."""

from __future__ import annotations

import gzip
import json

import pytest

from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.errors import EmptyProfileError
from tb_gpuprof.model import STEP, USER, Annotation, GpuActivity, Profile

from .h200 import JAX_CONV, TRANSFORMER, env, profile, report


@pytest.mark.parametrize("case", ["resnet50_fp32", "resnet50_tf32", "resnet50_amp"])
def test_iteration_time_matches_time_measured_outside_the_profiler(case):
    # GPU-bound runs: the host runs ahead of the GPU, so host step markers alone are wrong;
    # the report must recover the real iteration time (measured with synchronize, no profiler).
    rep = report(case)
    it = rep["iterations"]
    assert it["method"] == "profiler_step"
    assert it["count"] == 3 and it["range"] == [1, 3]
    measured = env(case)["measured_iteration_ms"]
    assert it["median_ms"] == pytest.approx(measured, rel=0.05)
    assert it["min_ms"] <= it["median_ms"] <= it["p95_ms"] <= it["max_ms"]


def test_iteration_selection_by_step_number():
    rep = build_report(profile("resnet50_tf32"), iter_start=2, iter_stop=4)
    assert rep["iterations"]["count"] == 2
    assert rep["iterations"]["range"] == [2, 3]
    with pytest.raises(EmptyProfileError, match="no iterations"):
        build_report(profile("resnet50_tf32"), iter_start=10, iter_stop=12)


def test_optimizer_steps_define_iterations_without_step_markers():
    with gzip.open(TRANSFORMER) as f:
        events = json.load(f)["traceEvents"]
    n_opt = sum(1 for e in events if e.get("cat") == "user_annotation"
                and e["name"].startswith("Optimizer.step#"))
    from tb_gpuprof.readers import load_profile

    rep = build_report(load_profile(TRANSFORMER))
    assert rep["iterations"]["method"] == "optimizer_step"
    assert rep["iterations"]["count"] == n_opt
    # bf16 autocast transformer: GEMMs and attention on Tensor Cores in bf16.
    tc = [k for k in rep["kernels"] if k["uses_tensor_cores"]]
    assert tc and all(k["precision"] in ("bf16", "fp16", "unknown") for k in tc)
    assert rep["tensor_cores"]["tc_pct"] > 20


def test_key_range_and_whole_trace():
    acts = [GpuActivity("kernel", "volta_sgemm_128x64_nn", t * 100.0 + 10, 50.0)
            for t in range(4)]
    anns = [Annotation(f"train_step {i}", i * 100.0, 90.0, kind=USER) for i in range(4)]
    prof = Profile("synthetic", "nsys", gpu=acts, annotations=anns)
    rep = build_report(prof, key="train_step")
    assert rep["iterations"]["method"] == "key_range"
    assert rep["iterations"]["count"] == 4
    whole = build_report(Profile("synthetic", "nsys", gpu=acts))
    assert whole["iterations"]["method"] == "whole_trace"
    assert whole["iterations"]["count"] == 1
    missing = build_report(prof, key="no_such_range")
    assert any("no_such_range" in w for w in missing["warnings"])


def test_xplane_report_whole_trace_and_tensor_cores():
    from tb_gpuprof.readers import load_profile

    rep = build_report(load_profile(JAX_CONV))
    assert rep["source"]["format"] == "xplane"
    assert rep["iterations"]["method"] == "whole_trace"
    assert rep["phases"] is None  # XLA launches carry no framework op: no phase guess
    assert rep["kernels"], "no kernels from the JAX XPlane"
    precisions = {k["precision"] for k in rep["kernels"] if k["uses_tensor_cores"]}
    assert "bf16" in precisions  # the bf16 conv runs on Tensor Cores


@pytest.mark.parametrize("case", ["resnet50_fp32", "resnet50_amp_cl"])
def test_kernel_table_and_pie_are_consistent(case):
    rep = report(case)
    ks = rep["kernels"]
    assert [k["total_us"] for k in ks] == sorted((k["total_us"] for k in ks), reverse=True)
    assert sum(k["pct"] for k in ks) == pytest.approx(100.0, abs=0.5)
    assert sum(k["total_us"] for k in ks) == pytest.approx(rep["gpu_time_us"], rel=1e-6)
    for k in ks:
        assert k["min_us"] <= k["mean_us"] <= k["max_us"]
        assert k["count"] >= 1
    tc = rep["tensor_cores"]
    assert tc["tc_pct"] + tc["eligible_not_tc_pct"] + tc["other_pct"] + tc["memory_pct"] == \
        pytest.approx(100.0, abs=0.1)
    tc_time = sum(k["total_us"] for k in ks if k["uses_tensor_cores"])
    assert tc["tc_us"] == pytest.approx(tc_time, rel=1e-6)


def test_fp32_run_uses_no_tensor_cores_and_amp_cl_does():
    assert report("resnet50_fp32")["tensor_cores"]["tc_us"] == 0
    amp = report("resnet50_amp_cl")
    assert amp["tensor_cores"]["tc_kernel_efficiency_pct"] > 50
    assert any(k["uses_tensor_cores"] and k["category"] == "conv" for k in amp["kernels"])


def test_flops_give_plausible_throughput():
    rep = report("resnet50_amp_cl")
    rated = [k for k in rep["kernels"] if k["tflops"]]
    assert rated, "no kernel got FLOPs from with_flops op data"
    # H200 dense FP16 peak is ~990 TFLOP/s; nothing may exceed it.
    assert all(0 < k["tflops"] < 1000 for k in rated)


def test_phases_and_breakdown_add_up():
    rep = report("resnet50_amp")
    ph = rep["phases"]
    per_iter_gpu = rep["gpu_time_us"] / rep["iterations"]["count"] / 1e3
    assert ph["forward_ms"] + ph["backward_ms"] + ph["optimizer_ms"] + \
        ph["unattributed_ms"] == pytest.approx(per_iter_gpu, rel=0.02)
    assert ph["unattributed_ms"] < 0.05 * per_iter_gpu  # torch ops enclose nearly every launch
    assert ph["backward_ms"] > ph["forward_ms"] > 0  # backward does about twice the work
    for item in rep["iterations"]["items"]:
        assert sum(item["breakdown_ms"].values()) == pytest.approx(item["wall_ms"], rel=0.02)
    bd = rep["breakdown"]
    assert sum(bd["idle_attribution_us"].values()) == pytest.approx(bd["idle_us"], rel=0.01)


def test_report_is_plain_json():
    rep = report("resnet50_tf32")
    assert json.loads(json.dumps(rep)) == rep


def test_empty_profile_is_a_typed_error():
    with pytest.raises(EmptyProfileError):
        build_report(Profile("nothing.json", "kineto"))


def test_steps_marked_only_on_the_gpu_timeline_define_iterations():
    acts = [GpuActivity("kernel", "ampere_sgemm_128x64_nn", t * 100.0 + 10, 50.0)
            for t in range(3)]
    anns = [Annotation(f"{i}", i * 100.0, 95.0, kind=STEP, on_gpu=True, step=i)
            for i in range(3)]
    rep = build_report(Profile("synthetic", "xplane", gpu=acts, annotations=anns))
    assert rep["iterations"]["method"] == "profiler_step"
    assert rep["iterations"]["count"] == 3


def test_cpu_only_trace_gets_no_gpu_advice():
    from tb_gpuprof.model import CpuOp

    ops = [CpuOp("aten::conv2d", i * 100.0, 90.0) for i in range(4)]
    steps = [Annotation(f"ProfilerStep#{i}", i * 100.0, 100.0, kind=STEP, step=i)
             for i in range(4)]
    rep = build_report(Profile("cpu.json", "kineto", cpu_ops=ops, annotations=steps))
    assert rep["iterations"]["count"] == 4
    assert rep["recommendations"] == []
    assert any("no GPU activity" in w for w in rep["warnings"])
