"""The roofline section: bytes per kernel from op shapes, intensity, % of speed of light, the
ceilings table, on the real H200 traces (tests/data/h200, ../shared/fixtures copies)."""

from __future__ import annotations

import copy

import pytest

from tb_gpuprof.analysis import stages
from tb_gpuprof.analysis.columns import column_scope
from tb_gpuprof.analysis.peaks import GPU_PEAKS, gpu_peaks, peak_for
from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.analysis.roofline import (
    op_traffic,
    pipe_peak_tflops,
    roofline_section,
    speed_of_light,
)
from tb_gpuprof.analysis.schema import validate_built_report
from tb_gpuprof.model import CpuOp
from tb_gpuprof.readers import load_profile
from tests import h200

H200 = gpu_peaks("NVIDIA H200")


def _points(rep: dict) -> list[dict]:
    return rep["roofline"]["points"]


def test_ceilings_are_the_h200_datasheet_rows():
    assert H200 is not None and H200.label == "H200 SXM"
    rf = h200.report("resnet50_amp")["roofline"]
    assert rf["ceilings"]["gpu"] == "H200 SXM"
    assert rf["ceilings"]["hbm_gbps"] == 4800.0
    assert rf["ceilings"]["tflops"]["bf16"] == 989.5 == H200.tflops["fp16"]
    # MFU and the precision's utilisation read the same table
    tp = h200.report("resnet50_amp")["throughput"]
    assert tp["peak_tflops"] == H200.tflops["bf16"]
    assert tp["precision_peak_tflops"] == H200.tflops[tp["precision"]]


@pytest.mark.parametrize("name, label, gbps", [
    ("NVIDIA H200", "H200 SXM", 4800.0), ("NVIDIA H200 NVL", "H200 NVL", 4800.0),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350.0), ("NVIDIA H100 PCIe", "H100 PCIe", 2000.0),
    ("NVIDIA H100 NVL", "H100 NVL", 3900.0), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039.0),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1555.0), ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1555.0),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935.0), ("NVIDIA L4", "L4", 300.0),
])
def test_device_names_find_their_bandwidth(name, label, gbps):
    row = gpu_peaks(name)
    assert row is not None and (row.label, row.hbm_gbps) == (label, gbps)


def test_the_table_has_every_precision_for_the_gpus_the_issue_names():
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200",
                 "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"):
        row = gpu_peaks(name)
        assert row is not None
        need = {"fp64", "fp32", "tf32", "bf16", "fp16", "int8"} | (
            {"fp8"} if "A100" not in name else set())
        assert need <= set(row.tflops), name
        # dense Tensor Core rates above the CUDA-core rates, FP64 below FP32
        assert row.tflops["fp64"] <= row.tflops["fp32"] < row.tflops["tf32"] < row.tflops["bf16"]
    assert {"fp32", "tf32", "bf16", "fp8", "int8"} <= set(gpu_peaks("NVIDIA L4").tflops)
    for row in GPU_PEAKS:
        assert row.hbm_gbps is None or 200 <= row.hbm_gbps <= 5000, row.label
    assert peak_for("NVIDIA A100-SXM4-80GB", "fp8")[0] is None  # Ampere has no FP8


def test_gemm_bytes_are_the_three_matrices():
    m, k, n = 4096, 1024, 2048
    op = CpuOp("aten::mm", 0, 1, input_shapes=[[m, k], [k, n]],
               input_types=["c10::BFloat16", "c10::BFloat16"])
    nbytes, flops = op_traffic(op)
    assert nbytes == 2 * (m * k + k * n + m * n)
    assert flops == 2 * m * k * n
    lin = CpuOp("aten::linear", 0, 1, input_shapes=[[8, 512, k], [n, k], [n]],
                input_types=["float", "float", "float"])
    assert op_traffic(lin)[0] == 4 * (8 * 512 * k + n * k + n + 8 * 512 * n)


