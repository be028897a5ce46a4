"""What the capture hooks cost a training loop: always on, while the window's analysis runs,
and after the window (issue 13), on a launch-bound and a GPU-bound workload.

Workloads (``--workload``): ``gpt2``, an eager HF GPT-2 in bf16 built from
``transformers.GPT2Config`` (no download; launch-bound, ~30 ms per iteration on an H200), and
``resnet50``, ResNet-50 AMP fp16 channels_last batch 256 (GPU-bound). Hooks (``--hook``):
``torch`` (GpuProfiler), ``lightning`` (GpuProfCallback), ``keras-jax`` / ``keras-torch``
(Keras 3 GpuProfCallback; its own model, see keras_model), plus two references that show
what the measurement catches: ``plain-profiler`` (torch.profiler for 3 steps, CUPTI left
subscribed) and ``plain-profiler-teardown`` (the same with TEARDOWN_CUPTI=1); and ``none``,
the null of the design: the torch loop with no hook and, in each window's place, its 9
iterations unprofiled and a 2 s pause (its "after" blocks say what the design reads where
nothing was done).

How it measures, in one process per (hook, workload), in blocks of ``--block`` iterations,
each timed on the host between two device synchronizations made by the harness (in both
arms, so no arm's queue spills into the other's time) and between two runs of a pure-Python
probe that reads the host's state (benchmarks/overhead_stats.py: on the GPU machine the vCPU
switches between a fast and a slow state every few seconds, and the loop's speed with it):

1. always-on: ABBA groups of a bare block against a hooked block (a fresh always-on hook per
   block for torch; Keras and Lightning forward the fit's batches to one callback only in
   hooked blocks). Ratio: median over the adjacent pairs whose four probes agree on the host
   state, of hooked / bare.
2. ``--windows`` windows [5, 8), one after the other, each a fresh hook; after each, blocks
   until >= ``--after`` iterations ran after its analysis finished. CUPTI's state and the
   analysis child's CPU use are process-wide, so they weigh on a bare block as much as on a
   hooked one: each block during or after the analysis is compared with the median of the
   bare blocks of step 1 in the same host state; the ratio is the median of those.

Every block starts with ``LEAD_IN`` untimed iterations (in both arms): a hook started for one
block pays its one-time start-up there, as a run pays it once.

``--paired`` also runs, beside each hook's process, a control process (the bare loop in the
same framework), the two given turns block by block (overhead_stats.TurnCoordinator): each
treated block is compared with the control blocks just before and after it, i.e. with the
same seconds of the host's drift, and the ratios are divided by the bare blocks' own ratio
to the control (the two processes' fixed difference).

Each ratio comes with a 90% bootstrap interval, the count it is the median of, and the raw
ratio over all blocks (no state matching) for comparison. ``raw_blocks`` keeps every block.

    python3 benchmarks/bench_hook_overhead.py --all --workload gpt2 --out $OUT/gpt2     # GPU
    python3 benchmarks/bench_hook_overhead.py --all --workload resnet50 --out $OUT/rn50
    python3 benchmarks/bench_hook_overhead.py --all --paired --workload gpt2 --out $OUT/p
    python3 benchmarks/bench_hook_overhead.py --all --paired --cpus 4 --workload gpt2   # pinned
    python3 benchmarks/bench_hook_overhead.py --all --smoke              # CPU smoke test

``--cpus N`` pins every process (and so the hooks' threads and analysis process) to the same
N CPUs, ``--cpu-list`` to the CPUs named; gpu/loop_noise.py measures whether that calms the
launch-bound loop on a machine. With ``--paired --cpu-list C`` (one CPU) a pair's two processes
take turns on one vCPU and see its same state: the ``paired_matched`` ratios keep only the
blocks whose probes agree.

Each block also records its work (benchmarks/work_counter.py, ``work`` in the JSON): the
training thread's CPU time, context switches and, where the kernel has hardware counters, its
instructions; and the CPU time of the process's other Python threads (the hooks' writer and
sampler) as a share of the block's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from overhead_stats import (  # noqa: E402
    Block,
    Plan,
    TurnCoordinator,
    Turns,
    from_recorded,
    paired_summary,
)
from work_counter import WorkCounter  # noqa: E402

HOOKS = ("torch", "lightning", "keras-jax", "keras-torch", "plain-profiler",
         "plain-profiler-teardown", "none")
WORKLOADS = ("gpt2", "resnet50")
WINDOW = (5, 8)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hook", choices=HOOKS, default="torch")
    ap.add_argument("--workload", choices=WORKLOADS, default=None,
                    help="default gpt2; with --all: only this workload (default: both)")
    ap.add_argument("--all", action="store_true", help="every hook x workload, one process each")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and counts (CPU check)")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny models with the given counts (a CPU study of the harness)")
    ap.add_argument("--block", type=int, default=5, help="iterations per timed block")
    ap.add_argument("--groups", type=int, default=20,
                    help="ABBA groups for the always-on ratio")
    ap.add_argument("--windows", type=int, default=3, help="windows, one after the other")
    ap.add_argument("--after", type=int, default=100,
                    help="iterations to time after each window's analysis finished")
    ap.add_argument("--out", default=None, help="a directory for the JSON figures")
    ap.add_argument("--hooks", default=",".join(HOOKS), help="with --all: these hooks")
    ap.add_argument("--timeout", type=float, default=300, help="with --all: per process (s)")
    ap.add_argument("--cpus", type=int, default=0,
                    help="with --all: run every process on the first N allowed CPUs (the same "
                         "ones for a paired run's two processes; the hooks' threads and "
                         "analysis process inherit them); 0: wherever the OS puts them")
    ap.add_argument("--cpu-list", default="",
                    help="with --all: like --cpus, on these CPUs (comma-separated)")
    ap.add_argument("--paired", action="store_true",
                    help="with --all: run each hook's process in turn with a control process "
                         "(bare loop, same framework), block by block, for ratios against "
                         "blocks timed at the same moment")
    ap.add_argument("--control", action="store_true",
                    help="(internal) be the control process of a paired run")
    ap.add_argument("--recorded", default=None,
                    help="print a recorded --out JSON file's rows again (no measurement)")
    args = ap.parse_args(argv)
    args.workloads = [args.workload] if args.workload else list(WORKLOADS)
    args.hooks = [h for h in args.hooks.split(",") if h]
    if any(h not in HOOKS for h in args.hooks):
        ap.error(f"--hooks: choose from {', '.join(HOOKS)}")
    args.workload = args.workload or "gpt2"
    if args.smoke:
        args.block, args.groups, args.after, args.windows = 3, 1, 6, 2
    args.tiny_models = args.smoke or args.tiny
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

def timed(run: Callable[[], None], plan: Plan | None = None) -> float:
    sync()
    if plan is not None:
        plan.clock_started()
    t0 = time.perf_counter()
    run()
    sync()
    return (time.perf_counter() - t0) * 1e3


def new_plan(args: argparse.Namespace, torch_process: bool = True) -> Plan:
    return Plan(args.block, args.groups, args.after, args.windows,
                torch_launch_probe() if torch_process else None, turns=Turns.from_env(),
                control=args.control, work_counter=WorkCounter.open())


def torch_launch_probe() -> Callable[[], float]:
    """The CUDA launch probe: a tiny in-place add launched 200 times on the GPU, over the
    same op 200 times on a CPU tensor timed just before it (best of 3 each). Both go through
    the same dispatcher, so the host's speed cancels; CUPTI's callbacks are on the launch
    path only. On a machine without a GPU both are CPU ops (ratio ~1; smoke runs)."""
    import torch

    cpu, dev = torch.zeros(8), torch.zeros(8, device=device())

    def probe() -> float:
        sync()
        best_cpu = best_dev = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(200):
                cpu.add_(1.0)
            t1 = time.perf_counter()
            for _ in range(200):
                dev.add_(1.0)
            t2 = time.perf_counter()
            best_cpu, best_dev = min(best_cpu, t1 - t0), min(best_dev, t2 - t1)
        sync()
        return best_dev / best_cpu

    return probe


def process_state() -> dict[str, Any]:
    """What a hook could leave changed in the process: its threads, the GC, a profile or
    trace function, torch's profiler flag, TEARDOWN_CUPTI, the CPUs it may run on (recorded
    before the first window and at the end, to tell a leftover from noise)."""
    import gc
    import threading

    import torch

    return {"threads": sorted(t.name for t in threading.enumerate()), "tasks": native_threads(),
            "gc_enabled": gc.isenabled(), "gc_counts": list(gc.get_count()),
            "profile_fn": repr(sys.getprofile()), "trace_fn": repr(sys.gettrace()),
            "torch_profiler_enabled": bool(torch.autograd.profiler._is_profiler_enabled),
            "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI"),
            "cpus": sorted(os.sched_getaffinity(0))}


def native_threads() -> list[str]:
    """Every thread's name, native ones too (Kineto's, CUDA's): one left running takes CPU
    time that threading.enumerate() does not show."""
    names = []
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
            except OSError:  # ended since the listing
                pass
    except OSError:
        return []
    return sorted(names)


def bench_torch(args: argparse.Namespace, plain: str | None) -> dict[str, Any]:

    from tb_gpuprof.torch import GpuProfiler

    model, step = (gpt2_step if args.workload == "gpt2" else resnet50_step)(args.tiny_models)
    n = args.block
    logdir = tempfile.mkdtemp(prefix="bench_hook_overhead_")
    for _ in range(3):
        timed(lambda: [step() for _ in range(n)])  # warm-up: allocator, cudnn autotuning
    plan = new_plan(args)
    niceness = None  # the last window's analysis child's niceness

    def block(prof: Any, iterations: int = n) -> None:
        for _ in range(iterations):
            step()
            if prof is not None:
                prof.step()

    times: list[tuple[bool, Block]] = []
    for hooked in plan.always_on_order():
        plan.start_block()  # first: in a paired run, the hook starts in this process's turn
        prof = (GpuProfiler(os.path.join(logdir, "always_on")).start()
                if hooked and plain != "none" else None)
        block(prof, LEAD_IN)  # untimed, in both arms (BlockClock)
        times.append((hooked, plan.end_block(timed(lambda p=prof: block(p), plan) / n)))
        if prof is not None:
            prof.close()
    plan.record_always_on(times)

    if plain == "teardown":
        os.environ["TEARDOWN_CUPTI"] = "1"  # the reference run's own process only
    analysis, reports = [], []
    before = process_state()
    while plan.begin_window():
        window = window_torch(logdir, plan.window, model, step, plain)
        while True:
            busy = window is not None and not window.wait(0)
            plan.start_block()
            block(window, LEAD_IN)
            ms = timed(lambda w=window: block(w), plan) / n
            running = window is not None and not window.wait(0)
            if not plan.record_post(plan.end_block(ms), busy and running):
                break
        if window is not None:
            window.close()
            analysis.append(round(window.analysis_seconds or 0.0, 2))
            reports.append(window.report is not None)
            niceness = getattr(window, "analysis_niceness", None)
    return plan.result({"analysis_s": analysis, "report": all(reports) if reports else None,
                        "analysis_niceness": niceness,
                        "state_before": before, "state_after": process_state()})


def window_torch(logdir: str, k: int, model: Any, step: Callable[[], None],
                 plain: str | None) -> Any:
    """Run window ``k`` (untimed): the hook's own (returned, still open: its analysis runs
    on), or plain torch.profiler for 3 steps (None)."""
    import torch

    from tb_gpuprof.torch import GpuProfiler

    if plain == "none":  # the null: the window's iterations, unprofiled, and a pause
        for _ in range(WINDOW[1] + 1):
            step()
        time.sleep(2.0)
        return None
    if plain is None:
        prof = GpuProfiler(os.path.join(logdir, f"window{k}"), iter_start=WINDOW[0],
                           iter_stop=WINDOW[1], model=model).start()
        for _ in range(WINDOW[1] + 1):
            step()
            prof.step()
        return prof
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as p:
        for _ in range(WINDOW[1] - WINDOW[0]):
            step()
    p.export_chrome_trace(os.path.join(logdir, f"plain{k}.json"))
    return None


LEAD_IN = 1  # untimed iterations at a block's start, after its hook (if any) started


class BlockClock:
    """The block bookkeeping the Lightning and Keras harnesses share: blocks of ``n``
    iterations at batch boundaries, timed between two synchronizations, each after
    ``LEAD_IN`` untimed batches (in both arms): a hook started for one block pays its
    one-time start-up (threads, NVML, the first scalars) there, as a run pays it once."""

    def __init__(self, plan: Plan, n: int, sync_fn: Callable[[], None]) -> None:
        self.plan, self.n, self.sync = plan, n, sync_fn
        self.period = n + LEAD_IN
        self.i = 0  # batches seen
        self.b = 0  # the current block
        self.t0 = 0.0
        self.running = True  # False once a control process's coordinator ended the run

    def batch_start(self, prepare: Callable[[], None] | None = None) -> bool:
        """True at a block's first batch; ``prepare`` runs then (in a paired run: in this
        process's turn). The clock starts after the lead-in."""
        if not self.running:
            return False
        pos = self.i % self.period
        if pos == 0:
            self.b = self.i // self.period
            self.sync()
            self.running = self.plan.start_block()
            if not self.running:
                return False
            if prepare is not None:
                prepare()
        if pos == LEAD_IN:
            self.sync()
            self.plan.clock_started()
            self.t0 = time.perf_counter()
        return pos == 0

    def batch_end(self) -> Block | None:
        """The finished block at its last batch, else None."""
        self.i += 1
        if self.i % self.period or not self.running:
            return None
        self.sync()
        return self.plan.end_block((time.perf_counter() - self.t0) * 1e3 / self.n)


