"""GPT-2 (124M) under transformers.Trainer with GpuProfCallback: FLOPs vs the analytic count.

Trains GPT-2 small from ``GPT2Config()`` (no download) on random tokens, bf16, batch 8 x 512
tokens, with a profiled window, then prints the report's ``throughput`` section next to the
analytic model FLOPs per iteration (issue 18: within +-10%) and the MFU, against the window's
median iteration time and against the un-profiled median (the always-on iteration scalars
outside the window). Writes ``<out>/hf_gpt2.json``.

Analytic count per optimizer step (T = batch * seq tokens, L layers, width d, vocabulary V):

    matmuls   6 * T * (12 * L * d^2 + d * V)     # blocks' QKV, out, MLP (12 L d^2 weights) and
                                                 # the tied LM head; x3 for forward + backward
    attention 3 * 4 * batch * L * d * pairs      # QK^T and PV; pairs = s(s+1)/2 under the causal
                                                 # mask (s^2 without), x3 for forward + backward

The causal count applies when fused attention kernels run (flash, memory-efficient, cuDNN skip
the masked blocks); the math fallback (CPU with dropout) multiplies the full matrices, so there
the full-attention count applies.

    python3 gpu/hf_trainer_gpt2.py --out $OUT/hf_gpt2            # on the H200
    python3 gpu/hf_trainer_gpt2.py --smoke --out /tmp/hf_gpt2    # CPU, tiny model, seconds

On CPU there are no kernels to carry FLOPs, so ``--smoke`` checks the same per-op FLOPs from
the window's operators (the innermost op that has FLOPs, as the report splits them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

try:
    import torch
    import transformers
except ImportError as e:
    sys.exit(f"hf_trainer_gpt2.py: {e}; pip install tb_gpuprof[transformers]")

from tb_gpuprof.analysis.flops import op_flops
from tb_gpuprof.readers import load_profile
from tb_gpuprof.transformers import GpuProfCallback
from tests.runs import read_scalars

TOLERANCE = 0.10


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def analytic_flops(cfg: transformers.GPT2Config, batch: int, seq: int,
                   causal: bool) -> dict[str, float]:
    tokens = batch * seq
    layers, d, vocab = cfg.n_layer, cfg.n_embd, cfg.vocab_size
    pairs = seq * (seq + 1) // 2 if causal else seq * seq
    matmul = 6.0 * tokens * (12 * layers * d * d + d * vocab)
    attention = 3.0 * 4 * batch * layers * d * pairs
    return {"matmul": matmul, "attention": attention, "total": matmul + attention}


def innermost_op_flops(trace: str, iterations: int) -> float:
    """FLOPs per iteration from the trace's operators: each op with FLOPs counts unless an op
    inside it has FLOPs too (aten::linear -> aten::addmm), as the report's kernels get them."""
    ops = sorted(load_profile(trace).cpu_ops, key=lambda o: (o.tid, o.start_us, -o.dur_us))
    has_inner = [False] * len(ops)
    flops = [op_flops(o) or 0.0 for o in ops]
    stack: list[int] = []
    for i, o in enumerate(ops):
        while stack and (ops[stack[-1]].tid != o.tid
                         or ops[stack[-1]].start_us + ops[stack[-1]].dur_us <= o.start_us):
            stack.pop()
        if flops[i]:
            for j in stack:
                has_inner[j] = True
        stack.append(i)
    return sum(f for f, inner in zip(flops, has_inner, strict=True) if f and not inner) \
        / max(iterations, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="CPU, 2-layer model, a few steps")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--window", type=int, nargs=2, default=(20, 24))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    a = p.parse_args()
    if a.smoke:
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512,
                                      n_positions=64)
        a.steps, a.window, a.batch, a.seq = 8, (4, 6), 2, 64
    else:
        if not torch.cuda.is_available():
            sys.exit("hf_trainer_gpt2.py: no CUDA GPU (use --smoke on CPU)")
        cfg = transformers.GPT2Config()  # GPT-2 small, 124M parameters
    os.makedirs(a.out, exist_ok=True)
    run = os.path.join(a.out, "runs", "gpt2_bf16")
    cb = GpuProfCallback(run, iter_start=a.window[0], iter_stop=a.window[1])
    args = transformers.TrainingArguments(
        output_dir=os.path.join(a.out, "trainer"), max_steps=a.steps,
        per_device_train_batch_size=a.batch, bf16=not a.smoke, use_cpu=a.smoke,
        learning_rate=1e-4, save_strategy="no", report_to=[], disable_tqdm=True,
        logging_steps=10, dataloader_num_workers=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    transformers.Trainer(model=model, args=args, callbacks=[cb],
                         train_dataset=RandomTokens(a.batch * a.steps, a.seq,
                                                    cfg.vocab_size)).train()
    prof = cb.last_profiler
    if prof is None or prof.report is None:
        sys.exit("hf_trainer_gpt2.py: the window produced no report")
    report, tp = prof.report, prof.report["throughput"]
    window = range(a.window[0] - 1, a.window[1])  # the profiler opens one iteration early
    walls = read_scalars(run)["gpuprof/iteration_time_ms"]
    outside = [v for s, v in walls.items() if s >= 5 and s not in window] or list(walls.values())
    unprofiled_ms = statistics.median(outside)
    n = report["iterations"]["count"]
    counted = tp["flops_per_iteration"]
    source = "report kernels"
    if not counted:  # CPU: no kernels carry FLOPs; count the same ops from the trace
        counted, source = innermost_op_flops(prof.trace_path, n), "window operators (CPU)"
    attention_ops = [o.name for o in load_profile(prof.trace_path).cpu_ops
                     if "attention" in o.name and op_flops(o)]
    result = {
        "params": sum(q.numel() for q in model.parameters()),
        "tokens_per_iteration": a.batch * a.seq, "flops_per_iteration": counted,
        "flops_source": source,
        "analytic_causal": analytic_flops(cfg, a.batch, a.seq, True),
        "analytic_full_attention": analytic_flops(cfg, a.batch, a.seq, False),
        "attention_ops": sorted(set(attention_ops)), "throughput": tp,
        "unprofiled_median_ms": unprofiled_ms,
        "unprofiled_tflops": counted / (unprofiled_ms * 1e-3) / 1e12,
    }
    if tp["peak_tflops"]:
        result["unprofiled_mfu_pct"] = 100 * result["unprofiled_tflops"] / tp["peak_tflops"]
    # Fused kernels (flash, memory-efficient, cuDNN) skip the masked half; the math fallback
    # (e.g. CPU with dropout) multiplies full matrices and masks afterwards.
    fused = any(n != "aten::scaled_dot_product_attention" for n in result["attention_ops"])
    expected = result["analytic_causal" if fused else "analytic_full_attention"]["total"]
    ratio = counted / expected
    result["ratio_to_analytic"] = ratio
    result["analytic_used"] = "causal" if fused else "full_attention"
    with open(os.path.join(a.out, "hf_gpt2.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"GPT-2 {result['params'] / 1e6:.1f}M params, {a.batch}x{a.seq} tokens, "
          f"{report['system'].get('gpu_name') or 'CPU'}; attention ops with FLOPs: "
          f"{result['attention_ops']}")
    print(f"FLOPs/iteration counted ({source}): {counted:.4g}; analytic: causal "
          f"{result['analytic_causal']['total']:.4g}, full attention "
          f"{result['analytic_full_attention']['total']:.4g}; expected "
          f"{result['analytic_used']} (fused attention kernels: {fused})")
    print(f"window: {tp['iteration_ms']} ms/iter, {tp['achieved_tflops']} TFLOP/s, "
          f"MFU {tp['mfu_pct']}% of {tp['peak_tflops']} ({tp['peak_source']})")
    print(f"un-profiled: {unprofiled_ms:.2f} ms/iter, {result['unprofiled_tflops']:.1f} TFLOP/s, "
          f"MFU {result.get('unprofiled_mfu_pct', float('nan')):.1f}%")
    ok = abs(ratio - 1) <= TOLERANCE
    print(("PASS" if ok else "FAIL") + f": counted/analytic = {ratio:.3f} (tolerance "
          f"+-{TOLERANCE:.0%})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
