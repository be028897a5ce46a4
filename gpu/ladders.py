"""Record the savings ladders on a GPU, every rung of a ladder in one process (issue 14).

A ladder is a loop with one fix applied per rung (ResNet-50: FP32 -> TF32 -> AMP -> AMP +
channels_last; HF GPT-2 124M eager: TF32 -> AMP -> torch.compile; a JAX MLP LM: FP32 -> TF32
-> BF16; an MLP fed by host copies: pageable -> pinned; a held-out timm ViT-B/16: FP32 ->
TF32 -> AMP). For each ladder, in one process:

1. every rung is warmed up and trains through ``tb_gpuprof.torch.GpuProfiler`` with a window
   (JAX: ``jax.profiler``), eager rungs before any compiled one (the hook's "compiled" flag
   looks at the process);
2. then all rungs are timed without any hook, interleaved: rounds of one block per rung, the
   order reversed every other round (A B C, C B A, ...), each block synchronized at both
   ends. A rung's time is the median of its blocks.

Timing the rungs side by side in one process is what makes a step's measured saving
trustworthy: a launch-bound loop on this VM runs 25-42 ms per iteration from one process to
the next, more than the savings being checked.

    python3 gpu/ladders.py --out $OUT/lad                     # every ladder, one process each
    python3 gpu/ladders.py --out /tmp/lad --ladder gpt2 --smoke   # CPU smoke test

Writes, per rung, ``<out>/<rung>/`` (the hook's run with the window's trace; JAX:
``<out>/<rung>_trace/``) and ``<out>/<rung>.meta.json`` (``unprofiled_mean_ms``: the rung's
interleaved median; ``blocks_ms``; ``hook_system``: the flags the hook recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

LADDERS = ("resnet50", "gpt2", "jax_lm", "copy", "vit")
WINDOW = (8, 11)
WINDOW_ITERS = 14


@dataclass
class Rung:
    name: str
    step: Callable[[], None]
    model: Any = None
    flags: Callable[[], None] = lambda: None
    meta: dict[str, Any] = field(default_factory=dict)
    blocks_ms: list[float] = field(default_factory=list)


def _torch_flags(torch: Any, tf32: bool) -> Callable[[], None]:
    def apply() -> None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return apply


def resnet50_rungs(smoke: bool) -> list[Rung]:
    import torchvision
    from diagnosis_cases import _classifier_step, _torch_setup

    torch, dev = _torch_setup(smoke)
    batch, size = (2, 64) if smoke else (128, 224)
    nchw = torchvision.models.resnet50().to(dev)
    nhwc = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)
    half = torch.float16

    def rung(name: str, model: Any, tf32: bool, amp: Any, cl: bool) -> Rung:
        step = _classifier_step(torch, dev, model, lambda: (x, y), amp=amp, channels_last=cl)
        return Rung(name, step, model, _torch_flags(torch, tf32),
                    {"model": "resnet50", "batch": batch, "tf32": tf32,
                     "autocast": "float16" if amp else None, "channels_last": cl})

    return [rung("resnet50_fp32", nchw, False, None, False),
            rung("resnet50_tf32", nchw, True, None, False),
            rung("resnet50_amp", nchw, True, half, False),
            rung("resnet50_amp_cl", nhwc, True, half, True)]


def gpt2_rungs(smoke: bool) -> list[Rung]:
    from diagnosis_cases import _gpt2, _lm_step, _torch_setup

    torch, dev = _torch_setup(smoke)
    batch, seq = (2, 32) if smoke else (4, 256)
    model = _gpt2(torch, dev, 2 if smoke else 12, 128 if smoke else 768, 4 if smoke else 12,
                  seq, 1000 if smoke else 50257)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=dev)
    compiled = torch.compile(model)
    meta = {"model": "gpt2 124M (HF)", "batch": batch, "seq": seq}
    tf32 = _torch_flags(torch, True)
    return [Rung("gpt2_tf32", _lm_step(torch, dev, model, lambda: ids, None), model, tf32,
                 {**meta, "autocast": None, "tf32": True}),
            Rung("gpt2_bf16", _lm_step(torch, dev, model, lambda: ids, torch.bfloat16), model,
                 tf32, {**meta, "autocast": "bfloat16"}),
            Rung("gpt2_bf16_compile", _lm_step(torch, dev, compiled, lambda: ids,
                                               torch.bfloat16),
                 compiled, tf32, {**meta, "autocast": "bfloat16", "compiled": True})]


def vit_rungs(smoke: bool) -> list[Rung]:
    """Held out: a model none of the rules or factors were developed on."""
    import timm
    from diagnosis_cases import _classifier_step, _torch_setup

    torch, dev = _torch_setup(smoke)
    name, batch, size = ("vit_tiny_patch16_224", 2, 224) if smoke else \
        ("vit_base_patch16_224", 64, 224)
    model = timm.create_model(name, num_classes=1000).to(dev)
    x = torch.randn(batch, 3, size, size, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def rung(rname: str, tf32: bool, amp: Any) -> Rung:
        step = _classifier_step(torch, dev, model, lambda: (x, y), amp=amp)
        return Rung(rname, step, model, _torch_flags(torch, tf32),
                    {"model": f"timm {name}", "batch": batch, "tf32": tf32,
                     "autocast": "bfloat16" if amp else None})

    return [rung("vit_fp32", False, None), rung("vit_tf32", True, None),
            rung("vit_bf16", True, torch.bfloat16)]


def copy_rungs(smoke: bool) -> list[Rung]:
    from diagnosis_cases import case_pageable, case_pinned

    rungs = []
    for name, make in (("pageable", case_pageable), ("pinned", case_pinned)):
        model, step, meta = make(smoke)
        rungs.append(Rung(name, step, model, meta=meta))
    return rungs


def _sync_torch() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _hooked_window(out: str, r: Rung) -> dict[str, Any]:
    from tb_gpuprof.torch import GpuProfiler

    prof = GpuProfiler(os.path.join(out, r.name), iter_start=WINDOW[0], iter_stop=WINDOW[1],
                       model=r.model)
    with prof:
        for _ in range(WINDOW_ITERS):
            r.step()
            prof.step()
    _sync_torch()
    report = prof.report or {}
    return {"hook_system": {k: report.get("system", {}).get(k) for k in
                            ("framework", "framework_version", "flags")},
            "hook_recommendations": [x["id"] for x in report.get("recommendations", [])]}


def interleave(rungs: list[Rung], rounds: int, block: int, sync: Callable[[], None]) -> None:
    """Rounds of one synchronized block per rung, every other round in reverse order."""
    for k in range(rounds):
        for r in (rungs if k % 2 == 0 else rungs[::-1]):
            r.flags()
            sync()
            t0 = time.perf_counter()
            for _ in range(block):
                r.step()
            sync()
            r.blocks_ms.append((time.perf_counter() - t0) * 1e3 / block)


def run_torch_ladder(ladder: str, out: str, smoke: bool, rounds: int, block: int) -> None:
    make = {"resnet50": resnet50_rungs, "gpt2": gpt2_rungs, "copy": copy_rungs,
            "vit": vit_rungs}[ladder]
    rungs = make(smoke)
    for r in rungs:  # eager rungs come first in every ladder: the window sees the flags true
        r.flags()
        for _ in range(2 if smoke else 5):
            r.step()
        r.meta.update(_hooked_window(out, r))
    interleave(rungs, rounds, block, _sync_torch)
    _write(out, rungs)


def jax_lm_rungs(smoke: bool) -> tuple[list[Rung], Callable[[], None]]:
    """The JAX LM of diagnosis_cases.jax_lm in each precision, from the same initial weights."""
    import jax
    from diagnosis_cases import jax_lm, matmul_precision

    state: dict[str, Any] = {}

    def make(precision: str) -> Rung:
        params0, jitted, meta = jax_lm(smoke, precision)
        matmul = matmul_precision(precision)
        state[precision] = params0

        def step() -> None:
            with jax.default_matmul_precision(matmul):
                state[precision] = jitted(state[precision])

        return Rung(f"jax_lm_{precision}", step, meta=meta)

    def sync() -> None:
        jax.block_until_ready(list(state.values()))

    return [make("fp32"), make("tf32"), make("bf16")], sync


def run_jax_ladder(out: str, smoke: bool, rounds: int, block: int) -> None:
    import jax

    rungs, sync = jax_lm_rungs(smoke)
    for r in rungs:
        for _ in range(3):
            r.step()
        sync()
        trace_dir = os.path.join(out, f"{r.name}_trace")
        jax.profiler.start_trace(trace_dir)
        for s in range(4):
            with jax.profiler.StepTraceAnnotation("train", step_num=s):
                r.step()
        sync()
        jax.profiler.stop_trace()
        r.meta["trace_dir"] = trace_dir
    interleave(rungs, rounds, block, sync)
    _write(out, rungs)


def _write(out: str, rungs: list[Rung]) -> None:
    for r in rungs:
        meta = {**r.meta, "rung": r.name, "unprofiled_mean_ms": round(
            statistics.median(r.blocks_ms), 3), "unprofiled_source": "interleaved_median",
            "blocks_ms": [round(b, 3) for b in r.blocks_ms]}
        with open(os.path.join(out, f"{r.name}.meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(f"  {r.name:22s} {meta['unprofiled_mean_ms']:9.3f} ms  blocks "
              f"{min(r.blocks_ms):.2f}-{max(r.blocks_ms):.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ladder", choices=LADDERS, default=None, help="this ladder, here")
    ap.add_argument("--ladders", default="resnet50,gpt2,jax_lm,copy,vit")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    ap.add_argument("--timeout", type=float, default=400)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.smoke:
        args.rounds, args.block = 2, 2
    if args.ladder:
        if args.ladder == "jax_lm":
            run_jax_ladder(args.out, args.smoke, args.rounds, args.block)
        else:
            run_torch_ladder(args.ladder, args.out, args.smoke, args.rounds, args.block)
        return
    for ladder in args.ladders.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--ladder", ladder,
               "--rounds", str(args.rounds), "--block", str(args.block)]
        if args.smoke:
            cmd.append("--smoke")
        t0 = time.perf_counter()
        try:
            rc: Any = subprocess.run(cmd, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"== ladder {ladder}: rc={rc} {time.perf_counter() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
