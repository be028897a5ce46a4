"""Record the real-GPU test profiles the recommendation tests use (run on the H200).

Each case writes <out>/<case>.json.gz (torch.profiler Chrome trace with ProfilerStep markers)
and <out>/<case>.env.json (the flags a capture hook records, the measured iteration time).
Plain torch.profiler, not our hook, so the fixtures test the analysis independently of it.

    python3 gpu/record_fixtures.py --out $OUT/fixtures
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import time

import torch
import torch.nn as nn
import torchvision
from torch.profiler import ProfilerActivity, profile, schedule


def flags(model: nn.Module, autocast: str | None, channels_last: bool, compiled: bool) -> dict:
    return {
        "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "nvidia_tf32_override": os.environ.get("NVIDIA_TF32_OVERRIDE"),
        "autocast": autocast,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "channels_last": channels_last,
        "compiled": compiled,
    }


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


class SlowDataset(torch.utils.data.Dataset):
    """Synthetic images with CPU-heavy per-sample preprocessing (a slow input pipeline)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.rand(3, self.size, self.size)
        for _ in range(3):  # stand-in for decode + augmentation on the CPU
            x = torch.nn.functional.avg_pool2d(x[None], 3, 1, 1)[0]
        return x, i % 1000


def run_case(name: str, out: str, model: nn.Module, batch: int, *, amp: str | None = None,
             channels_last: bool = False, compiled: bool = False, loader=None,
             image: int = 224, in_features: int | None = None, steps: int = 3) -> None:
    dev = torch.device("cuda")
    model = model.to(dev)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    fwd = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=amp == "float16")
    loss_fn = nn.CrossEntropyLoss()
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(amp or "")

    def batches():
        if loader is not None:
            while True:
                yield from loader
        shape = (batch, in_features) if in_features else (batch, 3, image, image)
        x = torch.randn(*shape, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        while True:
            yield x, y

    it = batches()

    def step():
        x, y = next(it)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    n = 8
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    iter_ms = (time.perf_counter() - t0) * 1e3 / n
    trace = os.path.join(out, f"{name}.json")
    # With a schedule the trace must be exported from on_trace_ready, at the cycle's end.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=0, warmup=1, active=steps), record_shapes=True,
                 with_flops=True, on_trace_ready=lambda p: p.export_chrome_trace(trace)) as prof:
        for _ in range(1 + steps):
            step()
            prof.step()
    with open(trace, "rb") as f, gzip.open(trace + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(trace)
    env = {"framework": "pytorch", "framework_version": torch.__version__,
           "gpu_name": torch.cuda.get_device_name(), "batch_size": batch,
           "measured_iteration_ms": round(iter_ms, 3),
           "memory_peak_bytes": torch.cuda.max_memory_allocated(),
           "flags": flags(model, amp, channels_last, compiled)}
    with open(os.path.join(out, f"{name}.env.json"), "w") as f:
        json.dump(env, f, indent=1)
    print(f"{name}: {iter_ms:.2f} ms/iteration, peak {env['memory_peak_bytes'] / 2**30:.1f} GiB",
          flush=True)


def mlp(width: int = 512, depth: int = 48) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 1000))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--only", default=None, help="comma-separated case names")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    only = set(args.only.split(",")) if args.only else None
    r50 = torchvision.models.resnet50

    cases = [
        ("resnet50_fp32", lambda: (set_tf32(False), run_case(
            "resnet50_fp32", args.out, r50(), args.batch))),
        ("resnet50_tf32", lambda: (set_tf32(True), run_case(
            "resnet50_tf32", args.out, r50(), args.batch))),
        ("resnet50_amp", lambda: (set_tf32(True), run_case(
            "resnet50_amp", args.out, r50(), args.batch, amp="float16"))),
        ("resnet50_amp_cl", lambda: (set_tf32(True), run_case(
            "resnet50_amp_cl", args.out, r50(), args.batch, amp="float16",
            channels_last=True))),
        ("resnet18_slow_input", lambda: (set_tf32(True), run_case(
            "resnet18_slow_input", args.out, torchvision.models.resnet18(), 64,
            amp="float16", channels_last=True,
            loader=torch.utils.data.DataLoader(SlowDataset(64 * 12, 224), batch_size=64,
                                               num_workers=0)))),
        ("mlp_eager_small", lambda: (set_tf32(True), run_case(
            "mlp_eager_small", args.out, mlp(), 32, amp="bfloat16", in_features=512))),
        ("mlp_compiled_small", lambda: (set_tf32(True), run_case(
            "mlp_compiled_small", args.out, mlp(), 32, amp="bfloat16", in_features=512,
            compiled=True))),
        ("resnet18_batch8", lambda: (set_tf32(True), run_case(
            "resnet18_batch8", args.out, torchvision.models.resnet18(), 8, amp="float16",
            channels_last=True))),
    ]
    for name, fn in cases:
        if only and name not in only:
            continue
        try:
            fn()
        except Exception as e:  # keep recording the other cases
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