def test_conv_and_elementwise_bytes():
    conv = CpuOp("aten::cudnn_convolution", 0, 1,
                 input_shapes=[[256, 64, 56, 56], [128, 64, 3, 3], [], [], [], [], [], [], []],
                 input_types=["c10::Half", "c10::Half"] + [""] * 7,
                 concrete_inputs=["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "", "", ""])
    nbytes, _ = op_traffic(conv)
    out = 256 * 128 * 28 * 28  # stride 2, padding 1
    assert nbytes == 2 * (256 * 64 * 56 * 56 + 128 * 64 * 9 + out)
    add = CpuOp("aten::add", 0, 1, input_shapes=[[32, 1, 768], [32, 512, 768], []],
                input_types=["float", "float", "Scalar"])
    nbytes, flops = op_traffic(add)  # broadcast: the output is [32, 512, 768]
    assert flops == 32 * 512 * 768
    assert nbytes == 4 * (32 * 768 + 2 * 32 * 512 * 768)
    relu_ = CpuOp("aten::relu_", 0, 1, input_shapes=[[1000]], input_types=["c10::BFloat16"])
    assert op_traffic(relu_) == (2 * 1000 * 2, 1000.0)  # read and write in place
    copy = CpuOp("aten::copy_", 0, 1, input_shapes=[[10, 10], [10, 10], []],
                 input_types=["c10::Half", "float", "Scalar"])
    assert op_traffic(copy) == (10 * 10 * (2 + 4), 0.0)
    assert isinstance(op_traffic(CpuOp("aten::cat", 0, 1, input_shapes=[[2, 2]],
                                       input_types=["float"])), str)
    assert op_traffic(CpuOp("aten::mm", 0, 1)) == "op recorded without tensor shapes"
    odd = CpuOp("aten::convolution_backward", 0, 1, input_shapes=[[8, 4, 5, 5], [], []],
                input_types=["float", "float", "float"])  # shapes not as the signature says
    assert isinstance(op_traffic(odd), str)


def test_speed_of_light_takes_the_slower_ceiling():
    # 1 GFLOP and 1 GB in 1 ms on 100 TFLOP/s and 1000 GB/s: memory needs 1 ms, compute 10 us
    sol = speed_of_light(1e9, 1e9, 1000.0, 100.0, 1000.0)
    assert sol["bound"] == "memory" and sol["pct_of_sol"] == pytest.approx(100.0)
    assert sol["intensity"] == 1.0 and sol["ceiling_tflops"] == pytest.approx(1.0)
    sol = speed_of_light(1e12, 1e6, 20_000.0, 100.0, 1000.0)  # 10 ms of compute in 20 ms
    assert sol["bound"] == "compute" and sol["pct_of_sol"] == pytest.approx(50.0)
    assert speed_of_light(0.0, 0.0, 10.0, 100.0, 1000.0) is None


def test_large_half_precision_convs_are_compute_bound_near_the_tensor_core_ceiling():
    rep = h200.report("resnet50_amp")
    math = [p for p in _points(rep) if p["category"] in ("conv", "gemm")
            and p["time_us"] > 1000 and p["precision"] in ("fp16", "bf16")]
    assert len(math) >= 5
    ridge = H200.tflops["fp16"] * 1e3 / H200.hbm_gbps  # FLOP/byte where the roofs meet
    for p in math:
        assert p["ceiling"] in ("fp16", "bf16") and p["ceiling_tflops"] <= 989.5
        if p["intensity"] > ridge:
            assert p["bound"] == "compute" and p["ceiling_tflops"] == 989.5
    top = max(math, key=lambda p: p["time_us"])
    assert top["bound"] == "compute"
    # cuDNN's big implicit GEMMs run at 40-90% of the Tensor Core peak on an H200
    assert 40.0 <= top["pct_of_sol"] <= 100.0
    assert top["achieved_tflops"] == pytest.approx(top["flops"] / top["time_us"] / 1e6, rel=1e-3)


def test_elementwise_kernels_are_memory_bound_below_one_flop_per_byte():
    for case in ("resnet50_amp", "resnet50_fp32"):
        pts = [p for p in _points(h200.report(case)) if p["category"] == "elementwise"]
        assert pts, case
        for p in pts:
            assert p["intensity"] < 1.0 and p["bound"] == "memory", p["name"]
            assert p["ceiling_tflops"] == pytest.approx(p["intensity"] * H200.hbm_gbps / 1e3,
                                                        rel=1e-3)
        # a large ReLU/add streams at a good share of HBM bandwidth
        assert max(p["pct_of_sol"] for p in pts) > 50.0


@pytest.mark.parametrize("case", ["resnet50_amp", "resnet50_amp_cl", "resnet50_tf32",
                                  "resnet50_fp32", "resnet18_batch8", "mlp_eager_small"])
def test_no_point_beats_the_speed_of_light_unexplained(case):
    rep = h200.report(case)
    rf = rep["roofline"]
    over = {o["name"]: o for o in rf["over_ceiling"]}
    for p in rf["points"]:
        assert p["bytes"] > 0 and p["flops"] > 0
        assert p["intensity"] == pytest.approx(p["flops"] / p["bytes"], rel=1e-3)
        if p["pct_of_sol"] > 100.0:
            # only DRAM's bound can be beaten, by data in L2; cuDNN's FFT/Winograd kernels,
            # which beat the direct-convolution count, are not plotted (flops_basis)
            assert p["bound"] == "memory" and "L2" in over[p["name"]]["why"], p["name"]
        assert by_name_basis(rep, p["name"]) != "direct_conv_equivalent"
    assert all(o["pct_of_sol"] > 100.0 for o in over.values())
    by_name = {k["name"]: k for k in rep["kernels"]}
    for p in rf["points"]:  # the Kernels table carries the same figure
        assert by_name[p["name"]]["pct_of_sol"] == pytest.approx(p["pct_of_sol"], abs=0.01)


def by_name_basis(rep: dict, name: str) -> str | None:
    return next(k["flops_basis"] for k in rep["kernels"] if k["name"] == name)


def test_left_out_kernels_are_counted_with_their_reason():
    rep = h200.report("resnet50_amp")
    rf = rep["roofline"]
    kernels = [k for k in rep["kernels"] if k["kind"] == "kernel"]
    assert rf["kernels_total"] == len(kernels)
    left = sum(e["kernels"] for e in rf["left_out"])
    assert rf["kernels_plotted"] + left == rf["kernels_total"]
    reasons = {e["reason"] for e in rf["left_out"]}
    assert "layout or setup kernel inside a GEMM/conv op (not modelled)" in reasons
    # points are the top kernels by time
    times = [p["time_us"] for p in rf["points"]]
    assert times == sorted(times, reverse=True)
    validate_built_report(rep)


def test_math_helper_kernels_carry_no_flops():
    # cuDNN's workspace-init kernel sits under the conv op but does none of its math: it used
    # to take a share of the conv's FLOPs (and read 900% of the CUDA-core peak)
    rep = h200.report("resnet50_amp")
    helpers = [k for k in rep["kernels"] if "init_device_workspace" in k["name"]]
    assert helpers
    assert all(not k["flops"] for k in helpers)


def test_xla_traces_say_they_carry_no_shapes():
    rf = build_report(load_profile(h200.JAX_CONV))["roofline"]
    assert rf["points"] == [] and rf["kernels_total"] > 0
    assert "XLA" in rf["left_out"][0]["reason"]
    assert rf["left_out"][0]["kernels"] == rf["kernels_total"]


def test_unknown_gpu_has_no_ceilings_but_keeps_the_intensity_reasoning_honest():
    prof = h200.profile("mlp_eager_small")
    prof.devices[0].name, old = "Some Future GPU", prof.devices[0].name
    try:
        rep = build_report(prof)
    finally:
        prof.devices[0].name = old
    rf = rep["roofline"]
    assert rf["ceilings"] is None and "not in the peak table" in rf["ceilings_source"]
    assert rf["points"] == []
    assert all(k["pct_of_sol"] is None for k in rep["kernels"])


def test_transformer_attention_and_gemms_have_points():
    rep = build_report(load_profile(h200.TRANSFORMER))
    cats = {p["category"] for p in _points(rep)}
    assert {"gemm", "attention"} <= cats
    for p in _points(rep):
        if p["category"] == "attention":
            # fused attention reads Q, K, V and writes O once: FLOPs / bytes is about the
            # sequence length / 2 (512 tokens here), far above an elementwise kernel's
            assert 50 < p["intensity"] < 1000, p["name"]
        assert p["pct_of_sol"] <= 100.0, p["name"]


def test_kernels_faster_than_their_pipe_lose_their_rate_and_leave_the_roofline():
    # the real AMP ResNet-50 window, with its top direct conv and top GEMM made to carry twice
    # the FLOPs their Tensor Cores can do in their time: a conv that fast can only be a
    # transform algorithm (direct-convolution equivalent), a GEMM's FLOPs are not its work
    prof = h200.profile("resnet50_amp")
    rep = copy.deepcopy(h200.report("resnet50_amp"))
    counted = [k for k in rep["kernels"] if k["flops_basis"] == "counted"]
    conv = next(k for k in counted if k["category"] == "conv")
    gemm = next(k for k in counted  # the classifier's fc layer (cuDNN runs 1x1 convs as GEMMs)
                if k["category"] == "gemm" and not any("conv" in op.lower() for op in k["ops"]))
    for k in (conv, gemm):
        k["flops"] = 2 * pipe_peak_tflops(k, H200) * k["total_us"] * 1e6
    with column_scope():
        linked = stages.assign_to_iterations(
            prof, stages.select_iterations(prof, None, None, None).windows)
        rf = roofline_section(rep, prof, linked.per_window, linked.op_flops)
    assert (conv["flops_basis"], gemm["flops_basis"]) == ("direct_conv_equivalent",
                                                          "over_pipe_peak")
    for k in (conv, gemm):
        assert k["tflops"] is None and k["pct_of_sol"] is None
        assert k["name"] not in {p["name"] for p in rf["points"]}
    reasons = {e["reason"] for e in rf["left_out"]}
    assert any("FFT/Winograd" in r for r in reasons)
    assert any("above the peak of the pipe" in r for r in reasons)
    # untouched kernels keep their rate and their place
    assert sum(k["flops_basis"] == "counted" for k in rep["kernels"]) == len(counted) - 2


def test_pipe_peaks_follow_the_tensor_core_use_and_precision():
    def peak(tc: bool, precision: str) -> float | None:
        return pipe_peak_tflops({"uses_tensor_cores": tc, "precision": precision}, H200)
    assert H200 is not None
    assert peak(False, "fp32") == peak(False, "bf16") == H200.tflops["fp32"]  # CUDA cores
    assert peak(False, "fp64") == H200.tflops["fp64"]
    assert peak(True, "fp32") == H200.tflops["tf32"]  # FP32 data on Tensor Cores is TF32
    assert peak(True, "bf16") == H200.tflops["bf16"]
    # a Tensor Core kernel of a precision the table lacks: no precision beats FP8/INT8
    assert peak(True, "fp4") == max(H200.tflops.values())
    assert pipe_peak_tflops({"uses_tensor_cores": True, "precision": "bf16"}, None) is None
