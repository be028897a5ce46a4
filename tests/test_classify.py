"""Kernel classifier and demangler against a table of real kernel names.

The table (tests/data/kernel_names.tsv) cites where each name comes from: the H200 fixtures,
NVIDIA's own kernel->instruction table, profiler output in public repositories. Its expected
values follow the type fields of each name as docs/tensor-cores.md explains them.
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tb_gpuprof.analysis.classify import (
    CATEGORIES,
    PRECISIONS,
    KernelClass,
    classify_kernel,
    is_tc_eligible_op,
    is_transform_conv_kernel,
)
from tb_gpuprof.analysis.demangle import demangle
from tb_gpuprof.readers import load_profile

DATA = Path(__file__).parent / "data" / "kernel_names.tsv"
FIXTURES = Path(__file__).resolve().parent / "data"  # copies of shared/fixtures
KINETO = FIXTURES / "kineto_transformer_bf16_h200.json.gz"
XPLANE = FIXTURES / "jax_conv_h200.xplane.pb"


def _rows() -> list[tuple[str, str, bool, str, str, bool, str]]:
    rows = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, tc, prec, cat, capable, source = line.split("\t")
        rows.append((name, kind, tc == "1", prec, cat, capable == "1", source))
    return rows


ROWS = _rows()


@pytest.mark.parametrize(("name", "kind", "tc", "precision", "category", "capable", "source"),
                         ROWS, ids=[f"{r[6].split()[0]}:{r[0][:60]}" for r in ROWS])
def test_table(name, kind, tc, precision, category, capable, source):
    assert classify_kernel(name, kind) == KernelClass(tc, precision, category, capable)


def test_table_covers_every_category_and_precision_family():
    assert len(ROWS) >= 80
    assert {r[4] for r in ROWS} == set(CATEGORIES)
    tc_precisions = {r[3] for r in ROWS if r[2]}
    assert {"tf32", "fp16", "bf16", "fp8", "int8", "fp64", "fp32", "unknown"} <= tc_precisions
    assert "fp32" in {r[3] for r in ROWS if not r[2]}
    for arch in ("sm90", "sm80", "ampere", "turing", "volta"):
        assert any(arch in r[0] for r in ROWS), arch


@functools.cache
def _kineto_events() -> list[dict]:
    with gzip.open(KINETO, "rt", encoding="utf-8") as fh:
        return json.load(fh)["traceEvents"]


def _kineto_kernels() -> dict[str, str]:
    events = _kineto_events()
    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    return {e["name"]: kinds[e["cat"]] for e in events if e.get("cat") in kinds}


@pytest.mark.skipif(not KINETO.exists(), reason="H200 fixture not present")
def test_every_kineto_fixture_kernel_is_in_the_table():
    table = {r[0] for r in ROWS if r[6].startswith("fx-kineto")}
    fixture = _kineto_kernels()
    assert set(fixture) - table == set()
    assert table - set(fixture) == set()  # and the table quotes them verbatim


@pytest.mark.skipif(not XPLANE.exists(), reason="H200 fixture not present")
def test_xplane_fixture_names_are_verbatim():
    raw = XPLANE.read_bytes()
    names = [r[0] for r in ROWS if r[6].startswith("fx-xplane")]
    assert len(names) >= 10
    for name in names:
        assert name.encode() in raw, name


# The 2021 substring list torch-tb-profiler (tensor_cores_parser.py) and PyProf (tc.py) use.
OLD_ALLOWLIST = ("h884", "s884", "h1688", "s1688", "hmma", "i8816", "16816",
                 "dgrad_1x1_stride_2x2", "first_layer_wgrad_kernel", "conv1x1", "conv2d_c1_k1",
                 "direct_group", "xmma_implicit_gemm", "xmma_sparse_conv",
                 "xmma_warp_specialized_implicit_gemm", "xmma_gemm", "xmma_sparse_gemm", "c1688")


def _old_says_tc(name: str) -> bool:
    return any(p in name for p in OLD_ALLOWLIST)


def test_old_substring_list_is_wrong_where_docs_say():
    wrong = {r[0] for r in ROWS if r[1] == "kernel" and _old_says_tc(r[0]) != r[2]}
    # FP32 SIMT xmma kernels counted as Tensor Core ...
    assert "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_" \
        "aligna4_alignc4_execute_kernel__5x_cublas" in wrong
    # ... and Hopper cuBLASLt, cuDNN conv and attention Tensor Core kernels missed.
    assert "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT" in wrong
    assert any(n.startswith("sm90_xmma_fprop_implicit_gemm") for n in wrong)
    assert any(n.startswith("cudnn_generated_fort_native_sdpa_sm90") for n in wrong)
    assert len(wrong) >= 20


@pytest.mark.skipif(not KINETO.exists(), reason="H200 fixture not present")
def test_fixture_tensor_core_time_share_vs_old_list():
    """On the bf16 transformer ~40% of kernel time is Tensor Core work; the old list sees none."""
    kernels = [e for e in _kineto_events() if e.get("cat") == "kernel"]
    total = sum(e["dur"] for e in kernels)
    ours = sum(e["dur"] for e in kernels if classify_kernel(e["name"]).uses_tensor_cores)
    old = sum(e["dur"] for e in kernels if _old_says_tc(e["name"]))
    # The trace's only MMA kernels: cuBLASLt nvjet GEMMs and cuDNN flash attention.
    mma = sum(e["dur"] for e in kernels
              if e["name"].startswith(("nvjet_", "cudnn_generated_fort_native_sdpa")))
    assert old == 0
    assert ours == pytest.approx(mma)
    assert ours / total > 0.3


@pytest.mark.parametrize("name", [
    "", " ", "<img src=x onerror=alert(1)>", "ядро_卷积_🚀", "\x00\xff", "a" * 1_000_000,
    "_Z", "_ZN", "_ZN" + "I" * 5000, "_ZN3foo" + "IS_" * 3000 + "E", "_Z" + "P" * 50000 + "v",
    "nvjet_", "sm90_xmma_", "xmma_gemm", "_Z4litsIaLj3ELln5E", "Memcpy", "nccl\u202e",
])
def test_weird_names_never_raise(name):
    for kind in ("kernel", "memcpy", "memset", "bogus"):
        k = classify_kernel(name, kind)
        assert isinstance(k, KernelClass)
        assert k.category in CATEGORIES and k.precision in PRECISIONS
    assert isinstance(demangle(name), str)
    assert isinstance(is_tc_eligible_op(name), bool)


def test_non_string_inputs_never_raise():
    for bad in (None, 3, b"nvjet_tst_1", ["x"], 1.5):
        assert classify_kernel(bad).category in CATEGORIES  # type: ignore[arg-type]
        assert demangle(bad) == bad  # type: ignore[arg-type]
        assert is_tc_eligible_op(bad) is False  # type: ignore[arg-type]


def test_kind_decides_memory_activities():
    nvjet = "nvjet_sm90_tst_128x128_64x6_2x4_h_bz_NTT"
    assert classify_kernel(nvjet, "memcpy").category == "memcpy"
    assert classify_kernel("whatever", "memset") == KernelClass(False, "unknown", "memset", False)


def test_classification_is_cached():
    name = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_" \
           "execute_segment_k_off_kernel__5x_cublas"
    assert classify_kernel(name) is classify_kernel(name)


# ---- demangler ---------------------------------------------------------------------------------
# Itanium symbols g++ produces for templates mirroring PyTorch/cuDNN/FlashAttention kernels
# (namespaces, anonymous namespaces, lambdas in template args, packs, enum and integer literals),
# then libstdc++ instantiations for substitution-heavy cases, then real kernel symbols.
MANGLED = [
    "_Z4litsIaLj3ELln5ELy7EEvPT_PPKS0_RVS0_PFS0_icEOS0_",
    "_ZN1S2tmISt5arrayIiLm2EEEEvT_S3_",
    "_ZN1S2tmIsEEvT_S1_",
    "_ZN2at6native12_GLOBAL__N_125multi_tensor_apply_kernelINS1_18TensorListMetadataIdLi2EEENS0_"
    "20FusedAdamMathFunctorIfLi4ELNS0_9ADAM_MODEE1ELb0EEEJjPKfEEEvT_T0_DpT1_",
    "_ZN2at6native12_GLOBAL__N_125multi_tensor_apply_kernelINS1_18TensorListMetadataIfLi4EEENS1_"
    "21BinaryOpScalarFunctorIfLi1ELi1ELi0EEEJflEEEvT_T0_DpT1_",
    "_ZN2at6native15gpu_kernel_implIZNS0_3runEvEUlN3c104HalfEE_EEvRNS_18TensorIteratorBaseERKT_",
    "_ZN2at6native29vectorized_elementwise_kernelILi4EZNS0_15gpu_kernel_implINS0_15CUDAFunctor_"
    "addIN3c108BFloat16EEEEEvRNS_18TensorIteratorBaseERKT_EUliE_St5arrayIPcLm3EEEEviT0_T1_",
    "_ZN2at6native29vectorized_elementwise_kernelILi4EZNS0_15gpu_kernel_implIZNS0_3runEvEUlN3c10"
    "4HalfEE_EEvRNS_18TensorIteratorBaseERKT_EUliE_St5arrayIPcLm3EEEEviT0_T1_",
    "_ZN5cudnn3ops16nchwToNhwcKernelIN3c104HalfES3_fLb0ELb1ELNS_21cudnnKernelDataType_tE0EEEvNS_"
    "18nchw2nhwc_params_tIT1_EEPKT_PT0_",
    "_ZN5flash16flash_fwd_kernelINS_23Flash_fwd_kernel_traitsILi128ELi64EN3c108BFloat16EEELb0ELb1"
    "EEEvNS_16Flash_fwd_paramsE",
    "_ZNK1S1mEv",
    "_ZSt3minImERKT_S2_S2_",
    "_ZZ3usevENKUlfdE0_clEfd",
    "_ZNSt12_Vector_baseI1PSaIS0_EEC1Ev",
    "_ZSt11__addressofIKZ3usevEUlfdE0_EPT_RS2_",
    "_ZNSt14_Sp_ebo_helperILi0ESaIvELb1EEC5ERKS0_",
    "_ZNSt12_Vector_baseI1PSaIS0_EE12_Vector_implD1Ev",
    "_ZN9__gnu_cxx17__normal_iteratorIP1PSt6vectorIS1_SaIS1_EEEmmEv",
    "_ZSt7forwardISt5tupleIJEEEOT_RNSt16remove_referenceIS2_E4typeE",
    "_ZSt29_Rb_tree_insert_and_rebalancebPSt18_Rb_tree_node_baseS0_RS_",
    "_ZNK9__gnu_cxx17__normal_iteratorIP1PSt6vectorIS1_SaIS1_EEE4baseEv",
    "_ZNSt10_Head_baseILm0EONSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEELb0EEC2IS5_EEOT_",
    "_ZNSt11_Tuple_implILm2EJNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEEEC2IRA2_KcEEOT_",
    "_ZN9__gnu_cxxmiIP1PSt6vectorIS1_SaIS1_EEEENS_17__normal_iteratorIT_T0_E15difference_typeERKS9_"
    "SC_",
    "_ZNSt11_Tuple_implILm1EJfNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEEEC2IfJRA2_KcEvEE"
    "OT_DpOT0_",
    "_ZNKSt13_Rb_tree_nodeISt4pairIKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESt6vectorI1"
    "PSaIS9_EEEE9_M_valptrEv",
    "_ZSt25__unguarded_linear_insertIN9__gnu_cxx17__normal_iteratorIP1PSt6vectorIS2_SaIS2_EEEENS0_5"
    "__ops14_Val_comp_iterIZ3usevEUlRKS2_SB_E_EEEvT_T0_",
    "_ZNSt4pairIKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESt6vectorI1PSaIS8_EEEC1IJOS5_"
    "EJEEESt21piecewise_construct_tSt5tupleIJDpT_EESF_IJDpT0_EE",
    "_ZN5cudnn6detail25bn_fw_tr_1C11_kernel_NCHWIffLi512ELb1ELi1EEEv17cudnnTensorStructPKT_S2_PS3_"
    "PKT0_S9_S7_S7_PS7_SA_SA_SA_S7_S7_",
    "_ZN7cutlass6KernelI42cutlass_80_simt_sgemm_128x32_8x5_nn_align1EEvNT_6ParamsE",
    "_Z23implicit_convolve_sgemmIffLi1024ELi5ELi5ELi3ELi3ELi3ELi1ELb0ELb1ELb1EEviiiPKT_iPT0_S2_18"
    "kernel_conv_paramsyiffiPKS3_S7_bii",
    "_ZN5cudnn3cnn17wgrad_alg0_engineIfLi512ELi6ELi5ELi3ELi3ELi3ELb0ELi512EEEviiiPKT_iPS2_S4_18"
    "kernel_grad_paramsyifiiii",
]


def test_demangle_known_kernels():
    assert demangle(MANGLED[-3]) == \
        "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>" \
        "(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)"
    assert demangle(MANGLED[9]) == \
        "void flash::flash_fwd_kernel<flash::Flash_fwd_kernel_traits<128, 64, c10::BFloat16>, " \
        "false, true>(flash::Flash_fwd_params)"
    assert demangle(MANGLED[8]).startswith(
        "void cudnn::ops::nchwToNhwcKernel<c10::Half, c10::Half, float, false, true, "
        "(cudnn::cudnnKernelDataType_t)0>(cudnn::nchw2nhwc_params_t<float>, c10::Half const*")
    assert "{lambda(int)#1}, std::array<char*, 3ul> >(int, " in demangle(MANGLED[6])
    assert demangle("_ZNK1S1mEv") == "S::m() const"
    assert demangle("_Z3foov.cold") == "foo() [clone .cold]"


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt not installed")
def test_demangle_matches_cxxfilt():
    out = subprocess.run(["c++filt"], input="\n".join(MANGLED), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert [demangle(m) for m in MANGLED] == out


def test_demangle_leaves_other_names_alone():
    for name in ("nvjet_sm90_tst_128x128_64x6_2x4_h_bz_NTT", "void at::native::f<int>(int)",
                 "_ZN3foo", "_ZZZZ", "_Z1fIXadL_Z1gvEEEvv"):
        assert demangle(name) == name


def test_mangled_and_demangled_forms_classify_alike():
    for mangled in MANGLED[-4:]:
        assert classify_kernel(mangled) == classify_kernel(demangle(mangled))


# ---- framework ops ---------------------------------------------------------------------------
@pytest.mark.parametrize("op", [
    "aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
    "aten::convolution_backward", "aten::conv_transpose2d", "aten::mm", "aten::bmm",
    "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::einsum",
    "aten::_scaled_mm", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_cudnn_attention_forward",
    "aten::lstm", "aten::_cudnn_rnn", "aten::gru",
    "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D", "MatMul",
    "BatchMatMulV2", "_FusedMatMul", "_FusedConv2D", "XlaDot", "XlaDotV2", "CudnnRNNV3",
    "model/conv2d/Conv2D", "gradient_tape/model/dense/MatMul_1:MatMul",
    "convolution", "convolution.3", "dot.5", "cudnn-conv-bias-activation.1",
    "custom-call.2:__cublas$gemm", "gemm_fusion_dot.1", "jit(<lambda>)/dot_general",
    "jit(<lambda>)/conv_general_dilated",
])
def test_tc_eligible_ops(op):
    assert is_tc_eligible_op(op)


@pytest.mark.parametrize("op", [
    "aten::add", "aten::relu", "aten::layer_norm", "aten::softmax", "aten::copy_",
    "aten::_conv_depthwise2d", "aten::dot", "aten::mv", "aten::addmv", "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropFilter", "Relu", "FusedBatchNormV3", "convert.3",
    "jit(<lambda>)/convert_element_type", "broadcast.2", "reduce_sum.3",
    "Optimizer.step#AdamW.step", "", "mmap", "comm_dot_product",
])
def test_not_tc_eligible_ops(op):
    assert not is_tc_eligible_op(op)


# Kernels of FFT and Winograd convolutions, as the H200 FP32 ResNet-50 trace (cuDNN 9) and the
# table's Volta/Maxwell rows name them: their op's FLOPs are a direct-convolution equivalent.
TRANSFORM_CONV = [
    "void fft2d_r2c_32x32<float, false, 0u, false>(float2*, float const*, int, int, int, int, "
    "int, int, int, int, int, cudnn::reduced_divisor, bool, int2, int, int)",
    "void fft2d_c2r_16x16<float, false>(float*, float2*, int, int, int, int, int, int, int, "
    "int, int, int, float, float, int, cudnnActivationStruct, float*, float*)",
    "sm80_xmma_gemm_cf32cf32_f32f32_cf32_tn_n_tilesize64x64x8_stage3_warpsize2x2x1_ffma_"
    "aligna8_alignc8_execute_kernel__5x_cublas",
    "void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>(cudnn::winograd_"
    "nonfused::WinogradDataParams<float, float>)",
    "volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "volta_gcgemm_32x32_nt",
]


@pytest.mark.parametrize("name", TRANSFORM_CONV)
def test_transform_convolution_kernels_are_recognised(name):
    assert is_transform_conv_kernel(name)


def test_direct_convolutions_and_gemms_are_not_transforms():
    # every math kernel of the mixed-precision ResNet-50 (implicit GEMM convolutions, nvjet
    # GEMMs) and of the bf16 transformer does the FLOPs its op counts
    direct = {a.name for case in ("h200/resnet50_amp_cl.json.gz",
                                  "kineto_transformer_bf16_h200.json.gz")
              for a in load_profile(FIXTURES / case).gpu
              if classify_kernel(a.name, a.kind).category in ("conv", "gemm", "attention")}
    assert len(direct) > 10
    assert [n for n in direct if is_transform_conv_kernel(n)] == []
    assert not is_transform_conv_kernel("ampere_sgemm_128x64_nn")
    assert not is_transform_conv_kernel(None)  # type: ignore[arg-type]
