"""What the capture hooks cost a training loop: always on, while the window's analysis runs,
and after the window (issue 13), on a launch-bound and a GPU-bound workload.

Workloads (``--workload``): ``gpt2``, an eager HF GPT-2 in bf16 built from
``transformers.GPT2Config`` (no download; launch-bound, ~30 ms per iteration on an H200), and
``resnet50``, ResNet-50 AMP fp16 channels_last batch 256 (GPU-bound). Hooks (``--hook``):
``torch`` (GpuProfiler), ``lightning`` (GpuProfCallback), ``keras-jax`` / ``keras-torch``
(Keras 3 GpuProfCallback; its own model, see keras_step), plus two references that show
what the measurement catches: ``plain-profiler`` (torch.profiler for 3 steps, CUPTI left
subscribed) and ``plain-profiler-teardown`` (the same with TEARDOWN_CUPTI=1).

How it measures, in one process per (hook, workload):

1. always-on: ABBA groups of a bare block against a hooked block (a fresh always-on hook per
   block for torch; Keras and Lightning forward the fit's batches to one callback only in
   hooked blocks). Ratio: median over pairs of hooked / bare.
2. one window [5, 8) on a hook, then blocks until >= ``--after`` iterations ran after the
   window's analysis finished. CUPTI's state and the analysis child's CPU use are
   process-wide, so they weigh on a bare block as much as on a hooked one: the during- and
   after-analysis ratios compare those blocks with the bare blocks of step 1 (medians).

Every block is timed on the host between two device synchronizations made by the harness,
in both arms, so no arm's queue spills into the other's time.

    python3 benchmarks/bench_hook_overhead.py --all --workload gpt2 --out $OUT/gpt2     # GPU
    python3 benchmarks/bench_hook_overhead.py --all --workload resnet50 --out $OUT/rn50
    python3 benchmarks/bench_hook_overhead.py --all --smoke              # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

HOOKS = ("torch", "lightning", "keras-jax", "keras-torch", "plain-profiler",
         "plain-profiler-teardown")
WORKLOADS = ("gpt2", "resnet50")
WINDOW = (5, 8)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hook", choices=HOOKS, default="torch")
    ap.add_argument("--workload", choices=WORKLOADS, default=None,
                    help="default gpt2; with --all: only this workload (default: both)")
    ap.add_argument("--all", action="store_true", help="every hook x workload, one process each")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and counts (CPU check)")
    ap.add_argument("--block", type=int, default=10, help="iterations per timed block")
    ap.add_argument("--groups", type=int, default=3, help="ABBA groups for the always-on ratio")
    ap.add_argument("--after", type=int, default=100,
                    help="iterations to time after the window's analysis finished")
    ap.add_argument("--out", default=None, help="a directory for the JSON figures")
    ap.add_argument("--hooks", default=",".join(HOOKS), help="with --all: these hooks")
    ap.add_argument("--timeout", type=float, default=300, help="with --all: per process (s)")
    args = ap.parse_args(argv)
    args.workloads = [args.workload] if args.workload else list(WORKLOADS)
    args.hooks = [h for h in args.hooks.split(",") if h]
    if any(h not in HOOKS for h in args.hooks):
        ap.error(f"--hooks: choose from {', '.join(HOOKS)}")
    args.workload = args.workload or "gpt2"
    if args.smoke:
        args.block, args.groups, args.after = 3, 1, 6
    return args


# -- workloads (torch) ------------------------------------------------------------------------

def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpt2_step(smoke: bool) -> tuple[Any, Callable[[], None]]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    dev = device()
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000) if smoke else GPT2Config()
    model = GPT2LMHeadModel(cfg).to(dev)
    model.config._attn_implementation = "eager"
    batch, seq = (2, 32) if smoke else (8, 256)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()

    return model, step


def resnet50_step(smoke: bool) -> tuple[Any, Callable[[], None]]:
    import torch
    import torch.nn.functional as F

    dev = device()
    try:
        import torchvision

        model = torchvision.models.resnet18(num_classes=10) if smoke else \
            torchvision.models.resnet50()
    except ImportError:
        if not smoke:
            raise
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(8, 10))
    model = model.to(dev).to(memory_format=torch.channels_last)
    batch, image = (4, 32) if smoke else (256, 224)
    amp = torch.float16 if dev == "cuda" else torch.bfloat16
    x = torch.randn(batch, 3, image, image, device=dev).contiguous(
        memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(dev, enabled=amp == torch.float16)
    torch.backends.cudnn.benchmark = True

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=amp):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return model, step


# -- the measurement --------------------------------------------------------------------------

def cpu_probe_ms() -> float:
    """A fixed pure-Python workload (no CUDA, so CUPTI cannot touch it), timed: the host's
    speed right now. The VM's vCPUs run a launch-bound loop 25-50% faster or slower from one
    second to the next; dividing each block by the probe run just before it takes that out."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        acc = 0
        for i in range(20000):
            acc += i * i % 7
        table = {i: i for i in range(3000)}
        acc += sum(table.values())
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _bootstrap(stat: Callable[[random.Random], float], n: int = 1000) -> list[float]:
    rng = random.Random(0)
    vals = sorted(stat(rng) for _ in range(n))
    return [round(vals[int(0.05 * n)], 4), round(vals[int(0.95 * n) - 1], 4)]