def lightning_fit(model: Any, step: Callable[[], None], callback: Any) -> None:
    """A Lightning fit that runs ``step`` (which owns its optimizer: manual optimization) for
    each batch of an endless loader, with ``callback``; it ends when the callback sets
    ``trainer.should_stop``."""
    import lightning as L
    import torch

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

    trainer = L.Trainer(max_epochs=1, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1)
    trainer.fit(Module())


def bench_lightning(args: argparse.Namespace) -> dict[str, Any]:
    """Lightning: the fit's batches go to a GpuProfCallback only in hooked blocks; a harness
    callback times blocks between synchronizations at batch boundaries; each window is a
    fresh callback, run untimed between two blocks."""
    import lightning as L

    from tb_gpuprof.lightning import GpuProfCallback

    model, step = (gpt2_step if args.workload == "gpt2" else resnet50_step)(args.tiny_models)
    plan = new_plan(args)
    clock = BlockClock(plan, args.block, sync)
    order = [False] * 3 + plan.always_on_order()  # 3 warm-up blocks
    always_on_dir = tempfile.mkdtemp(prefix="bench_light_on_")
    logdir = tempfile.mkdtemp(prefix="bench_light_win_")
    analysis: list[float] = []
    reports: list[bool] = []
    states: dict[str, Any] = {}

    class Harness(L.Callback):
        def __init__(self) -> None:
            self.times: list[tuple[bool, Block]] = []
            self.window: Any = None
            self.busy = False
            self.always_on: Any = None  # a fresh callback per hooked block, as for torch

        def target(self) -> Any:
            return self.window if self.window is not None else self.always_on

        def running(self) -> bool:
            prof = self.window.profiler if self.window is not None else None
            return prof is not None and not prof.wait(0)

        def on_train_batch_start(self, trainer: Any, pl: Any, batch: Any, idx: int) -> None:
            def hook_on() -> None:
                b = clock.b
                if self.window is None and b < len(order) and order[b]:
                    self.always_on = GpuProfCallback(always_on_dir)
                    self.always_on.on_train_start(trainer, pl)

            if clock.batch_start(hook_on):
                self.busy = self.running()
            cb = self.target()
            if cb is not None:
                cb.on_train_batch_start(trainer, pl, batch, idx)

        def on_train_batch_end(self, trainer: Any, pl: Any, out: Any, batch: Any,
                               idx: int) -> None:
            cb = self.target()
            if cb is not None:
                cb.on_train_batch_end(trainer, pl, out, batch, idx)
            blk = clock.batch_end()
            if blk is None:
                return
            if self.window is None:
                if self.always_on is not None:
                    self.always_on._close()
                    self.always_on = None
                b = clock.b
                if b >= 3:
                    self.times.append((order[b], blk))
                if b == len(order) - 1:
                    plan.record_always_on(self.times)
                    self.next_window(trainer, pl)
                return
            if not plan.record_post(blk, self.busy and self.running()):
                self.end_window()
                self.next_window(trainer, pl)

        def next_window(self, trainer: Any, pl: Any) -> None:
            states.setdefault("state_before", process_state())
            if not plan.begin_window():
                trainer.should_stop = True
                return
            self.window = GpuProfCallback(os.path.join(logdir, f"w{plan.window}"),
                                          iter_start=WINDOW[0], iter_stop=WINDOW[1])
            self.window.on_train_start(trainer, pl)
            for _ in range(WINDOW[1] + 1):  # the window, untimed
                self.window.on_train_batch_start(trainer, pl, None, 0)
                step()
                self.window.on_train_batch_end(trainer, pl, None, None, 0)

        def end_window(self) -> None:
            win, self.window = self.window, None
            win._close()
            last = win.last_profiler
            analysis.append(round(last.analysis_seconds or 0.0, 2) if last else -1.0)
            reports.append(last is not None and last.report is not None)

        def on_train_end(self, trainer: Any, pl: Any) -> None:
            if self.window is not None:
                self.end_window()
            states["state_after"] = process_state()

    lightning_fit(model, step, Harness())
    return plan.result({"analysis_s": analysis, "report": all(reports) if reports else None,
                        **states})


