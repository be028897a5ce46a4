"""verify= against fresh processes: real models, each fix measured in the loop and apart.

For each case, one process trains the model through ``GpuProfiler(..., verify=FIXES)`` (window
[10, 12), then the verification: noise run, A/A control, the fixes' ABBA trials, after-run),
then one fresh process per variant (``baseline``, each fix applied from the start with the
same switch class, and for a fix verified after another, that one alone and both) times the
loop without any hook: 10 warm-up iterations, then 8 blocks of
10 iterations with ``torch.cuda.synchronize()`` at block ends; the median block gives
ms/iteration. The table compares the report's prediction, the verified saving and the
fresh-process saving of each fix (all from the FP32 eager baseline).

On the H200, from the repository root (docs/calibration.md has the figures and the commands
of its runs):

    python benchmarks/verify_cases.py --out $OUT/u --cases unet --max-s 100
    python benchmarks/verify_cases.py --out $OUT/g --cases gnn,lora --max-s 60
    python benchmarks/verify_cases.py --out $OUT/t --cases llama,moe,resnet,vit --max-s 0

``--max-s 0`` records the window and its report only. Each hooked run is kept as
``OUT/runs/CASE.tar.gz`` (trace, stored report, context: ``tb-gpuprof report --reanalyze``
re-predicts from it), with the parameters' and optimizer state's bytes and the allocator's
figures beside its memory peak parts in results.json (issue 40's checks); with ``--max-s 0``
also ``fragmentation_check``: the report's reserved-but-unallocated bytes at the window's peak
against the allocator's own (docs/report-schema.md), and ``dispatch_probe``: the host's time
to dispatch a step on an idle GPU, without the profiler, beside the GPU's (issue 38's host
scale; not yet used by the analysis).

CPU check: ``python benchmarks/verify_cases.py --smoke --out /tmp/vc --cases gnn,lora``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CASES: dict[str, tuple[str, ...]] = {  # case -> the fixes verified and timed apart
    "llama": ("tf32", "amp"),  # an HF decoder LM
    "moe": ("tf32", "amp"),  # a Mixtral-style MoE: 8 experts, top-2 routing
    "resnet": ("tf32", "amp", "channels_last"),  # a timm CNN
    "vit": ("tf32", "amp"),  # a timm vision transformer
    "unet": ("tf32", "amp", "channels_last"),  # a diffusers SD-style UNet (denoising loss)
    "lora": ("tf32", "amp"),  # a PEFT LoRA fine-tune of GPT-2
    "gnn": ("tf32", "amp"),  # message passing into an fp32 buffer: not bf16-clean
}
SWITCHES = {"tf32": "Tf32Switch", "amp": "AutocastBf16Switch",
            "channels_last": "ChannelsLastSwitch", "compile": "CompileSwitch"}
FRESH_BLOCK_MS = 1000.0  # a fresh process's block: 10 iterations, fewer where they take longer
COMPILE_CASES: set[str] = set()  # cases whose verification also tries compile (--compile)


def fixes(case: str) -> tuple[str, ...]:
    """The fixes a case verifies and times apart: its own, plus compile with --compile."""
    return CASES[case] + (("compile",) if case in COMPILE_CASES else ())


def build(case: str, smoke: bool, batch_size: int | None = None) -> tuple[Any, Any, Any]:
    """(model, optimizer, step function) of a case, on the GPU (CPU with --smoke);
    ``batch_size``: the LM and image cases' batch instead of their own."""
    import torch

    dev = "cpu" if smoke else "cuda"
    torch.manual_seed(0)
    if case in ("llama", "lora", "moe"):
        import transformers

        if case == "moe":
            cfg = transformers.MixtralConfig(
                hidden_size=64 if smoke else 1024, intermediate_size=128 if smoke else 1792,
                num_hidden_layers=2 if smoke else 4, num_attention_heads=4 if smoke else 16,
                num_key_value_heads=4 if smoke else 8, num_local_experts=8,
                num_experts_per_tok=2, vocab_size=512 if smoke else 32000)
            model = transformers.MixtralForCausalLM(cfg)
        elif case == "llama":
            cfg = transformers.LlamaConfig(
                hidden_size=64 if smoke else 1024, intermediate_size=128 if smoke else 2816,
                num_hidden_layers=2 if smoke else 8, num_attention_heads=4 if smoke else 16,
                num_key_value_heads=4 if smoke else 16, vocab_size=512 if smoke else 32000)
            model = transformers.LlamaForCausalLM(cfg)
        else:
            import peft

            cfg = transformers.GPT2Config(n_layer=2 if smoke else 12, n_embd=64 if smoke else 768,
                                          n_head=4 if smoke else 12, vocab_size=512 if smoke
                                          else 50257)
            model = peft.get_peft_model(transformers.GPT2LMHeadModel(cfg), peft.LoraConfig(
                r=16, lora_alpha=32, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True))
        model = model.to(dev)
        batch, seq = (2, 32) if smoke else (8, 512)
        batch = batch_size or batch
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)

        def lm_step(m: Any, opt: Any) -> None:
            loss = m(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        step = lm_step
    elif case == "unet":
        step = _unet(dev, smoke)
        model = step.model  # type: ignore[attr-defined]
    elif case == "gnn":
        model = MessagePassing(256 if not smoke else 16).to(dev)
        nodes, edges = (200 if smoke else 200_000), (1000 if smoke else 2_000_000)
        g = torch.Generator(device=dev).manual_seed(0)
        feats = torch.randn(nodes, model.width, device=dev, generator=g)
        src = torch.randint(0, nodes, (edges,), device=dev, generator=g)
        dst = torch.randint(0, nodes, (edges,), device=dev, generator=g)
        target = torch.randn(nodes, model.width, device=dev, generator=g)

        def gnn_step(m: Any, opt: Any) -> None:
            loss = torch.nn.functional.mse_loss(m(feats, src, dst).float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        step = gnn_step
    else:
        import timm

        name = "resnet50" if case == "resnet" else "vit_base_patch16_224"
        model = timm.create_model(name, pretrained=False, num_classes=1000).to(dev)
        batch = batch_size or (2 if smoke else 64)
        x = torch.randn(batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)

        def img_step(m: Any, opt: Any) -> None:
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        step = img_step
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=not smoke)
    return model, opt, step


def _unet(dev: str, smoke: bool) -> Any:
    """An SD-style conditional UNet (diffusers) trained on the denoising loss, latents 4x64x64
    and 77 text tokens of 768 (widths halved from SD 1.5 to fit the GPU time)."""
    import diffusers
    import torch

    model = diffusers.UNet2DConditionModel(
        sample_size=8 if smoke else 64, in_channels=4, out_channels=4,
        block_out_channels=(32, 64, 64, 64) if smoke else (160, 320, 640, 640),
        layers_per_block=1 if smoke else 2, cross_attention_dim=32 if smoke else 768,
        attention_head_dim=8, norm_num_groups=32).to(dev)
    batch, size = (2, 8) if smoke else (16, 64)
    latents = torch.randn(batch, 4, size, size, device=dev)
    noise = torch.randn_like(latents)
    text = torch.randn(batch, 77, 32 if smoke else 768, device=dev)
    t = torch.randint(0, 1000, (batch,), device=dev)

    def unet_step(m: Any, opt: Any) -> None:
        pred = m(latents + noise, t, encoder_hidden_states=text).sample
        loss = torch.nn.functional.mse_loss(pred.float(), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    unet_step.model = model  # type: ignore[attr-defined]
    return unet_step


def _message_passing() -> Any:
    import torch

    class MessagePassingNet(torch.nn.Module):
        """Graph message passing the way hand-written GNN code does it: messages summed into
        a float32 buffer with ``index_add_``. Under bf16 autocast the messages are bf16 and
        ``index_add_`` refuses the mix: this loop is not bf16-clean as written."""

        def __init__(self, width: int, layers: int = 4) -> None:
            super().__init__()
            self.width = width
            self.msg = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
            self.upd = torch.nn.ModuleList(torch.nn.Linear(2 * width, width)
                                           for _ in range(layers))

        def forward(self, x: Any, src: Any, dst: Any) -> Any:
            for msg, upd in zip(self.msg, self.upd, strict=True):
                agg = torch.zeros(x.shape[0], self.width, device=x.device)
                agg.index_add_(0, dst, msg(x)[src])
                x = torch.relu(upd(torch.cat([x, agg], dim=1)))
            return x

    return MessagePassingNet


def MessagePassing(width: int) -> Any:  # a class made on first use (imports torch)
    return _message_passing()(width)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_variant(case: str, variant: str, smoke: bool) -> dict[str, Any]:
    """A fresh process: the fix applied from the start, synchronized blocks, no hook."""
    from tb_gpuprof.capture import switches

    model, opt, step = build(case, smoke)
    applied = []
    for fix in variant.split("+") if variant != "baseline" else ():
        sw = getattr(switches, SWITCHES[fix])(model, opt, **(
            {"require_cuda": False} if smoke and fix == "tf32" else {}))
        why = sw.unavailable()
        if why:
            return {"error": why}
        sw.apply()
        applied.append(sw)
    warm, blocks, per = (2, 3, 2) if smoke else (10, 8, 10)
    try:
        for i in range(warm):
            if i == warm - 1:
                _sync()
                t = time.perf_counter()
            step(model, opt)
    except Exception as e:  # a fix this loop cannot take
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    broken = [sw.failure for sw in applied if getattr(sw, "failure", None)]
    if broken:  # the switch fell back to the loop as it was (the gnn under autocast)
        return {"error": broken[0][:300]}
    _sync()
    if not smoke:  # a slow loop (the UNet): blocks of about a second, at least 3 iterations
        warm_ms = (time.perf_counter() - t) * 1e3
        per = max(3, min(per, round(FRESH_BLOCK_MS / max(warm_ms, 1e-3))))
    times = []
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(per):
            step(model, opt)
        _sync()
        times.append((time.perf_counter() - t) * 1e3 / per)
    return {"median_ms": statistics.median(times), "blocks_ms": times, "block_iterations": per}


def run_verify(case: str, out: str, smoke: bool, max_s: float) -> dict[str, Any]:
    """The hooked run: the window, then verify= on the case's fixes."""
    from tb_gpuprof.torch import GpuProfiler

    model, opt, step = build(case, smoke)
    run = os.path.join(out, "runs", case)
    probe = _dispatch_probe(model, opt, step) if max_s <= 0 else None
    t0 = time.perf_counter()
    its = 0
    # --max-s 0 (the recording alone): no always-on memory readings, which reset the
    # allocator's peak statistics (docs/pytorch.md), so the window's own peak can be read
    with GpuProfiler(run, iter_start=10, iter_stop=12, model=model, optimizer=opt,
                     memory=max_s > 0,
                     verify=list(fixes(case)) if max_s > 0 else False, verify_max_s=max(max_s, 1.0),
                     verify_compile=case in COMPILE_CASES) as prof:
        at_window: dict[str, Any] = {}
        while its < 6000:
            step(model, opt)
            prof.step()
            its += 1
            if its in (10, 12):  # the window's edges: the allocator's own figures
                at_window.update(_allocator_edge(its == 10))
            if its == 13:
                prof.wait()
            if prof._verify_state == "done" or (max_s <= 0 and its > 13):
                break  # verified, or (--max-s 0) the window recorded and reported
        after_ms = []
        for _ in range(3 if smoke else 30):  # training goes on: the hook's own timing
            t = time.perf_counter()
            step(model, opt)
            prof.step()
            after_ms.append((time.perf_counter() - t) * 1e3)
    report = prof.report or {}
    # the run (trace, stored report, context) as one file: --reanalyze re-predicts from it
    if os.path.isdir(run):
        shutil.make_archive(run, "gztar", os.path.dirname(run), os.path.basename(run))
        shutil.rmtree(run, ignore_errors=True)
    return {"iterations": its, "seconds": time.perf_counter() - t0,
            "memory_truth": _memory_truth(model, opt),
            "fragmentation_check": _fragmentation_check(at_window, report),
            "dispatch_probe": probe,
            # the hook's own probe (env unprofiled.host_probe) and the window's un-profiled time
            "unprofiled": (prof.env or {}).get("unprofiled"),
            "memory_peak_parts": [
                d.get("peak_parts") for d in (report.get("memory") or {}).get("devices", [])],
            "verification": report.get("verification"),
            "recommendations": [{k: r.get(k) for k in (
                "id", "estimated_saving_pct", "estimated_saving_ms", "predicted_iteration_ms",
                "estimated_range_pct", "estimate_basis", "verified")}
                                for r in report.get("recommendations") or []]}


def _memory_truth(model: Any, opt: Any) -> dict[str, Any]:
    """What the memory peak's parts must match (issue 40): the parameters' and optimizer
    state's bytes, and the allocator's own figures now (after training went on)."""
    import torch

    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    truth: dict[str, Any] = {
        "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state),
        "optimizer_state_cuda_bytes": sum(t.numel() * t.element_size() for t in state
                                          if t.is_cuda)}
    if torch.cuda.is_available():
        stats = torch.cuda.memory_stats()
        truth.update({k: stats.get(k) for k in (
            "allocated_bytes.all.current", "reserved_bytes.all.current",
            "allocated_bytes.all.peak", "inactive_split_bytes.all.current")})
    return truth


def _dispatch_probe(model: Any, opt: Any, step: Any, warm: int = 5, n: int = 5
                    ) -> dict[str, Any] | None:
    """The host's own dispatch time, without the profiler (a study for issue 38's host
    scale): after a few warm-up steps, each probed step starts on an idle GPU (synchronised),
    so its launches find an empty queue; the host's time to the end of the forward and to the
    end of the step (no sync at its end) against the GPU's time for the same work (events).
    Where the host's time is well under the GPU's, it did not wait for the GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    for _ in range(warm):
        step(model, opt)
    marks: dict[str, Any] = {}

    def at_forward_end(module: Any, args: Any, output: Any) -> None:
        marks["fwd_t"] = time.perf_counter()
        marks["fwd_e"] = torch.cuda.Event(enable_timing=True)
        marks["fwd_e"].record()

    handle = model.register_forward_hook(at_forward_end)
    rows = []
    try:
        for _ in range(n):
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            t = time.perf_counter()
            step(model, opt)
            t_end = time.perf_counter()
            end.record()
            torch.cuda.synchronize()
            rows.append({"host_forward_ms": (marks["fwd_t"] - t) * 1e3,
                         "host_step_ms": (t_end - t) * 1e3,
                         "gpu_forward_ms": start.elapsed_time(marks["fwd_e"]),
                         "gpu_step_ms": start.elapsed_time(end)})
    finally:
        handle.remove()
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} | {"steps": n}


def _allocator_edge(start: bool) -> dict[str, Any]:
    """At the window's start: the reserve, then the peaks reset (the benchmark's own state, not
    the hook's); at its end: the peaks over the window and the reserve now."""
    import torch

    if not torch.cuda.is_available():
        return {}
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    if start:
        torch.cuda.reset_peak_memory_stats()
        return {"reserved_at_start": stats.get("reserved_bytes.all.current"),
                "segments_at_start": stats.get("segment.all.current")}
    return {k.replace(".all.", "_").replace("_bytes", ""): stats.get(k) for k in (
        "allocated_bytes.all.peak", "reserved_bytes.all.peak", "reserved_bytes.all.current",
        "segment.all.current", "num_alloc_retries")}


def _fragmentation_check(at: dict[str, Any], report: dict[str, Any]) -> dict[str, Any] | None:
    """The report's reserved-but-unallocated bytes at the window's peak against the allocator's
    own: where the reserve stayed the same through the window (no segment added or released),
    the reserve at the peak is known, and the allocation at the peak is the window's
    ``allocated_bytes.all.peak`` (with --max-s 0 only: the hook's always-on memory readings
    reset the peak statistics at iteration ends)."""
    if not at.get("reserved_at_start") or not at.get("allocated_peak"):
        return None
    constant = at["reserved_at_start"] == at.get("reserved_peak") == at.get("reserved_current")
    measured = at["reserved_current"] - at["allocated_peak"] if constant else None
    devices = (report.get("memory") or {}).get("devices") or []
    parts = next((d.get("peak_parts") for d in devices if d.get("peak_parts")), None) or {}
    reported = (parts.get("fragmentation") or {}).get("bytes")
    return {**at, "reserve_constant": constant, "measured_bytes": measured,
            "reported_bytes": reported, "reported_allocated_bytes": parts.get("allocated_bytes"),
            "difference_bytes": None if measured is None or reported is None
            else reported - measured}


def _child(args: list[str], timeout: float) -> dict[str, Any]:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True,
                       text=True, timeout=timeout, check=False)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stderr or p.stdout)[-2000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--max-s", type=float, default=200.0, help="verify_max_s per case; 0: "
                    "record the window and its report only (no verification, no fresh runs)")
    ap.add_argument("--compile", default="", help="cases that also verify torch.compile "
                    "(verify_compile=True; the compile time is the trial's own cost)")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--verify-case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    smoke = ["--smoke"] if args.smoke else []
    COMPILE_CASES.update(c for c in args.compile.split(",") if c)
    smoke += ["--compile", args.compile] if args.compile else []
    if args.variant:
        case, variant = args.variant.split(":")
        print("RESULT " + json.dumps(run_variant(case, variant, args.smoke)))
        return 0
    if args.verify_case:
        print("RESULT " + json.dumps(run_verify(args.verify_case, args.out, args.smoke,
                                                args.max_s), default=str))
        return 0
    os.makedirs(args.out, exist_ok=True)
    results: dict[str, Any] = {}
    for case in args.cases.split(","):
        t = time.perf_counter()
        res: dict[str, Any] = {"fresh": {}}
        res["verify"] = _child(["--out", args.out, "--verify-case", case,
                                "--max-s", str(args.max_s), *smoke],
                               args.max_s + (500 if case in COMPILE_CASES else 200))
        for variant in fresh_variants(case, res["verify"]) if args.max_s > 0 else ():
            res["fresh"][variant] = _child(["--out", args.out, "--variant",
                                            f"{case}:{variant}", *smoke], 300)
        res["seconds"] = time.perf_counter() - t
        results[case] = res
        print(f"{case}: {res['seconds']:.0f} s", flush=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    print(summary(results))
    return 0


def _trials(verify: dict[str, Any]) -> dict[str, Any]:
    return ((verify or {}).get("verification") or {}).get("trials") or {}


def fresh_variants(case: str, verify: dict[str, Any]) -> list[str]:
    """The fresh processes that time each fix from the state its trial started from: a fix
    measured after another (``measured_after``) is timed as that one alone, then both."""
    variants = ["baseline"]
    trials = _trials(verify)
    for fix in fixes(case):
        first = (trials.get(fix) or {}).get("measured_after")
        for v in ([first, f"{first}+{fix}"] if first else [fix]):
            if v not in variants:
                variants.append(v)
    return variants


def _predicted_pct(rec: dict[str, Any] | None) -> float | None:
    """The prediction as a share of the iteration it starts from (the prerequisite's, for a
    fix counted after another), which is what its trial measures."""
    if not rec or rec.get("estimated_saving_ms") is None or not rec.get("predicted_iteration_ms"):
        return (rec or {}).get("estimated_saving_pct")
    saved = rec["estimated_saving_ms"]
    return round(100 * saved / (rec["predicted_iteration_ms"] + saved), 1)


def summary(results: dict[str, Any]) -> str:
    from tb_gpuprof.analysis.savings import MIN_SAVING_PCT
    rows = ["| case | fix | from | predicted | verified in the loop | fresh processes | "
            "verified − fresh |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for case, res in results.items():
        ver = (res.get("verify") or {})
        recs = {r["id"]: r for r in ver.get("recommendations") or []}
        trials = _trials(ver)
        for fix in ("aa", *fixes(case)):
            trial = trials.get(fix) or {}
            first = trial.get("measured_after")
            start = (res["fresh"].get(first or "baseline") or {})
            end = res["fresh"].get(f"{first}+{fix}" if first else fix) or {}
            fresh, base = end.get("median_ms"), start.get("median_ms")
            fresh_pct = 100 * (1 - fresh / base) if fresh and base else None
            fresh_txt = (f"{fresh_pct:.1f}%" if fresh_pct is not None
                         else str(end.get("error") or "–")[:60])
            v = trial.get("saving_pct")
            pred: Any = _predicted_pct(recs.get(fix))
            if pred is None and first and fix != "aa":  # left out after its prerequisite
                pred = f"left out (< {MIN_SAVING_PCT:g}%)"
            gap = f"{v - fresh_pct:+.1f}" if v is not None and fresh_pct is not None else "–"
            rows.append(f"| {case} | {fix} | {first or 'as is'} | "
                        f"{pred if pred is not None else '–'} | "
                        f"{trial.get('verdict', ver.get('error', '–'))} | {fresh_txt} | {gap} |")
        section = ver.get("verification") or {}
        rows.append(f"| {case} | (run) | – | – | {section.get('iterations')} it, "
                    f"{section.get('seconds')} s, blocks {section.get('block_iterations')}, "
                    f"noise {section.get('noise_pct')}%, restored {section.get('restored')}, "
                    f"before {section.get('before_ms')} / after {section.get('after_ms')} ms "
                    f"(within noise: {section.get('after_within_noise')}) | – | – |")
    rows.append("")
    rows.append("fresh baselines, ms/iteration: " + "; ".join(
        f"{case} {v}: {(r or {}).get('median_ms', 0):.2f}" for case, res in results.items()
        for v, r in res["fresh"].items() if (r or {}).get("median_ms")))
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
