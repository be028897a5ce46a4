"""The throughput section (FLOPs per iteration, TFLOP/s, peaks, MFU against the BF16 peak, the
utilisation of the precision in use) and attention FLOPs."""

from __future__ import annotations

import copy

import pytest

from tb_gpuprof.analysis.flops import causal_pairs, op_flops
from tb_gpuprof.analysis.peaks import gpu_peaks
from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.analysis.throughput import (
    PEAK_TFLOPS,
    peak_for,
    throughput_scalars,
    throughput_section,
)
from tb_gpuprof.readers import load_profile
from tests import h200


def test_fp32_and_tf32_resnet50_count_the_same_model_flops_from_different_kernels():
    fp32 = h200.report("resnet50_fp32")["throughput"]
    tf32 = h200.report("resnet50_tf32")["throughput"]
    # Same model and batch, entirely different kernels (SIMT vs Tensor Core): the count from
    # op shapes must agree, and match the analytic count: torchvision's 4.09 GMACs per
    # 224x224 image forward, x2 FLOPs per MAC, x3 for forward + backward, batch 256 (the
    # first conv needs no input gradient, so the trace holds slightly less).
    analytic = 4.09e9 * 2 * 3 * 256
    for t in (fp32, tf32):
        assert t["flops_per_iteration"] == pytest.approx(analytic, rel=0.03)
        assert t["math_time_counted_pct"] == 100.0
        assert set(t["flops_by_category"]) == {"conv", "gemm"}
    assert fp32["flops_per_iteration"] == pytest.approx(tf32["flops_per_iteration"], rel=1e-6)
    assert (fp32["precision"], tf32["precision"]) == ("fp32", "tf32")
    # CUDA-core FP32 vs TF32 Tensor Cores: the utilisation of each is against its own peak
    assert fp32["precision_peak_tflops"] < tf32["precision_peak_tflops"]
    # MFU is against one peak, the dense BF16 Tensor Core rate, for both
    bf16 = gpu_peaks("NVIDIA H200").tflops["bf16"]
    assert fp32["peak_tflops"] == tf32["peak_tflops"] == bf16
    assert fp32["peak_precision"] == tf32["peak_precision"] == "bf16"
    for rep in (h200.report("resnet50_fp32"), h200.report("resnet50_tf32")):
        t = rep["throughput"]
        assert t["time_source"] == "window_median_ms"
        assert t["iteration_ms"] == rep["iterations"]["median_ms"]
        achieved = t["flops_per_iteration"] / (t["iteration_ms"] / 1e3) / 1e12
        assert t["achieved_tflops"] == pytest.approx(achieved, rel=1e-3)
        assert t["mfu_pct"] == pytest.approx(100 * achieved / t["peak_tflops"], rel=1e-3)
        assert t["precision_utilization_pct"] == pytest.approx(
            100 * achieved / t["precision_peak_tflops"], rel=1e-3)
        assert "H200" in t["peak_source"] and "H200" in t["precision_peak_source"]
    # TF32 is twice as fast on the same work: its MFU is higher, though it uses less of the
    # (faster) TF32 peak than FP32 uses of the CUDA cores' (issue 36)
    assert tf32["mfu_pct"] > fp32["mfu_pct"]
    assert tf32["precision_utilization_pct"] < fp32["precision_utilization_pct"]


def test_transformer_flops_match_the_analytic_count_including_attention():
    rep = build_report(load_profile(h200.TRANSFORMER))
    t = rep["throughput"]
    # the fixture: 6 encoder layers, d_model 768, feed-forward 3072, 12 heads, 32 x 512 tokens
    layers, d, ff, batch, seq = 6, 768, 3072, 32, 512
    tokens = batch * seq
    linear_fwd = 2 * tokens * (d * 3 * d + d * d + 2 * d * ff)
    attention_fwd = 4 * batch * seq * seq * d  # QK^T and PV over all heads
    analytic = 3 * layers * (linear_fwd + attention_fwd)
    assert t["flops_per_iteration"] == pytest.approx(analytic, rel=0.03)
    assert t["flops_by_category"]["attention"] == pytest.approx(3 * layers * attention_fwd,
                                                               rel=1e-6)
    assert t["precision"] == "bf16"


def test_peak_override_and_unknown_gpu():
    prof = h200.profile("resnet50_tf32")
    rep = build_report(prof, env=h200.env("resnet50_tf32"), peak_tflops=100.0)
    t = rep["throughput"]
    assert (t["peak_tflops"], t["peak_source"]) == (100.0, "peak_tflops argument")
    assert t["peak_precision"] is None  # the caller's peak, of a precision we do not know
    assert t["mfu_pct"] == pytest.approx(t["achieved_tflops"], rel=1e-3)
    # the utilisation of the precision in use still reads the table
    assert t["precision_peak_tflops"] == gpu_peaks("NVIDIA H200").tflops["tf32"]

    other = copy.deepcopy(h200.report("resnet50_tf32"))
    other["system"]["gpu_name"] = "NVIDIA A10G"
    t = throughput_section(other)
    assert t["peak_tflops"] is None and t["mfu_pct"] is None
    assert t["precision_peak_tflops"] is None and t["precision_utilization_pct"] is None
    assert "peak_tflops=" in t["peak_source"]
    assert t["achieved_tflops"] is not None  # throughput is still known