class Plan:
    """Blocks to time, the window, and what came of them (framework-free bookkeeping).

    Every block is (ms/iteration, probe ms just before it): ratios are given raw and
    probe-normalised (``*_norm``), each with a 90% bootstrap interval."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pairs: list[tuple[tuple[float, float], tuple[float, float]]] = []
        self.bare: list[tuple[float, float]] = []
        self.during: list[tuple[float, float]] = []
        self.after: list[tuple[float, float]] = []
        self.after_iterations = 0
        self.probe_now = 0.0

    def start_block(self) -> None:
        self.probe_now = cpu_probe_ms()

    def always_on_order(self) -> list[bool]:
        """hooked? per block, ABBA groups: bare, hooked, hooked, bare."""
        return [False, True, True, False] * self.args.groups

    def record_always_on(self, times: list[tuple[bool, float, float]]) -> None:
        bare = [(ms, pr) for hooked, ms, pr in times if not hooked]
        hooked = [(ms, pr) for h, ms, pr in times if h]
        self.bare = bare
        self.pairs = list(zip(bare, hooked, strict=True))

    def record_post(self, ms: float, analysis_was_running: bool) -> bool:
        """One block after the window; False once enough iterations ran after the analysis."""
        if analysis_was_running:
            self.during.append((ms, self.probe_now))
        else:
            self.after.append((ms, self.probe_now))
            self.after_iterations += self.args.block
        return self.after_iterations < self.args.after

    def _ratios(self, norm: bool) -> dict[str, Any]:
        probes = [pr for _, pr in self.bare] or [1.0]
        ref = statistics.median(probes)

        def val(b: tuple[float, float]) -> float:
            return b[0] * ref / b[1] if norm and b[1] > 0 else b[0]

        base = [val(b) for b in self.bare]
        pair_r = [val(h) / val(b) for b, h in self.pairs]
        out: dict[str, Any] = {}
        if pair_r:
            out["always_on_ratio"] = round(statistics.median(pair_r), 4)
            out["always_on_ci90"] = _bootstrap(lambda r: statistics.median(
                r.choices(pair_r, k=len(pair_r))))
        for name, xs in (("during_analysis", self.during), ("after_window", self.after)):
            vals = [val(b) for b in xs]
            if not vals or not base:
                out[f"{name}_ratio"] = None
                continue
            out[f"{name}_ratio"] = round(statistics.median(vals) / statistics.median(base), 4)
            out[f"{name}_ci90"] = _bootstrap(lambda r, v=vals: statistics.median(
                r.choices(v, k=len(v))) / statistics.median(r.choices(base, k=len(base))))
        return out

    def result(self, extra: dict[str, Any]) -> dict[str, Any]:
        base = statistics.median(ms for ms, _ in self.bare) if self.bare else None
        raw = self._ratios(False)
        norm = {f"{k}_norm" if "_ci90" not in k else k.replace("_ci90", "_norm_ci90"): v
                for k, v in self._ratios(True).items()}
        bare_ms = [ms for ms, _ in self.bare]
        bare_pr = [pr for _, pr in self.bare]
        corr = None
        if len(bare_ms) > 3 and statistics.pstdev(bare_ms) > 0 and statistics.pstdev(bare_pr) > 0:
            corr = round(statistics.correlation(bare_ms, bare_pr), 3)
        return {**extra, "block_iterations": self.args.block,
                "bare_ms": round(base, 3) if base else None, **raw, **norm,
                "probe_block_correlation": corr,
                "blocks": {"pairs": len(self.pairs), "during": len(self.during),
                           "after": len(self.after)},
                "after_iterations": self.after_iterations,
                "raw_blocks": {"bare": self.bare, "pairs": self.pairs, "during": self.during,
                               "after": self.after}}


def timed(run: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    run()
    sync()
    return (time.perf_counter() - t0) * 1e3


def bench_torch(args: argparse.Namespace, plain: str | None) -> dict[str, Any]:
    import torch

    from tb_gpuprof.torch import GpuProfiler

    model, step = (gpt2_step if args.workload == "gpt2" else resnet50_step)(args.smoke)
    n = args.block
    logdir = tempfile.mkdtemp(prefix="bench_hook_overhead_")
    for _ in range(3):
        timed(lambda: [step() for _ in range(n)])  # warm-up: allocator, cudnn autotuning
    plan = Plan(args)

    def block(prof: Any) -> None:
        for _ in range(n):
            step()
            if prof is not None:
                prof.step()

    times = []
    for hooked in plan.always_on_order():
        prof = GpuProfiler(os.path.join(logdir, "always_on")).start() if hooked else None
        plan.start_block()
        times.append((hooked, timed(lambda p=prof: block(p)) / n, plan.probe_now))
        if prof is not None:
            prof.close()
    plan.record_always_on(times)

    if plain is None:
        prof = GpuProfiler(os.path.join(logdir, "window"), iter_start=WINDOW[0],
                           iter_stop=WINDOW[1], model=model).start()
        window_prof = prof
        for _ in range(WINDOW[1] + 1):  # the window, untimed
            step()
            prof.step()

        def running() -> bool:
            return not window_prof.wait(0)
    else:
        if plain == "teardown":
            os.environ["TEARDOWN_CUPTI"] = "1"  # the reference run's own process only
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as p:
            for _ in range(WINDOW[1] - WINDOW[0]):
                step()
        p.export_chrome_trace(os.path.join(logdir, "plain.json"))
        prof = None

        def running() -> bool:
            return False
    while True:
        busy = running()
        plan.start_block()
        ms = timed(lambda: block(prof)) / n
        if not plan.record_post(ms, busy and running()):
            break
    analysis_s = None
    if prof is not None:
        prof.close()
        analysis_s = round(prof.analysis_seconds or 0.0, 2)
    return plan.result({"analysis_s": analysis_s,
                        "report": prof is not None and prof.report is not None})


def bench_lightning(args: argparse.Namespace) -> dict[str, Any]:
    """Lightning: the fit's batches go to a GpuProfCallback only in hooked blocks; a harness
    callback times blocks between synchronizations at batch boundaries."""
    import lightning as L
    import torch

    from tb_gpuprof.lightning import GpuProfCallback

    model, step = (gpt2_step if args.workload == "gpt2" else resnet50_step)(args.smoke)
    plan = Plan(args)
    n = args.block
    order = [False] * 3 + plan.always_on_order()  # 3 warm-up blocks
    always_on = GpuProfCallback(tempfile.mkdtemp(prefix="bench_light_on_"))
    window = GpuProfCallback(tempfile.mkdtemp(prefix="bench_light_win_"),
                             iter_start=WINDOW[0], iter_stop=WINDOW[1])

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model
            self.automatic_optimization = False

        def training_step(self, batch: Any, idx: int) -> None:
            step()

        def configure_optimizers(self) -> Any:
            return None

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(range(10**7), batch_size=None)

    class Harness(L.Callback):
        def __init__(self) -> None:
            self.i = 0
            self.t0 = 0.0
            self.times: list[tuple[bool, float, float]] = []
            self.phase = "always_on"
            self.busy = False

        def target(self) -> Any:
            b = self.i // n
            if self.phase == "always_on":
                return always_on if b < len(order) and order[b] else None
            return window

        def on_train_start(self, trainer: Any, pl: Any) -> None:
            always_on.on_train_start(trainer, pl)

        def on_train_batch_start(self, trainer: Any, pl: Any, batch: Any, idx: int) -> None:
            if self.i % n == 0:
                sync()
                plan.start_block()
                self.t0 = time.perf_counter()
                self.busy = window.profiler is not None and not window.profiler.wait(0)
            cb = self.target()
            if cb is not None:
                cb.on_train_batch_start(trainer, pl, batch, idx)

        def on_train_batch_end(self, trainer: Any, pl: Any, out: Any, batch: Any,
                               idx: int) -> None:
            cb = self.target()
            if cb is not None:
                cb.on_train_batch_end(trainer, pl, out, batch, idx)
            self.i += 1
            if self.i % n:
                return
            sync()
            ms = (time.perf_counter() - self.t0) * 1e3 / n
            b = self.i // n - 1
            if self.phase == "always_on":
                if b >= 3:
                    self.times.append((order[b], ms, plan.probe_now))
                if b == len(order) - 1:
                    plan.record_always_on(self.times)
                    always_on._close()
                    self.phase = "window"
                    window.on_train_start(trainer, pl)
                    for _ in range(WINDOW[1] + 1):  # the window, untimed
                        window.on_train_batch_start(trainer, pl, None, 0)
                        step()
                        window.on_train_batch_end(trainer, pl, None, None, 0)
                return
            running = window.profiler is not None and not window.profiler.wait(0)
            if not plan.record_post(ms, self.busy and running):
                trainer.should_stop = True

        def on_train_end(self, trainer: Any, pl: Any) -> None:
            window._close()

    trainer = L.Trainer(max_epochs=1, callbacks=[Harness()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1)
    trainer.fit(Module())
    last = window.last_profiler
    return plan.result({"analysis_s": round(last.analysis_seconds or 0.0, 2) if last else None,
                        "report": last is not None and last.report is not None})


def bench_keras(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """Keras 3 (its own model per workload: a GPT-like stack of small Dense/attention layers
    for ``gpt2``, keras.applications.ResNet50 for ``resnet50``)."""
    os.environ["KERAS_BACKEND"] = backend
    import keras
    import numpy as np

    from tb_gpuprof.keras import GpuProfCallback

    plan = Plan(args)
    n = args.block
    order = [False] * 3 + plan.always_on_order()
    if args.workload == "resnet50":
        size, batch = (32, 4) if args.smoke else (224, 128)
        model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3),
                                            classes=10)
        x = np.random.rand(batch, size, size, 3).astype("float32")
        y = np.random.randint(0, 10, batch)
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    else:
        seq, width, layers, batch = (16, 32, 2, 2) if args.smoke else (256, 768, 12, 8)
        inp = keras.Input((seq,), dtype="int32")
        h = keras.layers.Embedding(1000, width)(inp)
        for _ in range(layers):
            a = keras.layers.MultiHeadAttention(num_heads=4, key_dim=width // 4)(h, h)
            h = keras.layers.LayerNormalization()(h + a)
            f = keras.layers.Dense(4 * width, activation="gelu")(h)
            h = keras.layers.LayerNormalization()(h + keras.layers.Dense(width)(f))
        model = keras.Model(inp, keras.layers.Dense(1000)(h))
        x = np.random.randint(0, 1000, (batch, seq)).astype("int32")
        y = np.random.randint(0, 1000, (batch, seq))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    always_on = GpuProfCallback(tempfile.mkdtemp(prefix="bench_keras_on_"))
    window = GpuProfCallback(tempfile.mkdtemp(prefix="bench_keras_win_"),
                             iter_start=WINDOW[0], iter_stop=WINDOW[1])

    def ksync() -> None:
        if backend == "torch":
            sync()
        # JAX/TF: Keras makes the logs numbers before a batch end: the step has finished

    class Harness(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.i = 0
            self.t0 = 0.0
            self.times: list[tuple[bool, float, float]] = []
            self.phase = "always_on"
            self.busy = False
            self.skip = False

        def target(self) -> Any:
            b = self.i // n
            if self.phase == "always_on":
                return always_on if b < len(order) and order[b] else None
            return window

        def on_train_begin(self, logs: Any = None) -> None:
            for cb in (always_on, window):
                cb.set_model(self.model)
                cb.on_train_begin(logs)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self.i % n == 0:
                ksync()
                plan.start_block()
                self.t0 = time.perf_counter()
                self.busy = not window.wait(0)
                # blocks holding the window itself are neither during nor after it
                self.skip = self.phase == "window" and window.iteration <= WINDOW[1] + 1
            cb = self.target()
            if cb is not None:
                cb.on_train_batch_begin(self.i, logs)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            cb = self.target()
            if cb is not None:
                cb.on_train_batch_end(self.i, logs)
            self.i += 1
            if self.i % n:
                return
            ksync()
            ms = (time.perf_counter() - self.t0) * 1e3 / n
            b = self.i // n - 1
            if self.phase == "always_on":
                if b >= 3:
                    self.times.append((order[b], ms, plan.probe_now))
                if b == len(order) - 1:
                    plan.record_always_on(self.times)
                    self.phase = "window"
                return
            if not self.skip and not plan.record_post(ms, self.busy and not window.wait(0)):
                self.model.stop_training = True

        def on_train_end(self, logs: Any = None) -> None:
            for cb in (always_on, window):
                cb.on_train_end(logs)

    class Same(keras.utils.PyDataset):  # one fixed batch, "forever" (the fit stops itself)
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> Any:
            return x, y

    model.fit(Same(), epochs=1, verbose=0, callbacks=[Harness()])
    return plan.result({"analysis_s": None, "report": window.report is not None})


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    hook = args.hook
    if hook == "torch":
        res = bench_torch(args, None)
    elif hook.startswith("plain-profiler"):
        res = bench_torch(args, "teardown" if hook.endswith("teardown") else "stay")
    elif hook == "lightning":
        res = bench_lightning(args)
    else:
        res = bench_keras(args, hook.split("-", 1)[1])
    return {"hook": hook, "workload": args.workload, **res}


def run_all(args: argparse.Namespace) -> int:
    rows = []
    for workload in args.workloads:
        for hook in args.hooks:
            cmd = [sys.executable, os.path.abspath(__file__), "--hook", hook, "--workload",
                   workload, "--block", str(args.block), "--groups", str(args.groups),
                   "--after", str(args.after), "--json"]
            if args.smoke:
                cmd.append("--smoke")
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.timeout)
            except subprocess.TimeoutExpired as exc:
                proc = subprocess.CompletedProcess(cmd, "timeout", exc.stdout or "",
                                                   str(exc.stderr or "")[-300:] or "timeout")
                proc.stdout = proc.stdout if isinstance(proc.stdout, str) else ""
            took = time.perf_counter() - t0
            last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
            try:
                row = json.loads(last[0]) if proc.returncode == 0 and last else None
            except ValueError:
                row = None
            if row is None:
                err = (proc.stderr.strip().splitlines() or ["no output"])[-3:]
                row = {"hook": hook, "workload": workload,
                       "error": f"rc={proc.returncode}: " + " | ".join(err)[-400:]}
            row["seconds"] = round(took, 1)
            rows.append(row)
            print(format_row(row), flush=True)
            if args.out:  # after every process: a run cut short keeps what it measured
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, "bench_hook_overhead.json"), "w") as f:
                    json.dump(rows, f)
    return 0


def format_row(r: dict[str, Any]) -> str:
    head = f"{r['workload']:9s} {r['hook']:24s}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"

    def f(x: Any) -> str:
        return "   -  " if x is None else f"{x:6.3f}"

    def g(name: str) -> str:
        ci = r.get(f"{name}_ci90")
        return f"{f(r.get(f'{name}_ratio'))} [{ci[0]:.3f},{ci[1]:.3f}]" if ci else f(
            r.get(f"{name}_ratio"))

    def gn(name: str) -> str:
        ci = r.get(f"{name}_norm_ci90")
        return f"{f(r.get(f'{name}_ratio_norm'))} [{ci[0]:.3f},{ci[1]:.3f}]" if ci else f(
            r.get(f"{name}_ratio_norm"))

    return (f"{head} bare {r['bare_ms']:8.3f} ms | raw: always-on {g('always_on')} during "
            f"{g('during_analysis')} after {g('after_window')} | probe-normalised: always-on "
            f"{gn('always_on')} during {gn('during_analysis')} after {gn('after_window')} | "
            f"corr {r.get('probe_block_correlation')} blocks {r['blocks']}, "
            f"{r['seconds'] if 'seconds' in r else '?'} s")


def main() -> int:
    argv = sys.argv[1:]
    as_json = "--json" in argv
    args = parse_args([a for a in argv if a != "--json"])
    if args.all:
        print("workload  hook                     bare ms/iter     ratios: hooked / bare "
              "(1.01 = 1% slower)")
        return run_all(args)
    res = run_one(args)
    print(json.dumps(res) if as_json else format_row(res))
    if args.out and not as_json:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{args.hook}_{args.workload}.json"), "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
