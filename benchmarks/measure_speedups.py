"""Measure the per-kernel-class speed-up factors of the what-if table on the GPU (H200).

Each factor is the GPU time of one kernel class before / after the change, on small but
realistic blocks (fwd + bwd), profiled with torch.profiler and summed by *our* classifier's
category, so the factor means exactly what analysis/whatif.py applies it to:

- fp32_to_tf32_{gemm,conv}: FP32 (TF32 off) vs TF32, GEMM and ResNet convolutions (NCHW)
- tf32_to_half_{gemm,conv,attention}: TF32 vs FP16/BF16 (convs NCHW, attention SDPA)
- memory_half: FP32 vs BF16 norm/elementwise/reduction kernels (LayerNorm, GELU, BN)
- nchw_to_nhwc_norm / nchw_to_nhwc_half_conv: FP16 NCHW vs FP16 channels_last, BN+ReLU+pool
  and conv kernels
- fusion_small_kernels: eager vs torch.compile GPU time of elementwise/norm chains
- compile_dispatch / amp_dispatch: host time per step of a launch-bound MLP, eager vs
  compiled, FP32 vs autocast

    python3 benchmarks/measure_speedups.py --out $OUT/speedups.json      # on the GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch

from tb_gpuprof.analysis.classify import classify_kernel
from tb_gpuprof.readers import load_profile

DEV = "cuda"


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def category_us(fn: Callable[[], Any], steps: int = 5) -> dict[str, float]:
    """GPU time per step by our kernel category, from a torch.profiler trace of ``fn``."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "t.json")
    prof.export_chrome_trace(path)
    out: dict[str, float] = {}
    for g in load_profile(path).gpu:
        cat = classify_kernel(g.name, g.kind).category
        out[cat] = out.get(cat, 0.0) + g.dur_us / steps
    return out


def fwd_bwd(module: Any, x: Any, dtype: Any = None) -> Callable[[], None]:
    def step() -> None:
        with torch.autocast(DEV, dtype=dtype or torch.float32, enabled=dtype is not None):
            y = module(x)
        y.float().sum().backward()
    return step


def gemm_case() -> Any:
    return torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 1024)).to(DEV)


def conv_case(cl: bool) -> tuple[Any, Any]:
    import torchvision

    blocks = torch.nn.Sequential(torchvision.models.resnet50().layer1,
                                 torchvision.models.resnet50().layer2[:2]).to(DEV)
    x = torch.randn(64, 64, 56, 56, device=DEV, requires_grad=True)
    if cl:
        blocks = blocks.to(memory_format=torch.channels_last)
        x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    return blocks, x


def attention_step(dtype: Any) -> Callable[[], None]:
    q = torch.randn(8, 12, 1024, 64, device=DEV, requires_grad=True)

    def step() -> None:
        with torch.autocast(DEV, dtype=dtype or torch.float32, enabled=dtype is not None):
            o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        o.float().sum().backward()
    return step


def transformer_mlp() -> tuple[Any, Any]:
    blk = torch.nn.Sequential(torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 4096),
                              torch.nn.GELU(), torch.nn.Linear(4096, 1024),
                              torch.nn.LayerNorm(1024)).to(DEV)
    return blk, torch.randn(16, 512, 1024, device=DEV, requires_grad=True)


