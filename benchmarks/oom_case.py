"""The out-of-memory report on a real loop: does the batch it predicts fit, and one 25% larger fail?

One process trains a case (``verify_cases.build``: the HF Llama by default) at a batch that fits
through ``GpuProfiler(..., model=, optimizer=)`` with a window, then raises its batch to one
that cannot fit. The hook writes ``plugins/gpuprof/oom_report.json`` before the error
propagates. Then fresh processes, without the hook, train a few steps at the batch the report
predicts fits (``advice[fix=batch_size].largest_batch_size``) and at 25% more, and say whether
each ran or ran out of memory (with the allocator's peak). The window report's headroom
(``memory_parts.batch_headroom``: how many times the recorded batch fits) is tried the same way.

On a GPU, from the repository root (docs/pytorch.md#out-of-memory has the figures of its run):

    python benchmarks/oom_case.py --out $OUT/oom --case llama --batch 16 --fail-batch 2048

CPU check of the plumbing (no out-of-memory error without CUDA: the failing step is faked by
raising torch.OutOfMemoryError): ``python benchmarks/oom_case.py --smoke --out /tmp/oomc``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import verify_cases  # noqa: E402  (benchmarks/, beside this file)

LARGER = 1.25  # the batch that must fail: 25% above the predicted largest
TRY_STEPS = 3  # steps a fresh process runs at a tried batch


def record(case: str, out: str, batch: int, fail_batch: int, smoke: bool) -> dict[str, Any]:
    """The hooked run: the window at ``batch``, then a step at ``fail_batch`` that runs out of
    memory inside the hook's ``with`` block."""
    import torch

    from tb_gpuprof.analysis import memory_parts
    from tb_gpuprof.torch import GpuProfiler

    model, opt, step = verify_cases.build(case, smoke, batch)
    failing = _step_at(case, model, fail_batch, smoke)
    run = os.path.join(out, "runs", f"oom_{case}")
    prof = GpuProfiler(run, iter_start=3, iter_stop=5, model=model, optimizer=opt)
    error = None
    try:
        with prof:
            for _ in range(6):
                step(model, opt)
                prof.step()
            prof.wait()
            if smoke:  # no CUDA: the failing step raises what the allocator would
                raise torch.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                    "capacity of 8.00 GiB of which 1.00 GiB is free. Of the allocated memory "
                    "6.00 GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch "
                    "but unallocated.")
            failing(model, opt)
            prof.step()
    except torch.OutOfMemoryError as e:
        error = str(e).split("\n")[0][:200]
    oom = json.load(open(prof.oom_report_path)) if prof.oom_report_path else None
    headroom = None
    total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() \
        else None
    for d in ((prof.report or {}).get("memory") or {}).get("devices") or ():
        if d.get("peak_parts") and str(d.get("device")).startswith("cuda"):
            headroom = memory_parts.batch_headroom(d, total)
    advice = next((a for a in (oom or {}).get("advice") or () if a["fix"] == "batch_size"), {})
    return {"error": error, "oom_report": prof.oom_report_path,
            "largest_part": (oom or {}).get("largest_part"),
            "last_peak": (oom or {}).get("last_peak"),
            "per_sample_bytes": (oom or {}).get("per_sample_bytes"),
            "per_sample_basis": (oom or {}).get("per_sample_basis"),
            "budget_bytes": (oom or {}).get("budget_bytes"),
            "fixed_bytes": ((oom or {}).get("fixed_bytes") or {}).get("total"),
            "largest_batch_size": advice.get("largest_batch_size"), "bound": advice.get("bound"),
            "headroom_times": headroom,
            "headroom_batch": math.floor(headroom * batch) if headroom else None}


def _step_at(case: str, model: Any, batch: int, smoke: bool) -> Any:
    """The case's training step on a batch of ``batch`` for the model already built (its
    inputs made when the step runs, so that making them can fail as the step would)."""
    import torch

    dev = "cpu" if smoke else "cuda"

    def step(m: Any, opt: Any) -> None:
        if case in ("resnet", "vit"):
            x = torch.randn(batch, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (batch,), device=dev)
            loss = torch.nn.functional.cross_entropy(m(x), y)
        else:
            ids = torch.randint(0, m.config.vocab_size, (batch, 32 if smoke else 512),
                                device=dev)
            loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def try_batch(case: str, batch: int, smoke: bool) -> dict[str, Any]:
    """A fresh process: a few steps at ``batch`` without the hook; ran, or out of memory."""
    import torch

    t = time.perf_counter()
    try:
        model, opt, step = verify_cases.build(case, smoke, batch)
        for _ in range(TRY_STEPS):
            step(model, opt)
        verify_cases._sync()
    except torch.OutOfMemoryError as e:
        return {"batch": batch, "ran": False, "error": str(e).split("\n")[0][:200],
                "seconds": time.perf_counter() - t}
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return {"batch": batch, "ran": True, "max_allocated_bytes": peak,
            "seconds": time.perf_counter() - t}


def _child(args: list[str]) -> dict[str, Any]:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True,
                       text=True, timeout=400, check=False)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return {"error": (p.stderr or p.stdout)[-1500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", default="llama", choices=("llama", "moe", "lora", "resnet", "vit"))
    ap.add_argument("--batch", type=int, default=16, help="the batch the window records")
    ap.add_argument("--fail-batch", type=int, default=2048, help="the batch that cannot fit")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--try-batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    smoke = ["--smoke"] if args.smoke else []
    if args.record:
        res = record(args.case, args.out, args.batch, args.fail_batch, args.smoke)
        print("RESULT " + json.dumps(res, default=str))
        return 0
    if args.try_batch:
        print("RESULT " + json.dumps(try_batch(args.case, args.try_batch, args.smoke)))
        return 0
    os.makedirs(args.out, exist_ok=True)
    common = ["--out", args.out, "--case", args.case, *smoke]
    res = {"recorded": _child([*common, "--record", "--batch", str(args.batch),
                               "--fail-batch", str(args.fail_batch)]), "tried": []}
    for key in ("largest_batch_size", "headroom_batch"):
        n = res["recorded"].get(key)
        if not n or args.smoke:  # on the CPU every batch fits: the plumbing only
            continue
        for b in (n, math.ceil(n * LARGER)):
            if all(t["batch"] != b for t in res["tried"]):
                res["tried"].append({"from": key, **_child([*common, "--try-batch", str(b)])})
    with open(os.path.join(args.out, "oom_case.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
