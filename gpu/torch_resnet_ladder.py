"""ResNet-50 optimization ladder through the PyTorch hook (run on the H200).

FP32 (TF32 off) -> TF32 -> AMP fp16 -> AMP fp16 + channels_last: for each, warm-up, the mean
iteration time over ``--iters`` iterations (CUDA events around the block), then a
GpuProfiler window of ``--window`` iterations. Each config is one run,
``<out>/runs/resnet50_<config>``; its report's recommendations should name the next rung
(tf32, amp, channels_last, then none of those). Prints one line per config and writes
``<out>/ladder.json``.

    python3 gpu/torch_resnet_ladder.py --out $OUT/torch
    python3 gpu/torch_resnet_ladder.py --out /tmp/ladder --device cpu --tiny   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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

# name -> (tf32, autocast dtype, channels_last)
CONFIGS = {
    "fp32": (False, None, False),
    "tf32": (True, None, False),
    "amp": (True, torch.float16, False),
    "amp_channels_last": (True, torch.float16, True),
}
LADDER_IDS = ("tf32", "amp", "channels_last")


def build_model(tiny: bool) -> torch.nn.Module:
    try:
        import torchvision

        return torchvision.models.resnet18(num_classes=10) if tiny else \
            torchvision.models.resnet50()
    except ImportError:
        if not tiny:
            raise
        return torch.nn.Sequential(  # CPU smoke test without torchvision
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


class Timer:
    """Block timer: CUDA events on the GPU (one sync after the block), perf_counter on CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def __enter__(self) -> Timer:
        if self.cuda:
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            self.ms = self.a.elapsed_time(self.b)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


def make_train_step(model, device: str, batch: int, image: int, amp, channels_last: bool):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device, enabled=amp == torch.float16)
    x = torch.randn(batch, 3, image, image, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=amp or torch.float32, enabled=amp is not None):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return train_step


def run_config(name: str, args: argparse.Namespace) -> dict:
    tf32, amp, channels_last = CONFIGS[name]
    set_tf32(tf32)
    model = build_model(args.tiny).to(args.device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    train_step = make_train_step(model, args.device, args.batch, args.image, amp, channels_last)
    run_dir = os.path.join(args.out, "runs", f"resnet50_{name}")
    start = args.warmup + args.iters
    timer = Timer(args.device)
    with GpuProfiler(run_dir, iter_start=start, iter_stop=start + args.window,
                     model=model) as prof:
        for _ in range(args.warmup):
            train_step()
            prof.step()
        with timer:
            for _ in range(args.iters):
                train_step()
                prof.step()
        for _ in range(args.window):
            train_step()
            prof.step()
    report = prof.report or {}
    recs = [r["id"] for r in report.get("recommendations", [])]
    mem = torch.cuda.max_memory_allocated() / 1e9 if args.device == "cuda" else None
    result = {
        "config": name, "mean_ms": round(timer.ms / args.iters, 2), "run": run_dir,
        "recommendations": recs,
        "ladder_recommendations": [r for r in recs if r in LADDER_IDS],
        "report_iterations": (report.get("iterations") or {}).get("count"),
        "report_mean_ms": (report.get("iterations") or {}).get("mean_ms"),
        "tensor_core_pct": (report.get("tensor_cores") or {}).get("tc_pct"),
        "flags": (report.get("system") or {}).get("flags"),
        "peak_memory_gb_last_iteration": mem,
        "warnings": report.get("warnings"),
    }
    del model, train_step
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small model and batch (CPU smoke test)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--image", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()
    require_store_deps()
    args.batch = args.batch or (8 if args.tiny else 256)
    args.image = args.image or (32 if args.tiny else 224)
    if args.tiny:
        args.warmup, args.iters = min(args.warmup, 3), min(args.iters, 4)
    torch.backends.cudnn.benchmark = True
    os.makedirs(args.out, exist_ok=True)
    results = []
    for name in args.configs.split(","):
        r = run_config(name, args)
        results.append(r)
        if r["report_iterations"] is None:
            print(f"{name:18s} {r['mean_ms']:8.2f} ms/iteration  NO REPORT (see the warnings "
                  "above)", flush=True)
            continue
        print(f"{name:18s} {r['mean_ms']:8.2f} ms/iteration  report: {r['report_iterations']} "
              f"iterations, mean {r['report_mean_ms']:.2f} ms, TC {r['tensor_core_pct']}%  "
              f"recommendations: {','.join(r['recommendations']) or '-'}", flush=True)
    meta = {"torch": torch.__version__, "device": args.device, "batch": args.batch,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "results": results}
    with open(os.path.join(args.out, "ladder.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
