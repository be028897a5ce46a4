"""Kernel classification: Tensor Core use, math precision and category, read from kernel names.

All rules live here; ``docs/tensor-cores.md`` explains them with real names. The idea: library
kernel names carry *type fields* (``f32f32_tf32f32_f32``, ``bf16_s16816gemm``, ``nvjet_tst``,
``_ffma_``, ``wgmma_f16``) and those decide, not a list of substrings. Each family parser below
reads its own fields; only when no family matches do generic tokens (``wgmma``, ``hmma``,
``tensorop``...) and then category keywords apply.

``classify_kernel`` is cached: a million-kernel trace has a few hundred distinct names.
Neither function raises, whatever the input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .demangle import demangle

__all__ = ["CATEGORIES", "PRECISIONS", "KernelClass", "classify_kernel", "is_math_helper",
           "is_tc_eligible_op", "is_transform_conv_kernel"]

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4", "int8", "int4", "fp64", "unknown")
CATEGORIES = ("gemm", "conv", "attention", "norm", "elementwise", "reduction", "layout",
              "memcpy", "memset", "communication", "optimizer", "other")
UNKNOWN = "unknown"
_MAX_NAME = 8192  # classification never needs more; bounds the cache's memory


@dataclass(frozen=True, slots=True)
class KernelClass:
    uses_tensor_cores: bool
    precision: str  # one of PRECISIONS: TC kernels: input type; others: data type or "unknown"
    category: str  # one of CATEGORIES
    tc_capable: bool  # GEMM/conv/attention math, whether or not it ran on Tensor Cores


def _k(tc: bool, prec: str, cat: str, capable: bool | None = None) -> KernelClass:
    return KernelClass(tc, prec, cat, tc if capable is None else (tc or capable))


_OTHER = KernelClass(False, UNKNOWN, "other", False)

# --------------------------------------------------------------------------------------------
# Data types named inside names. Lower-cased text; "_" counts as a separator (nccl ..._float).
_B, _E = r"(?<![a-z0-9])", r"(?![a-z0-9])"
_DTYPES = (  # first match wins: narrow types before the fp32 scalars mixed kernels also carry
    ("fp8", re.compile(r"e4m3|e5m2|fp8|float8|" + _B + r"f8" + _E)),
    ("fp4", re.compile(r"e2m1|" + _B + r"fp4" + _E)),
    ("bf16", re.compile(r"bfloat16|bf16")),
    ("fp16", re.compile(r"c10::half|__half|half_t|" + _B + r"(?:half|fp16|f16)" + _E)),
    ("tf32", re.compile(_B + r"tf32")),
    ("int8", re.compile(_B + r"(?:int8|s8|i8|u8)" + _E + r"|signed char|int8_t")),
    ("fp32", re.compile(_B + r"(?:float|fp32|f32)" + _E)),
    ("fp64", re.compile(_B + r"(?:double|fp64|f64)" + _E)),
)


def _dtype(low: str) -> str:
    for prec, rx in _DTYPES:
        if rx.search(low):
            return prec
    return UNKNOWN


# Compact type atoms of cuBLAS/cuDNN xmma names (f32f32_tf32f32_f32) and what each means.
_ATOM = {"tf32": "tf32", "bf16": "bf16", "f16": "fp16", "fp16": "fp16", "f32": "fp32",
         "fp32": "fp32", "f64": "fp64", "i8": "int8", "s8": "int8", "u8": "int8",
         "i32": "int8", "e4m3": "fp8", "e5m2": "fp8", "f8": "fp8", "i4": "int4", "s4": "int4",
         "u4": "int4"}
_ATOM_RX = "tf32|bf16|fp16|fp32|f16|f32|f64|i8|s8|u8|i32|e4m3|e5m2|f8|i4|s4|u4"
_TYPE_TOKEN = re.compile(rf"(?:{_ATOM_RX})+")
_ATOM_SPLIT = re.compile(_ATOM_RX)

# --------------------------------------------------------------------------------------------
# Family 1: cuBLASLt nvjet (CUDA 12.x+, Hopper/Blackwell). nvjet_[smXX_]<types>_<tiles>...
# <types> is [AB][compute][CD] (tst, hsh, tss) or [A][B][C][compute][D] (qqtst, qqhsh).
# The A letter is the input: h fp16, t bf16, s fp32 (tf32 when the name says so), q fp8 e4m3,
# o fp4 e2m1. The "_h_"/"_v_" token later in the name is a schedule flag, not precision.
_NVJET = re.compile(r"nvjet_(?:sm\d+[a-z]?_)?([a-z]+)")
_NVJET_A = {"h": "fp16", "t": "bf16", "q": "fp8", "e": "fp8", "o": "fp4", "i": "int8",
            "d": "fp64"}


def _nvjet(low: str) -> KernelClass | None:
    m = _NVJET.search(low)
    if not m:
        return None
    letters = m.group(1)
    prec = UNKNOWN
    if len(letters) in (3, 5):
        a = letters[0]
        if a == "s":
            prec = "tf32" if "tf32" in low else UNKNOWN
        else:
            prec = _NVJET_A.get(a, UNKNOWN)
    return _k(True, prec, "gemm")


# Family 2: cuBLAS/cuDNN xmma kernels: smXX_xmma_<op>_<A B>_<math acc>_<C>_..._<instruction>
_SIMT_INSTR = re.compile(_B + r"(?:ffma|hfma2?|dfma|simt)" + _E)
_TC_INSTR = re.compile(r"tensor\d+x\d+x\d+|sptensor|[hiqd]?gmma|hmma|imma|dmma|warpgroup")
_CONV_WORDS = re.compile(r"fprop|dgrad|wgrad|implicit_gemm|conv|cudnn")


def _xmma(low: str) -> KernelClass | None:
    idx = low.find("xmma_")
    if idx < 0 or "xmma_cudnn::" in low:
        return None
    rest = low[idx + 5:]
    tokens = re.split(r"[_\s(<>,:]+", rest)
    types = [t for t in tokens[:12] if _TYPE_TOKEN.fullmatch(t)]
    if not types:
        return None
    math = _ATOM_SPLIT.findall(types[1] if len(types) >= 2 else types[0])[0]
    prec = _ATOM[math]
    if "fmha" in rest or "attention" in rest:
        cat = "attention"
    elif rest.startswith("gemm") or rest.startswith("sparse_gemm"):
        cat = "gemm"
    else:
        cat = "conv" if _CONV_WORDS.search(rest) else "gemm"
    if _SIMT_INSTR.search(low):
        tc = False
    elif _TC_INSTR.search(low):
        tc = True
    else:
        tc = prec not in ("fp32", "fp64")
    return _k(tc, prec, cat, True)


# Family 3: Volta/Turing/Ampere cuBLAS, cuDNN and CUTLASS 2.x names with an MMA shape:
# [<input>_]<acc><shape><op>[_<input>] e.g. volta_h884gemm, turing_fp16_s1688gemm_fp16,
# ampere_bf16_s16816gemm_bf16, cutlass_80_tensorop_s1688gemm (TF32), *_i8816gemm (int8).
_MMA_SHAPE = re.compile(
    r"(?:(?P<pre>fp16|bf16|tf32|f16|f32|s8|i8|int8|e4m3|fp8)_)?"
    r"(?P<acc>[hsicdz])(?P<shape>884|1688|16816|16832|8816|16864|161616|3288|32816|8832|"
    r"168256)(?P<op>gemm|cudnn|fprop|dgrad|wgrad|conv|[a-z]*gemm)"
    r"(?P<post>(?:_[a-z0-9]+){0,3})"
)
_ARCH_PRE80 = re.compile(r"volta|turing|sm_?7\d|cutlass_7\d|xavier")


def _mma_shape(low: str) -> KernelClass | None:
    m = _MMA_SHAPE.search(low)
    if not m:
        return None
    acc, shape, op = m.group("acc"), m.group("shape"), m.group("op")
    typed = m.group("pre") or next(
        (t for t in m.group("post").split("_") if t and _TYPE_TOKEN.fullmatch(t)), None
    )
    if typed:
        prec = _ATOM.get(typed, _dtype(typed))
        if prec == "fp32":  # an fp32-typed tensor-op kernel computes in TF32
            prec = "tf32"
    elif acc == "h":
        prec = "fp16"  # fp16 accumulate implies fp16 inputs
    elif acc == "i":
        prec = "int8"
    elif acc in ("d", "z"):
        prec = "fp64"
    elif shape == "884":
        prec = "fp16"  # Volta MMA takes fp16 only
    elif shape == "1688":  # fp16 on Turing; on Ampere+ an untyped s1688 is TF32
        prec = "fp16" if _ARCH_PRE80.search(low) else "tf32"
    else:
        prec = UNKNOWN  # m16n8k16 exists for fp16 and bf16 alike
    cat = "conv" if op in ("cudnn", "fprop", "dgrad", "wgrad", "conv") else "gemm"
    return _k(True, prec, cat, True)


# Family 4: CUTLASS 3 / CuTe MMA atoms in template arguments: SM90_64x128x16_F32BF16BF16_SS.
_CUTE_ATOM = re.compile(r"sm(?:70|75|80|89|90a?|100a?|120a?)_\d+x\d+x\d+_([a-z0-9]+)")
_CUTE_TYPES = re.compile(r"tf32|bf16|f16|f32|f64|s8|u8|s32|s4|u4|e4m3|e5m2")
_CUTE_A = {"tf32": "tf32", "bf16": "bf16", "f16": "fp16", "f32": "tf32", "f64": "fp64",
           "s8": "int8", "u8": "int8", "s4": "int4", "u4": "int4", "e4m3": "fp8", "e5m2": "fp8"}

# Family 5: SIMT library kernels: arch-prefixed cuBLAS/cuDNN (volta_sgemm, ampere_scudnn_...),
# CUTLASS simt, cuBLAS gemv/small-gemm kernels, cuDNN direct/implicit/FFT/Winograd conv engines.
_ARCH_SIMT = re.compile(
    r"(?:maxwell|pascal|volta|turing|ampere|ada|hopper|sm\d{2,3})_(?:fp16_)?"
    r"(gc|[sdhcz])(gemm|gemv|cudnn)"
)
_CUTLASS_SIMT = re.compile(r"simt_([sdhcz])(gemm|fprop|dgrad|wgrad|conv)")
_SIMT_PREC = {"s": "fp32", "c": "fp32", "gc": "fp32", "d": "fp64", "z": "fp64", "h": "fp16"}
_CUDNN_SIMT_CONV = re.compile(
    r"convolve_[a-z]*gemm|convolve_hhgemm|conv2d_grouped_direct|dgrad_engine|dgrad2d|"
    r"[dw]grad_alg\d|winograd|fft2d_[rc]2[rc]|fft_[rc]2[rc]_conv|conv_kernel|"
    r"(?<![a-z])(?:scudnn|hcudnn|dcudnn)"
)
_DEPTHWISE = re.compile(r"depthwise")
_GEMV = re.compile(r"gemv|gemmsn_|gemmk1|gemm_?small|dot_kernel")
_GEMM_HELPER = re.compile(
    r"splitkreduce|split_k_reduce|reduce_splitk|gemm_?epilogue_only|init_device_workspace")

# Family 6: attention.
_ATTN = re.compile(r"flash|fmha|sdpa|attention|attn|(?<![a-z])mha(?![a-z])")
_ATTN_HELPER = re.compile(
    r"dot_do_o|convert_dq|splitkv_combine|fwd_combine|clear_dkvaccum|flash_bwd_convert"
)
_MEMEFF = re.compile(r"fmha_cutlass[fb]_(f16|bf16|f32)[a-z0-9_]{0,80}?_sm(\d+)")
_FLASH_TC = re.compile(r"flash|fmha|sdpa|attn_fwd|attn_bwd|flashattn")

# Generic Tensor Core evidence, used when no family parser above recognised the name.
_TC_GENERIC = re.compile(
    r"wgmma|warpgroup|(?<![a-z])[hiqd]?gmma|hmma|imma|dmma|tensorop|tensor_op|tensorcore|"
    r"tensor_core|mma_sync|umma|tcgen05|(?<![a-z])wmma|xmma_cudnn"
)
# Compiler-generated GEMM/conv kernels whose names carry no types: Triton (Inductor templates,
# XLA's Triton GEMM fusions), XLA cuBLAS/CUTLASS fusions. Triton/XLA emit MMA for dots whose
# dtypes allow it, so these count as Tensor Core with precision left to the op's dtypes.
_COMPILED_GEMM = re.compile(
    r"triton_tem_fused_[a-z0-9_]{0,200}?(?:mm|gemm|conv|matmul)|gemm_fusion_dot|triton_gemm|"
    r"__triton_gemm|cutlass_gemm|triton_tem_fused"
)

# --------------------------------------------------------------------------------------------
# Categories of everything else.
_COMM = re.compile(
    r"nccl|rccl|nvshmem|cross_device_reduce|userbuffers|(?<![a-z])all_?reduce|all_?gather|"
    r"reduce_?scatter|all_?to_?all|sendrecv|(?<![a-z])broadcast_kernel|one_shot_all|"
    r"two_shot_all|custom_?all_?reduce"
)
_LAYOUT = re.compile(
    r"nchwtonhwc|nhwctonchw|nchwtofoldednhwc|foldednhwctonchw|nhwctofoldednhwc|"
    r"nchw2nhwc|nhwc2nchw|converttensor|transpose|swapdimension\d+and\d+|shuffleintensor3|"
    r"addpaddingkernel|removepadding"
)
_NORM = re.compile(
    r"layer_?norm|batch_?norm|group_?norm|rms_?norm|instance_?norm|(?<![a-z])bn_(?:fw|bw)|"
    r"(?<![a-z])ln_(?:fwd|bwd)|gammabeta|rowwisemoments|computefusedparams|"
    r"computeinternalgradients|normalization|fusedbatchnorm|norm_(?:fwd|bwd)_kernel"
)
_OPTIM = re.compile(
    r"multi_tensor_apply|adam|(?<![a-z])sgd|(?<![a-z])lamb(?![a-z])|adagrad|rmsprop|"
    r"(?<![a-z])lion(?![a-z])|fusedoptimizer|fused_optimizer|applygradientdescent|"
    r"applymomentum|resourceapply|momentum_kernel|ema_update"
)
_REDUCE = re.compile(
    r"reduce|reduction|softmax|logsumexp|argmax|argmin|topk|cumsum|cumprod|(?<![a-z])scan|"
    r"nll_loss|cross_?entropy|triton_red_|triton_per_|sum_kernel|mean_kernel|welford|"
    r"norm_kernel|histogram|bincount|unique"
)
_ELEMENTWISE = re.compile(
    r"elementwise|vectorized|unrolled|triton_poi_|(?<![a-z])loop_[a-z0-9_]{0,80}?fusion|(?<![a-z])fusion|"
    r"wrapped_|copy|fill|cast|convert|dropout|index|gather|scatter|catarray|concat|eigen::|"
    r"pointwise|embedding|where|masked|clamp|relu|gelu|silu|sigmoid|tanh|activation|"
    r"bias|add|mul|(?<![a-z])pad|slice|broadcast|select|compare|rand|bernoulli"
)
_MEM_NAME = re.compile(r"\s*(memcpy|memset)\b", re.IGNORECASE)


def _classify_library(low: str) -> KernelClass | None:
    """Kernels whose Tensor Core use and precision the name spells out."""
    for parser in (_nvjet, _xmma, _mma_shape):
        got = parser(low)
        if got is not None:
            return got
    m = _CUTE_ATOM.search(low)
    if m:
        atoms = _CUTE_TYPES.findall(m.group(1))
        prec = _CUTE_A.get(atoms[1], UNKNOWN) if len(atoms) >= 2 else UNKNOWN
        cat = "attention" if _ATTN.search(low) else "conv" if "conv" in low else "gemm"
        return _k(True, prec, cat, True)
    m = _ARCH_SIMT.search(low) or _CUTLASS_SIMT.search(low)
    if m:
        cat = "conv" if m.group(2) in ("cudnn", "fprop", "dgrad", "wgrad", "conv") else "gemm"
        return _k(False, _SIMT_PREC[m.group(1)], cat, True)
    return None


def _classify_attention(low: str) -> KernelClass | None:
    if _ATTN_HELPER.search(low):  # pre/post-processing kernels of attention: not MMA work
        return _k(False, _dtype(low), "attention", False)
    if not _ATTN.search(low):
        return None
    m = _MEMEFF.search(low)
    if m:  # PyTorch/xformers memory-efficient attention (CUTLASS): TC from sm70 (f16/bf16),
        dtype, sm = m.group(1), int(m.group(2))  # f32 via 3xTF32 (OpMultiplyAddFastF32) sm80+
        prec = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}[dtype]
        return _k(sm >= (80 if dtype == "f32" else 70), prec, "attention", True)
    if "cudnn_generated" in low or "sdpa" in low:
        # cuDNN's fort_native SDPA names say "f16" for fp16 and bf16 alike (the bf16 fixture
        # runs ..._wgmma_f16_...), so only fp8 is certain from the name.
        prec = "fp8" if re.search(r"fp8|e4m3|e5m2", low) else UNKNOWN
        return _k(True, prec, "attention", True)
    prec = _dtype(low)
    tc = bool(_FLASH_TC.search(low) or _TC_GENERIC.search(low))
    if tc and prec == "fp32":
        prec = UNKNOWN  # fp32 appears as softmax scale / accumulator in flash templates
    return _k(tc, prec, "attention", True)


def _classify_text(low: str) -> KernelClass:
    if _COMM.search(low):
        return _k(False, _dtype(low), "communication", False)
    got = _classify_attention(low) or _classify_library(low)
    if got is not None:
        return got
    if _GEMM_HELPER.search(low):
        return _k(False, _dtype(low), "gemm", False)
    if _DEPTHWISE.search(low) and ("conv" in low or "depthwise" in low):
        return _k(False, _dtype(low), "conv", False)
    if _CUDNN_SIMT_CONV.search(low):
        prec = _dtype(low)
        return _k(False, "fp32" if prec == UNKNOWN and "sgemm" in low else prec, "conv", True)
    if _TC_GENERIC.search(low):
        prec = _dtype(low)
        if "hmma" in low and prec in (UNKNOWN, "fp32"):
            prec = "fp16"  # xmma_cudnn Volta_hmma_fp32_traits: fp16 in, fp32 accumulate
        elif prec == "fp32":
            prec = "tf32"
        cat = "conv" if _CONV_WORDS.search(low) and "gemm" not in low.split("implicit")[0] \
            else "gemm"
        return _k(True, prec, cat, True)
    if _COMPILED_GEMM.search(low):
        cat = "conv" if "conv" in low else "gemm"
        return _k(True, UNKNOWN, cat, True)
    if _GEMV.search(low) or re.search(r"gemm|matmul", low):
        return _k(False, _dtype(low), "gemm", True)
    if _LAYOUT.search(low):
        return _k(False, _dtype(low), "layout", False)
    if _NORM.search(low):
        return _k(False, _dtype(low), "norm", False)
    if _OPTIM.search(low):
        return _k(False, _dtype(low), "optimizer", False)
    if _REDUCE.search(low):
        return _k(False, _dtype(low), "reduction", False)
    if _ELEMENTWISE.search(low):
        return _k(False, _dtype(low), "elementwise", False)
    return _k(False, _dtype(low), "other", False)


@lru_cache(maxsize=65536)
def _classify_cached(name: str, kind: str) -> KernelClass:
    if kind == "memcpy" or kind == "memset":
        return KernelClass(False, UNKNOWN, kind, False)
    m = _MEM_NAME.match(name)
    if m:
        return KernelClass(False, UNKNOWN, m.group(1).lower(), False)
    text = demangle(name) if name.startswith("_Z") else name
    return _classify_text(text.lower())


def classify_kernel(name: str, kind: str = "kernel") -> KernelClass:
    """Classify one GPU activity by its name; ``kind`` is "kernel", "memcpy" or "memset"."""
    try:
        if not isinstance(name, str):
            name = "" if name is None else str(name)
        if not isinstance(kind, str):
            kind = "kernel"
        return _classify_cached(name[:_MAX_NAME], kind)
    except Exception:  # a classifier bug must not take a report down with it
        return _OTHER


# --------------------------------------------------------------------------------------------
# Framework ops whose work Tensor Cores can do (DLProf's "TC eligible").
_NOT_TC_OP = re.compile(r"depthwise|aten::v?dot(?![a-z0-9_])|aten::mv(?![a-z0-9_])|addmv")
# Whole tokens ("_" is part of a token here: aten::_convolution, _FusedMatMul) ...
_TC_OP_TOKEN = re.compile(
    r"(?<![a-z0-9])(?:"
    r"_?(?:cudnn_|miopen_|mkldnn_)?conv(?:olution)?(?:_?transpose)?(?:[123]d)?"
    r"(?:_backward|backward\d*|_relu|_add)?"
    r"|conv[123]d(?:backprop(?:input|filter)(?:v2)?)?|_?fusedconv2d|xlaconv(?:v2)?"
    r"|conv_general_dilated|(?<!_)mm(?!_)|bmm|addmm|baddbmm|addbmm|_?int_mm|_scaled_mm"
    r"|_scaled_grouped_mm|_addmm_activation|linear|einsum|tensordot|chain_matmul|multi_dot"
    r"|batchmatmul(?:v[23])?|_?fusedmatmul|xladot(?:v2)?|dot_general|(?<!_)dot(?!_)|sdpa|mha"
    r"|gru(?:cell)?|(?:mm|bmm|addmm|baddbmm|convolution|linear)backward\d*"
    r")(?![a-z0-9])"
)
# ... and substrings that only occur in names of such ops (plain search: linear time).
_TC_OP_SUBSTR = re.compile(
    r"attention|lstm|rnn|gemm|matmul|cublas|cudnn-conv|convolution|__cudnn\$conv|"
    r"__cudnn\$fmha"
)


@lru_cache(maxsize=16384)
def _tc_eligible_cached(low: str) -> bool:
    if _NOT_TC_OP.search(low):
        return False
    return bool(_TC_OP_TOKEN.search(low) or _TC_OP_SUBSTR.search(low))


@lru_cache(maxsize=16384)
def is_math_helper(name: str) -> bool:
    """A GEMM/attention library's setup or epilogue kernel (workspace init, split-K reduce,
    dQ conversion): filed under its op's category, but it does none of the op's FLOPs."""
    low = name.lower()
    return bool(_GEMM_HELPER.search(low) or _ATTN_HELPER.search(low))


# Kernels of transform-based convolutions: cuDNN's FFT path (fft2d_r2c/c2r, fft_r2c_conv) and
# the complex GEMM it multiplies the transformed tiles with (sm80_xmma_gemm_cf32cf32...,
# volta_gcgemm_*, *_cgemm), and the Winograd engines (winograd_nonfused::winogradWgradData4x4,
# ...). They do fewer multiply-adds than the direct convolution whose FLOPs their op counts.
_TRANSFORM_CONV = re.compile(
    r"fft|winograd|(?<![a-z0-9])(?:c2r|r2c|g?[cz]gemm|cf32|cf64)")


@lru_cache(maxsize=16384)
def is_transform_conv_kernel(name: str) -> bool:
    """Whether the name is a kernel of an FFT or Winograd convolution (or the complex GEMM of
    the FFT path): under a convolution op its share of the op's FLOPs is a direct-convolution
    equivalent, not the work it does."""
    if not isinstance(name, str):
        return False
    text = demangle(name) if name.startswith("_Z") else name
    return bool(_TRANSFORM_CONV.search(text[:_MAX_NAME].lower()))


def is_tc_eligible_op(op_name: str) -> bool:
    """Whether a framework op (aten::conv2d, TF Conv2D/MatMul, XLA dot/convolution) is work
    Tensor Cores can do. Depthwise convolutions are not: cuDNN runs them on CUDA cores."""
    try:
        if not isinstance(op_name, str) or not op_name:
            return False
        return _tc_eligible_cached(op_name[:_MAX_NAME].lower())
    except Exception:
        return False
