"""The Memory view's numbers on a GPU: the report's peak vs torch.cuda, and what recording costs.

For ResNet-50 (AMP fp16, channels_last, batch 256) and GPT-2 small (bf16 autocast, batch 8 x
1024 tokens), trains under ``GpuProfiler`` with a window [20, 24), once with
``record_memory=True`` and once with ``record_memory=False`` (order on, off, off, on with
``--repeats 2``), then 50 iterations after the window, and prints:

* the report's ``memory`` peak (``devices[cuda:0].peak.allocated_bytes``) against
  ``torch.cuda.max_memory_allocated()`` over the window (read before each window ``step()``:
  the hook resets PyTorch's peak statistics at every step, so that is each iteration's peak;
  the window's is their maximum), and the difference in %;
* the median iteration time (the hook's ``gpuprof/iteration_time_ms``) of the window
  iterations and of the 50 after it (from the second after the window: CUPTI's teardown runs
  in the first), record_memory on vs off, and their ratios: the window may cost more with
  memory on, the iterations after it must not.

Writes ``<out>/memory_view_check.json``.

    python3 gpu/memory_view_check.py --out $OUT/memcheck            # on the H200
    python3 gpu/memory_view_check.py --smoke --out /tmp/memcheck    # CPU, tiny models, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch

from tb_gpuprof.torch import GpuProfiler
from tests.runs import read_scalars

WINDOW = (20, 24)
AFTER = 50


def resnet50(smoke: bool, dev: str) -> tuple[torch.nn.Module, Callable[[], tuple], Any]:
    if smoke:
        model: torch.nn.Module = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(16, 10))
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    else:
        import torchvision

        model = torchvision.models.resnet50().to(dev, memory_format=torch.channels_last)
        x = torch.randn(256, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (256,), device=dev)
    return model, lambda: (x, y), torch.float16


def gpt2(smoke: bool, dev: str) -> tuple[torch.nn.Module, Callable[[], tuple], Any]:
    import transformers

    cfg = (transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000,
                                   n_positions=64) if smoke else transformers.GPT2Config())
    model = transformers.GPT2LMHeadModel(cfg).to(dev)
    batch, seq = (2, 64) if smoke else (8, 1024)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
    return model, lambda: (ids, ids), torch.bfloat16


def loss_of(name: str, model: torch.nn.Module, x: Any, y: Any) -> torch.Tensor:
    if name == "gpt2":
        return model(input_ids=x, labels=y).loss
    return torch.nn.functional.cross_entropy(model(x), y)


def one_run(name: str, build: Callable, record_memory: bool, smoke: bool, out: str
            ) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model, batch, dtype = build(smoke, dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(dev, enabled=cuda and dtype == torch.float16)
    run = os.path.join(out, f"{name}_memory_{'on' if record_memory else 'off'}")
    shutil.rmtree(run, ignore_errors=True)
    window_peaks: list[int] = []
    iterations = WINDOW[1] + 1 + AFTER
    with GpuProfiler(run, *WINDOW, model=model, record_memory=record_memory) as prof:
        for i in range(iterations):
            x, y = batch()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev, dtype=dtype, enabled=cuda or dtype == torch.bfloat16):
                loss = loss_of(name, model, x, y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if cuda and WINDOW[0] <= i < WINDOW[1]:
                window_peaks.append(torch.cuda.max_memory_allocated())  # this iteration's
            prof.step()
    times = read_scalars(run)["gpuprof/iteration_time_ms"]
    report = prof.report or {}
    mem = report.get("memory") or {}
    devices = {d["device"]: d for d in mem.get("devices", [])}
    device = devices.get("cuda:0") or next(iter(devices.values()), None)
    return {
        "model": name, "record_memory": record_memory,
        "report_peak_bytes": device["peak"]["allocated_bytes"] if device else None,
        "report_device": device["device"] if device else None,
        "report_holders": [(h["op"], h["bytes"]) for h in device["holders"][:5]] if device
        else None,
        "torch_max_memory_allocated": max(window_peaks) if window_peaks else None,
        "window_ms": statistics.median(times[s] for s in range(*WINDOW) if s in times),
        "after_ms": statistics.median(times[s] for s in range(WINDOW[1] + 1, iterations)
                                      if s in times),
        "analysis_s": prof.analysis_seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny models on the CPU")
    ap.add_argument("--repeats", type=int, default=1, help="on/off pairs per model (ABBA)")
    ap.add_argument("--models", default="resnet50,gpt2")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    builders = {"resnet50": resnet50, "gpt2": gpt2}
    results = []
    for name in args.models.split(","):
        order = [True, False, False, True][: 2 * args.repeats] if args.repeats <= 2 else \
            [True, False] * args.repeats
        runs = [one_run(name, builders[name], on, args.smoke, args.out) for on in order]
        results += runs
        report(name, runs)
    with open(os.path.join(args.out, "memory_view_check.json"), "w") as f:
        json.dump(results, f, indent=1)


def report(name: str, runs: list[dict[str, Any]]) -> None:
    print(f"== {name}")
    for r in runs:
        if r["record_memory"]:
            truth, got = r["torch_max_memory_allocated"], r["report_peak_bytes"]
            diff = (f"{100 * (got - truth) / truth:+.2f}%" if truth and got is not None
                    else "n/a (no CUDA: torch.cuda has no truth)")
            print(f"  report peak {got} B on {r['report_device']} vs "
                  f"torch.cuda.max_memory_allocated {truth} B: {diff}")
            print(f"  holders at the peak: {r['report_holders']}")
    med = {on: (statistics.median(r["window_ms"] for r in runs if r["record_memory"] is on),
                statistics.median(r["after_ms"] for r in runs if r["record_memory"] is on))
           for on in (True, False)}
    print(f"  window iterations: memory on {med[True][0]:.2f} ms, off {med[False][0]:.2f} ms, "
          f"ratio {med[True][0] / med[False][0]:.3f}")
    print(f"  {AFTER} iterations after: memory on {med[True][1]:.2f} ms, off "
          f"{med[False][1]:.2f} ms, ratio {med[True][1] / med[False][1]:.3f}")


if __name__ == "__main__":
    main()