def keras_model(keras: Any, workload: str, smoke: bool) -> tuple[Any, Any, Any]:
    """(model, x, y): a GPT-like stack of small Dense/attention layers for ``gpt2``,
    keras.applications.ResNet50 for ``resnet50``."""
    import numpy as np

    if workload == "resnet50":
        size, batch = (32, 4) if smoke else (224, 128)
        model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3),
                                            classes=10)
        x = np.random.rand(batch, size, size, 3).astype("float32")
        y = np.random.randint(0, 10, batch)
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        return model, x, y
    seq, width, layers, batch = (16, 32, 2, 2) if smoke else (256, 768, 12, 8)
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
    return model, x, y


def same_batch(keras: Any, x: Any, y: Any) -> Any:
    """One fixed batch, "forever" (the harness stops the fit)."""

    class Same(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> Any:
            return x, y

    return Same()


def bench_keras(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """Keras 3, its own model per workload (keras_model); the harness forwards batches to an
    always-on callback in hooked blocks, then to one fresh window callback per window, whose
    blocks up to the window's end are neither during nor after it."""
    os.environ["KERAS_BACKEND"] = backend
    import keras

    from tb_gpuprof.keras import GpuProfCallback

    plan = new_plan(args, torch_process=backend == "torch")
    clock = BlockClock(plan, args.block, sync if backend == "torch" else lambda: None)
    # JAX/TF: Keras makes the logs numbers before a batch end, so the step has finished
    order = [False] * 3 + plan.always_on_order()
    model, x, y = keras_model(keras, args.workload, args.tiny_models)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    always_on_dir = tempfile.mkdtemp(prefix="bench_keras_on_")
    logdir = tempfile.mkdtemp(prefix="bench_keras_win_")
    reports: list[bool] = []

    class Harness(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[tuple[bool, Block]] = []
            self.window: Any = None
            self.phase = "always_on"
            self.busy = False
            self.skip = False
            self.always_on: Any = None  # a fresh callback per hooked block, as for torch

        def target(self) -> Any:
            return self.always_on if self.phase == "always_on" else self.window

        def hook_on(self) -> None:
            b = clock.b
            if self.phase == "always_on" and b < len(order) and order[b]:
                self.always_on = GpuProfCallback(always_on_dir)
                self.always_on.set_model(self.model)
                self.always_on.on_train_begin(None)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if clock.batch_start(self.hook_on) and self.window is not None:
                self.busy = not self.window.wait(0)
                # blocks holding the window itself are neither during nor after it
                self.skip = self.window.iteration <= WINDOW[1] + 1
            cb = self.target()
            if cb is not None:
                cb.on_train_batch_begin(clock.i, logs)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            cb = self.target()
            if cb is not None:
                cb.on_train_batch_end(clock.i, logs)
            blk = clock.batch_end()
            if blk is None:
                return
            if self.phase == "always_on":
                if self.always_on is not None:
                    self.always_on.on_train_end(None)
                    self.always_on = None
                b = clock.b
                if b >= 3:
                    self.times.append((order[b], blk))
                if b == len(order) - 1:
                    plan.record_always_on(self.times)
                    self.phase = "windows"
                    self.next_window()
                return
            if not self.skip and not plan.record_post(blk, self.busy and not
                                                      self.window.wait(0)):
                self.window.on_train_end(None)
                self.window.wait(300)
                reports.append(self.window.report is not None)
                self.next_window()

        def next_window(self) -> None:
            if not plan.begin_window():
                self.window = None
                self.model.stop_training = True
                return
            self.window = GpuProfCallback(os.path.join(logdir, f"w{plan.window}"),
                                          iter_start=WINDOW[0], iter_stop=WINDOW[1])
            self.window.set_model(self.model)
            self.window.on_train_begin(None)
            self.skip = True

    model.fit(same_batch(keras, x, y), epochs=1, verbose=0, callbacks=[Harness()])
    return plan.result({"analysis_s": None, "report": all(reports) if reports else None})


def bench_control(args: argparse.Namespace) -> dict[str, Any]:
    """A paired run's control: the workload's bare loop, in the hook's framework (plain
    torch for the torch hooks and Lightning, Keras on the same backend for Keras), timing a
    block whenever it is given a turn, until the treated process has finished."""
    n = args.block
    if not args.hook.startswith("keras-"):
        _, step = (gpt2_step if args.workload == "gpt2" else resnet50_step)(args.tiny_models)
        for _ in range(3):
            timed(lambda: [step() for _ in range(n)])
        plan = new_plan(args)
        while plan.start_block():
            for _ in range(LEAD_IN):
                step()
            plan.end_block(timed(lambda: [step() for _ in range(n)], plan) / n)
        return plan.control_result()
    backend = args.hook.split("-", 1)[1]
    os.environ["KERAS_BACKEND"] = backend
    import keras

    plan = new_plan(args, torch_process=backend == "torch")
    clock = BlockClock(plan, n, sync if backend == "torch" else lambda: None)
    model, x, y = keras_model(keras, args.workload, args.tiny_models)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    warm = 3 * n

    class Control(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if batch >= warm:
                clock.batch_start()
                if not clock.running:
                    self.model.stop_training = True

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch >= warm:
                clock.batch_end()

    model.fit(same_batch(keras, x, y), epochs=1, verbose=0, callbacks=[Control()])
    return plan.control_result()


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    hook = args.hook
    if args.control:
        if not args.hook.startswith("keras-"):
            args.hook = "torch"  # the torch hooks' control is one bare torch loop
        return {"hook": hook, "workload": args.workload, "control": True,
                **bench_control(args)}
    if hook == "torch":
        res = bench_torch(args, None)
    elif hook == "none":
        res = bench_torch(args, "none")
    elif hook.startswith("plain-profiler"):
        res = bench_torch(args, "teardown" if hook.endswith("teardown") else "stay")
    elif hook == "lightning":
        res = bench_lightning(args)
    else:
        res = bench_keras(args, hook.split("-", 1)[1])
    return {"hook": hook, "workload": args.workload, **res}


def child_cmd(args: argparse.Namespace, hook: str, workload: str) -> list[str]:
    cmd = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--hook", hook,
           "--workload", workload, "--block", str(args.block), "--groups", str(args.groups),
           "--after", str(args.after), "--windows", str(args.windows), "--json"]
    return cmd + (["--smoke"] if args.smoke else []) + (["--tiny"] if args.tiny else [])


def child_row(proc: subprocess.CompletedProcess[str], hook: str, workload: str,
              args: argparse.Namespace, tag: str = "") -> dict[str, Any]:
    """The child's JSON line, or an error row (its stderr saved: faulthandler's stacks)."""
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    try:
        row = json.loads(last[0]) if proc.returncode == 0 and last else None
    except ValueError:
        row = None
    if row is not None:
        return row
    err = (proc.stderr.strip().splitlines() or ["no output"])[-3:]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{hook}_{workload}{tag}.stderr"), "w") as f:
            f.write(str(proc.stderr))
    return {"hook": hook, "workload": workload,
            "error": f"rc={proc.returncode}: " + " | ".join(err)[-400:]}


def cpu_set(args: argparse.Namespace) -> set[int] | None:
    """--cpus N: the first N CPUs this process may run on; --cpu-list: those (None: no
    pinning)."""
    if args.cpu_list:
        return {int(c) for c in args.cpu_list.split(",")}
    if args.cpus <= 0:
        return None
    allowed = sorted(os.sched_getaffinity(0))
    return set(allowed[: args.cpus])


def pinned(args: argparse.Namespace) -> Callable[[], None] | None:
    """A preexec_fn that puts the child on --cpus' CPUs before it starts."""
    cpus = cpu_set(args)
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def run_single(args: argparse.Namespace, hook: str, workload: str) -> dict[str, Any]:
    cmd = child_cmd(args, hook, workload)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              preexec_fn=pinned(args))
    except subprocess.TimeoutExpired as exc:
        proc = subprocess.CompletedProcess(cmd, "timeout", "",
                                           str(exc.stderr or "")[-300:] or "timeout")
    return child_row(proc, hook, workload, args)


def run_paired(args: argparse.Namespace, hook: str, workload: str) -> dict[str, Any]:
    """The hook's process and a control process, given turns block by block."""
    coord = TurnCoordinator()
    env = dict(os.environ)
    if hook == "keras-jax":  # two JAX processes: each may preallocate only part of the GPU
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.4"
    procs, files = {}, {}
    for name, extra in (("a", []), ("b", ["--control"])):
        files[name] = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
        turn_env, fds = coord.child_env(name)
        procs[name] = subprocess.Popen(child_cmd(args, hook, workload) + extra,
                                       env={**env, **turn_env}, stdout=files[name][0],
                                       stderr=files[name][1], pass_fds=fds, text=True,
                                       preexec_fn=pinned(args))
    coord.started()
    timed_out = False
    try:
        coord.run(args.timeout)
    except TimeoutError:
        timed_out = True
        for p in procs.values():
            p.kill()
    finally:
        coord.close()
    out: dict[str, subprocess.CompletedProcess[str]] = {}
    for name, p in procs.items():
        try:
            rc: int | str = "timeout" if timed_out else p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        p.kill()  # a no-op once it has exited
        p.wait()
        with files[name][0] as stdout, files[name][1] as stderr:
            stdout.seek(0)
            stderr.seek(0)
            out[name] = subprocess.CompletedProcess([], rc, stdout.read(), stderr.read())
    row = child_row(out["a"], hook, workload, args)
    control = child_row(out["b"], hook, workload, args, tag="_control")
    if "error" in row:
        return row
    if "error" in control:
        row["control_error"] = control["error"]
        return row
    row["control_blocks"] = control["control_blocks"]
    row.update(paired_summary(row, control["control_blocks"]))
    return row


def run_all(args: argparse.Namespace) -> int:
    rows = []
    for workload in args.workloads:
        for hook in args.hooks:
            t0 = time.perf_counter()
            row = (run_paired if args.paired else run_single)(args, hook, workload)
            row["seconds"] = round(time.perf_counter() - t0, 1)
            if args.cpus > 0 or args.cpu_list:
                row["cpus"] = sorted(cpu_set(args) or ())
            rows.append(row)
            print(format_row(row), flush=True)
            if args.out:  # after every process: a run cut short keeps what it measured
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, "bench_hook_overhead.json"), "w") as f:
                    json.dump(rows, f)
    return 0