def test_mfu_of_a_gpu_without_bf16_is_against_its_fp16_tensor_cores():
    volta = copy.deepcopy(h200.report("resnet50_amp"))
    volta["system"]["gpu_name"] = "Tesla V100-SXM2-32GB"
    t = throughput_section(volta)
    assert (t["peak_tflops"], t["peak_precision"]) == (gpu_peaks("V100").tflops["fp16"], "fp16")
    assert "V100" in t["peak_source"]


def test_unprofiled_iteration_time_is_preferred():
    rep = copy.deepcopy(h200.report("resnet50_amp_cl"))
    measured = h200.env("resnet50_amp_cl")["measured_iteration_ms"]
    window = throughput_section(rep)
    rep["iterations"]["unprofiled_median_ms"] = measured
    t = throughput_section(rep)
    assert t["time_source"] == "unprofiled_median_ms" and t["iteration_ms"] == measured
    # the profiler slowed the window down: achieved throughput outside it is higher
    ratio = t["achieved_tflops"] / window["achieved_tflops"]
    assert ratio == pytest.approx(rep["iterations"]["median_ms"] / measured, rel=1e-3)


@pytest.mark.parametrize(("name", "label"), [
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA A10", "A10"),
    ("Tesla V100-SXM2-16GB", "V100"), ("Tesla T4", "T4"),
])
def test_gpu_names_as_drivers_report_them_find_their_row(name, label):
    peak, source = peak_for(name, "fp32")
    row = next(peaks for lab, _, peaks in PEAK_TFLOPS if lab == label)
    assert peak == row["fp32"] and source.startswith(label)


def test_peak_table_is_dense_and_ordered_by_precision():
    for label, _, peaks in PEAK_TFLOPS:
        order = [peaks[p] for p in ("fp32", "tf32", "bf16", "fp8") if p in peaks]
        assert order == sorted(order), label
        if "bf16" in peaks:
            assert peaks["bf16"] == peaks["fp16"]
    assert peak_for("NVIDIA A10G", "bf16")[0] is None  # not an A10
    assert peak_for("Tesla T4", "bf16")[0] is None  # Turing has no BF16


def test_throughput_scalars_after_a_window():
    rep = h200.report("resnet50_amp")
    t = rep["throughput"]
    s = throughput_scalars(rep, 50.0)
    assert s["gpuprof/model_tflops"] == pytest.approx(t["flops_per_iteration"] / 0.05 / 1e12)
    assert s["gpuprof/mfu_pct"] == pytest.approx(100 * s["gpuprof/model_tflops"]
                                                 / t["peak_tflops"])
    assert throughput_scalars(rep, 0.0) == {}
    no_peak = copy.deepcopy(rep)
    no_peak["system"]["gpu_name"] = "some GPU"
    del no_peak["throughput"]  # a report stored before the section existed
    assert set(throughput_scalars(no_peak, 50.0)) == {"gpuprof/model_tflops"}


def test_brute_force_causal_pair_counts():
    torch = pytest.importorskip("torch")
    for sq, sk in [(1, 1), (5, 5), (3, 7), (7, 3), (64, 64), (10, 33), (33, 10)]:
        ones = torch.ones(sq, sk)
        assert causal_pairs(sq, sk, None) == sq * sk
        assert causal_pairs(sq, sk, "top_left") == int(ones.tril().sum())
        assert causal_pairs(sq, sk, "bottom_right") == int(ones.tril(sk - sq).sum())


def _attention_trace(tmp_path, torch, *, causal: bool, sq: int, sk: int) -> str:
    q = torch.randn(2, 3, sq, 16, requires_grad=True)
    k = torch.randn(2, 3, sk, 16, requires_grad=True)
    v = torch.randn(2, 3, sk, 16, requires_grad=True)
    with torch.profiler.profile(record_shapes=True) as prof:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.sum().backward()
    path = str(tmp_path / f"sdpa_{causal}_{sq}_{sk}.json")
    prof.export_chrome_trace(path)
    return path


@pytest.mark.parametrize(("causal", "sq", "sk"), [(True, 24, 24), (False, 24, 40),
                                                  (True, 16, 40)])
def test_sdpa_flops_from_a_real_trace(tmp_path, causal, sq, sk):
    torch = pytest.importorskip("torch")
    profile = load_profile(_attention_trace(tmp_path, torch, causal=causal, sq=sq, sk=sk))
    ones = torch.ones(sq, sk)
    pairs = int(ones.tril().sum()) if causal else sq * sk
    fwd = 4 * 2 * 3 * 16 * pairs
    counted = {o.name: op_flops(o) for o in profile.cpu_ops
               if "attention" in o.name and op_flops(o)}
    assert counted["aten::scaled_dot_product_attention"] == fwd
    backward = [f for n, f in counted.items() if n.endswith("_backward")]
    assert backward and all(f == 2 * fwd for f in backward)
    forward_impl = [f for n, f in counted.items()
                    if n != "aten::scaled_dot_product_attention" and not n.endswith("backward")]
    assert all(f == fwd for f in forward_impl)
