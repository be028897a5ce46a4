"""Cost of the PyTorch hook on ResNet-50 AMP fp16 + channels_last, a GPU-bound loop, and
(``--model gpt2``) on an eager GPT-2 at batch 1 x 64, a launch-bound one whose host dispatch
sets the iteration time, with ``model=`` given so the forward pre-hook runs every iteration
(run on the GPU).

Two measurements, each A/B interleaved in one process (ABBA order against drift), blocks of
``--block`` iterations timed with CUDA events (one sync after each block, in the harness):

1. always-on: a block with ``GpuProfiler(iter_start=None)`` (scalars, CUDA-event timing,
   memory peaks, NVTX, NVML sampling) against a block of the bare loop;
2. after a window: one profiler whose window [5, 5 + window) has just run, its following
   blocks against bare blocks, split into blocks that ran while the window's analysis thread
   was still working and blocks after it finished.

Prints the ratios (hook / bare; 1.01 = 1 % slower) and writes ``--out`` as JSON.

    python3 benchmarks/bench_torch_overhead.py --out $OUT/torch/bench_torch_overhead.json
    python3 benchmarks/bench_torch_overhead.py --model gpt2 --out $OUT/torch/gpt2.json
    python3 benchmarks/bench_torch_overhead.py --device cpu --tiny     # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tb_gpuprof.torch import GpuProfiler


def require_store_deps() -> None:
    """The hook degrades without these (no stored report); a measurement run must not."""
    for mod in ("msgspec", "tensorboard.compat.proto.event_pb2"):
        try:
            __import__(mod)
        except ImportError as e:
            sys.exit(f"{os.path.basename(__file__)}: {e}; install tb_gpuprof's dependencies first")


def build_model(tiny: bool) -> torch.nn.Module:
    try:
        import torchvision

        return torchvision.models.resnet18(num_classes=10) if tiny else \
            torchvision.models.resnet50()
    except ImportError:
        if not tiny:
            raise
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def make_train_step(model, device: str, batch: int, image: int):
    amp = torch.float16 if device == "cuda" else torch.bfloat16
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device, enabled=amp == torch.float16)
    x = torch.randn(batch, 3, image, image, device=device).contiguous(
        memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=amp):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return train_step


def make_lm_step(device: str, tiny: bool) -> tuple[torch.nn.Module, object]:
    """An eager HF GPT-2 (6 layers of 512; 2 of 64 with --tiny) trained with AdamW at batch
    1 x 64 in FP32: hundreds of small kernels an iteration, so the host's dispatch, and any
    per-iteration work of the hook, sets the pace."""
    import transformers

    cfg = transformers.GPT2Config(n_layer=2 if tiny else 6, n_embd=64 if tiny else 512,
                                  n_head=4 if tiny else 8, vocab_size=512 if tiny else 50257,
                                  n_positions=128)
    model = transformers.GPT2LMHeadModel(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (1, 64), device=device)

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        opt.step()

    return model, train_step


def timed_block(train_step, n: int, device: str, prof: GpuProfiler | None = None) -> float:
    """Mean ms per iteration of ``n`` iterations (the harness syncs once, after the block)."""
    if device == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
    t0 = time.perf_counter()
    for _ in range(n):
        train_step()
        if prof is not None:
            prof.step()
    if device == "cuda":
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / n
    return (time.perf_counter() - t0) * 1e3 / n


def summarize(pairs: list[tuple[float, float]]) -> dict:
    base = statistics.fmean(p[0] for p in pairs)
    hook = statistics.fmean(p[1] for p in pairs)
    return {"pairs": len(pairs), "bare_ms": round(base, 3), "hook_ms": round(hook, 3),
            "ratio_of_means": round(hook / base, 4),
            "median_pair_ratio": round(statistics.median(h / b for b, h in pairs), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small model (CPU smoke test)")
    ap.add_argument("--pairs", type=int, default=12, help="A/B block pairs per measurement")
    ap.add_argument("--block", type=int, default=20, help="iterations per block")
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--model", choices=("resnet", "gpt2"), default="resnet",
                    help="resnet: GPU-bound (the maintained figure); gpt2: launch-bound, "
                    "with model= given to the hook")
    args = ap.parse_args()
    require_store_deps()
    if args.tiny:
        args.pairs, args.block = min(args.pairs, 3), min(args.block, 3)
    batch, image = (8, 32) if args.tiny else (256, 224)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if args.model == "gpt2":
        batch = 1
        model, train_step = make_lm_step(args.device, args.tiny)
    else:
        model = build_model(args.tiny).to(args.device).to(memory_format=torch.channels_last)
        train_step = make_train_step(model, args.device, batch, image)
    hooked = {"model": model} if args.model == "gpt2" else {}  # resnet: the figure as kept
    logdir = tempfile.mkdtemp(prefix="bench_torch_overhead_")
    timed_block(train_step, 2 * args.block, args.device)  # warm-up, cudnn autotuning

    # 1. always-on mode: a fresh profiler per hooked block, started/closed outside the timing
    always_on = []
    for i in range(args.pairs):
        order = ("bare", "hook") if i % 2 == 0 else ("hook", "bare")
        ms = {}
        for mode in order:
            if mode == "bare":
                ms[mode] = timed_block(train_step, args.block, args.device)
            else:
                prof = GpuProfiler(os.path.join(logdir, "always_on"), **hooked).start()
                ms[mode] = timed_block(train_step, args.block, args.device, prof)
                prof.close()
        always_on.append((ms["bare"], ms["hook"]))

    # 2. after a window: profile [5, 5 + window), then compare the profiler's blocks with bare
    prof = GpuProfiler(os.path.join(logdir, "window"), iter_start=5,
                       iter_stop=5 + args.window, model=model).start()
    t_window = time.perf_counter()
    timed_block(train_step, 5 + args.window, args.device, prof)
    window_loop_s = time.perf_counter() - t_window
    during, after = [], []
    analysis = prof._analysis
    for i in range(args.pairs):
        order = ("bare", "hook") if i % 2 == 0 else ("hook", "bare")
        busy = analysis is not None and analysis.is_alive()
        ms = {}
        for mode in order:
            ms[mode] = timed_block(train_step, args.block, args.device,
                                   prof if mode == "hook" else None)
        (during if busy and analysis.is_alive() else after).append((ms["bare"], ms["hook"]))
    t_wait = time.perf_counter()
    prof.close()
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "model": args.model, "batch": batch,
        "block_iterations": args.block,
        "always_on": summarize(always_on),
        "after_window_analysis_running": summarize(during) if during else None,
        "after_window_analysis_done": summarize(after) if after else None,
        "window_iterations": args.window,
        "window_loop_s": round(window_loop_s, 2),
        "close_s": round(time.perf_counter() - t_wait, 2),
        "analysis_s": round(prof.analysis_seconds or 0.0, 2),
        "report_iterations": (prof.report or {}).get("iterations", {}).get("count"),
    }
    for name in ("always_on", "after_window_analysis_running", "after_window_analysis_done"):
        r = result[name]
        if r:
            print(f"{name:32s} bare {r['bare_ms']:8.3f} ms  hook {r['hook_ms']:8.3f} ms  "
                  f"ratio {r['ratio_of_means']:.4f} (median pair {r['median_pair_ratio']:.4f}, "
                  f"{r['pairs']} pairs x {args.block} iterations)")
    print(f"window loop (iterations 0..{4 + args.window}, incl. profiler start/stop): "
          f"{result['window_loop_s']} s; analysis off-thread {result['analysis_s']} s; "
          f"report iterations: {result['report_iterations']}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