def format_ratio(x: float | None, ci: list[float] | None, n: int | None) -> str:
    txt = "   -  " if x is None else f"{x:6.3f}"
    if ci:
        txt += f" [{ci[0]:.3f},{ci[1]:.3f}]"
    return txt + f" n={n}"


def format_row(r: dict[str, Any]) -> str:
    head = f"{r['workload']:9s} {r['hook']:24s}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"

    def g(name: str) -> str:
        return (format_ratio(r.get(f"{name}_ratio"), r.get(f"{name}_ci90"), r.get(f"{name}_n"))
                + f" (raw {r.get(f'{name}_ratio_raw')})")

    return (f"{head} bare {r['bare_ms']:8.3f} ms | always-on {g('always_on')} | during "
            f"{g('during_analysis')} | after {g('after_window')} | launch probe during "
            f"{r.get('during_analysis_launch_ratio')} {r.get('during_analysis_launch_ci90')} "
            f"after {r.get('after_window_launch_ratio')} {r.get('after_window_launch_ci90')} "
            f"| blocks {r['blocks']}, {r.get('seconds', '?')} s" + format_paired(r)
            + format_work(r))


def format_work(r: dict[str, Any]) -> str:
    """The training thread's counts as ratios, the other threads' CPU share, the switches."""
    w = r.get("work")
    if not w:
        return ""
    parts = []
    for name in ("instructions", "cycles", "thread_cpu_ns"):
        if f"{name}_per_block_bare" not in w:
            continue
        parts.append(f"{name}: " + " | ".join(
            f"{phase} " + format_ratio(w.get(f"{phase}_{name}_ratio"),
                                       w.get(f"{phase}_{name}_ci90"), w.get(f"{phase}_{name}_n"))
            for phase in ("always_on", "during_analysis", "after_window")))
    phases = ("bare", "hooked", "during", "after")
    parts.append("other threads' CPU / wall: " + ", ".join(
        f"{ph} {w.get(f'{ph}_others_cpu_share')}" for ph in phases))
    parts.append("per block, switches voluntary/involuntary, minor faults: " + ", ".join(
        f"{ph} {w.get(f'{ph}_voluntary_switches_median')}/"
        f"{w.get(f'{ph}_involuntary_switches_median')}, {w.get(f'{ph}_minor_faults_median')}"
        for ph in phases))
    return "".join(f"\n{'':34s} {p}" for p in parts)