def host_ms(step: Callable[[], None], n: int = 50) -> float:
    """Host time per step of a launch-bound step (the GPU keeps up: tiny kernels)."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / n


def transformer_host_ms() -> dict[str, float]:
    """Host time per training step (fwd + bwd + AdamW) of a small HF GPT-2 (6 layers, d=512)
    at batch 1 x 64, where the GPU keeps up: eager TF32, eager bf16 autocast, compiled bf16."""
    from transformers import GPT2Config, GPT2LMHeadModel

    set_tf32(True)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=64,
                                       vocab_size=8192)).to(DEV)
    ids = torch.randint(0, 8192, (1, 64), device=DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def lm_step(m: Any, dtype: Any) -> Callable[[], None]:
        def step() -> None:
            with torch.autocast(DEV, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    compiled = torch.compile(model)
    out = {"lm_eager_tf32": host_ms(lm_step(model, None)),
           "lm_eager_bf16": host_ms(lm_step(model, torch.bfloat16))}
    out["lm_compiled_bf16"] = host_ms(lm_step(compiled, torch.bfloat16))
    out["lm_eager_bf16_again"] = host_ms(lm_step(model, torch.bfloat16))
    return out


def ratio(a: dict[str, float], b: dict[str, float], cats: tuple[str, ...]) -> float | None:
    before = sum(a.get(c, 0.0) for c in cats)
    after = sum(b.get(c, 0.0) for c in cats)
    return round(before / after, 3) if before > 0 and after > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    res: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    cats: dict[str, dict[str, float]] = {}
    x = torch.randn(8192, 4096, device=DEV, requires_grad=True)
    g = gemm_case()
    set_tf32(False)
    cats["gemm_fp32"] = category_us(fwd_bwd(g, x))
    set_tf32(True)
    cats["gemm_tf32"] = category_us(fwd_bwd(g, x))
    cats["gemm_bf16"] = category_us(fwd_bwd(g, x, torch.bfloat16))
    conv, cx = conv_case(False)
    set_tf32(False)
    cats["conv_fp32"] = category_us(fwd_bwd(conv, cx))
    set_tf32(True)
    cats["conv_tf32"] = category_us(fwd_bwd(conv, cx))
    cats["conv_fp16"] = category_us(fwd_bwd(conv, cx, torch.float16))
    conv_cl, cx_cl = conv_case(True)
    cats["conv_fp16_cl"] = category_us(fwd_bwd(conv_cl, cx_cl, torch.float16))
    cats["attn_tf32"] = category_us(attention_step(None))
    cats["attn_bf16"] = category_us(attention_step(torch.bfloat16))
    mlp, mx = transformer_mlp()
    cats["mlp_fp32"] = category_us(fwd_bwd(mlp, mx))
    cats["mlp_bf16"] = category_us(fwd_bwd(mlp, mx, torch.bfloat16))
    compiled = torch.compile(mlp)
    cats["mlp_tf32_eager"] = category_us(fwd_bwd(mlp, mx))
    cats["mlp_tf32_compiled"] = category_us(fwd_bwd(compiled, mx))
    small = ("elementwise", "reduction", "norm")
    res["factors"] = {
        "fp32_to_tf32_gemm": ratio(cats["gemm_fp32"], cats["gemm_tf32"], ("gemm",)),
        "fp32_to_tf32_conv": ratio(cats["conv_fp32"], cats["conv_tf32"], ("conv",)),
        "tf32_to_half_gemm": ratio(cats["gemm_tf32"], cats["gemm_bf16"], ("gemm",)),
        "tf32_to_half_conv": ratio(cats["conv_tf32"], cats["conv_fp16"], ("conv",)),
        "tf32_to_half_attention": ratio(cats["attn_tf32"], cats["attn_bf16"],
                                        ("attention", "gemm")),
        "memory_half": ratio(cats["mlp_fp32"], cats["mlp_bf16"], ("norm", "elementwise")),
        "memory_half_convnet": ratio(cats["conv_tf32"], cats["conv_fp16"], ("norm",)),
        "nchw_to_nhwc_norm": ratio(cats["conv_fp16"], cats["conv_fp16_cl"],
                                   ("norm", "elementwise", "reduction", "other")),
        "nchw_to_nhwc_half_conv": ratio(cats["conv_fp16"], cats["conv_fp16_cl"], ("conv",)),
        "fusion_small_kernels": ratio(cats["mlp_tf32_eager"], cats["mlp_tf32_compiled"], small),
    }
    tiny = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(24)]).to(DEV)
    opt = torch.optim.SGD(tiny.parameters(), lr=1e-3)
    tx = torch.randn(32, 256, device=DEV)

    def tiny_step(model: Any, dtype: Any = None) -> Callable[[], None]:
        def step() -> None:
            with torch.autocast(DEV, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = model(tx).float().sum()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    eager = host_ms(tiny_step(tiny))
    amp = host_ms(tiny_step(tiny, torch.bfloat16))
    comp = host_ms(tiny_step(torch.compile(tiny)))
    res["host_ms"] = {"eager_fp32": eager, "eager_bf16": amp, "compiled_fp32": comp}
    res["factors"]["compile_dispatch_mlp"] = round(eager / comp, 3)
    res["factors"]["amp_dispatch_mlp"] = round(eager / amp, 3)
    res["host_ms"].update(transformer_host_ms())
    h = res["host_ms"]
    res["factors"]["compile_dispatch"] = round(h["lm_eager_bf16"] / h["lm_compiled_bf16"], 3)
    res["factors"]["amp_dispatch"] = round(h["lm_eager_tf32"] / h["lm_eager_bf16"], 3)
    res["category_us"] = cats
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["factors"], indent=1))
    print(json.dumps(res["host_ms"]))


if __name__ == "__main__":
    main()
