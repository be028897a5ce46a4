"""Always-on cost of GpuProfCallback with Keras 3 on the JAX backend (run on the GPU).

Two A/B measurements of the same compiled model, blocks interleaved ABBA against drift:

1. in one fit: a switch callback forwards every batch of the "on" blocks to a
   GpuProfCallback (no window) and none of the "off" blocks'; the callback's threads (scalar
   writer, NVML sampler) run throughout, so they weigh on both arms (their own cost is in
   bench_nvml.py). A block's time runs from the end of the previous block's last step to the
   end of its own, measured where Keras delivers batch ends (its worker thread, after the
   step's results exist): the device throughput, with Keras' async dispatch intact.
2. whole fits: ``fit`` of ``--block`` steps with a fresh GpuProfCallback against ``fit``
   without; this adds the per-fit cost (events file, NVML start/stop, run summary).

Prints the ratios (callback / bare; 1.01 = 1 % slower) and writes ``--out`` as JSON.

    python3 benchmarks/bench_keras_overhead.py --out $OUT/keras/bench_keras_overhead.json
    python3 benchmarks/bench_keras_overhead.py --tiny          # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the figures here as JSON")
    ap.add_argument("--backend", default="jax", choices=("jax", "tensorflow", "torch"))
    ap.add_argument("--tiny", action="store_true", help="small and short (CPU smoke test)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--block", type=int, default=50, help="steps per A/B block")
    ap.add_argument("--groups", type=int, default=8, help="ABBA groups (4 blocks each)")
    ap.add_argument("--fit-groups", type=int, default=4, help="ABBA groups of whole fits")
    args = ap.parse_args()
    if args.tiny:
        args.batch, args.image, args.block, args.groups, args.fit_groups = 8, 16, 6, 2, 1
    return args


ARGS = parse_args()
os.environ["KERAS_BACKEND"] = ARGS.backend  # before keras is imported
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu"))
from tb_gpuprof.keras import GpuProfCallback  # noqa: E402

ABBA = (True, False, False, True)


class Switch(keras.callbacks.Callback):
    """Forwards the batches of "on" blocks to ``inner``; timestamps every batch end."""

    async_safe = True

    def __init__(self, inner: GpuProfCallback, block: int, plan: list[bool]) -> None:
        super().__init__()
        self.inner, self.block, self.plan = inner, block, plan
        self.ends: dict[int, float] = {}
        self.forwarded: set[int] = set()
        self.lock = threading.Lock()

    def set_model(self, model):
        super().set_model(model)
        self.inner.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.inner.set_params(params)

    def on_train_begin(self, logs=None):
        self.inner.on_train_begin(logs)

    def on_train_end(self, logs=None):
        self.inner.on_train_end(logs)

    def on_epoch_begin(self, epoch, logs=None):
        self.inner.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self.inner.on_epoch_end(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        if self.plan[batch // self.block]:
            self.forwarded.add(batch)
            self.inner.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        t = time.perf_counter()
        with self.lock:
            self.ends[batch] = t
        if batch in self.forwarded:
            self.inner.on_train_batch_end(batch, logs)


def build(args: argparse.Namespace) -> keras.Model:
    from keras_jax_cnn import build_model  # the GPU script's CNN

    keras.utils.set_random_seed(0)
    model = build_model(args.image, args.tiny)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def batches(args: argparse.Namespace, distinct: int = 8):
    """Endless synthetic batches (a few distinct ones: a long run must not need GBs of RAM)."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((args.batch, args.image, args.image, 3), dtype=np.float32)
          for _ in range(distinct)]
    ys = [rng.integers(0, 10, args.batch) for _ in range(distinct)]
    while True:
        yield from zip(xs, ys, strict=True)


def in_fit(args: argparse.Namespace, model: keras.Model, logdir: str) -> dict:
    warm = 2  # blocks: compilation, then one settling block
    plan = [False] * warm + [on for _ in range(args.groups) for on in ABBA]
    sw = Switch(GpuProfCallback(logdir, iter_start=None), args.block, plan)
    model.fit(batches(args), steps_per_epoch=len(plan) * args.block, epochs=1, verbose=0,
              shuffle=False, callbacks=[sw])
    b = args.block
    per_step = {True: [], False: []}
    for i in range(warm, len(plan)):
        t = (sw.ends[(i + 1) * b - 1] - sw.ends[i * b - 1]) / b * 1e3
        per_step[plan[i]].append(t)
    on, off = statistics.median(per_step[True]), statistics.median(per_step[False])
    return {"blocks_each": len(per_step[True]), "steps_per_block": b,
            "step_ms_on_median": round(on, 4), "step_ms_off_median": round(off, 4),
            "ratio": round(on / off, 4),
            "ratio_of_means": round(statistics.fmean(per_step[True])
                                    / statistics.fmean(per_step[False]), 4),
            "batch_end_dispatch": "async" if sw.inner.batch_end_async else "sync"}


def whole_fits(args: argparse.Namespace, model: keras.Model, logdir: str) -> dict:
    data = batches(args)
    model.fit(data, steps_per_epoch=args.block, epochs=1, verbose=0, shuffle=False)  # warm
    times: dict[bool, list[float]] = {True: [], False: []}
    for g in range(args.fit_groups):
        for on in ABBA:
            cbs = [GpuProfCallback(os.path.join(logdir, f"fit_{g}_{len(times[on])}"))] \
                if on else []
            t0 = time.perf_counter()
            model.fit(data, steps_per_epoch=args.block, epochs=1, verbose=0, shuffle=False,
                      callbacks=cbs)
            times[on].append((time.perf_counter() - t0) / args.block * 1e3)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {"fits_each": len(times[True]), "steps_per_fit": args.block,
            "step_ms_on_median": round(on, 4), "step_ms_off_median": round(off, 4),
            "ratio": round(on / off, 4)}


def main() -> int:
    args = ARGS
    model = build(args)
    with tempfile.TemporaryDirectory(prefix="bench_keras_") as tmp:
        res = {"backend": args.backend, "keras": keras.__version__, "batch": args.batch,
               "image": args.image}
        res["in_fit"] = in_fit(args, model, os.path.join(tmp, "in_fit"))
        res["whole_fits"] = whole_fits(args, model, os.path.join(tmp, "fits"))
    a, w = res["in_fit"], res["whole_fits"]
    print(f"in one fit : callback {a['step_ms_on_median']:.3f} ms/step vs bare "
          f"{a['step_ms_off_median']:.3f} -> ratio {a['ratio']:.4f} (of means "
          f"{a['ratio_of_means']:.4f}; {a['blocks_each']} blocks of {a['steps_per_block']} "
          f"steps each; batch ends {a['batch_end_dispatch']})")
    print(f"whole fits : callback {w['step_ms_on_median']:.3f} ms/step vs bare "
          f"{w['step_ms_off_median']:.3f} -> ratio {w['ratio']:.4f} ({w['fits_each']} fits of "
          f"{w['steps_per_fit']} steps each, per-fit setup included)")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