def format_paired(r: dict[str, Any]) -> str:
    if "paired_null_ratio" not in r:
        return f" | control ERROR {r['control_error']}" if "control_error" in r else ""

    def g(name: str, tag: str) -> str:
        return format_ratio(r.get(f"{name}_{tag}"), r.get(f"{name}_{tag}_ci90"),
                            r.get(f"{name}_{tag}_n"))

    out = ""
    if r.get("during_analysis_paired_mean") is not None:
        out += (f"\n{'':34s} paired, means: during "
                + format_ratio(r["during_analysis_paired_mean"],
                               r.get("during_analysis_paired_mean_ci90"),
                               r.get("during_analysis_paired_n"))
                + " | after " + format_ratio(r.get("after_window_paired_mean"),
                                             r.get("after_window_paired_mean_ci90"),
                                             r.get("after_window_paired_n")))
    for tag, what in (("paired", "paired with a control process"),
                      ("paired_matched", "... its blocks whose probes agree")):
        if f"{tag}_null_ratio" in r:
            out += (f"\n{'':34s} {what} (null {r[f'{tag}_null_ratio']} "
                    f"n={r[f'{tag}_null_n']}): always-on {g('always_on', tag)} | during "
                    f"{g('during_analysis', tag)} | after {g('after_window', tag)}")
    return out


def main() -> int:
    argv = sys.argv[1:]
    as_json = "--json" in argv
    args = parse_args([a for a in argv if a != "--json"])
    if args.recorded:
        with open(args.recorded) as f:
            recorded = json.load(f)
        for row in recorded if isinstance(recorded, list) else [recorded]:
            print(format_row(from_recorded(row)) if "raw_blocks" in row else format_row(row))
        return 0
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
