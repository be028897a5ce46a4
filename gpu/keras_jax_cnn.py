"""A small ResNet-style CNN trained with Keras 3 on the JAX backend, through GpuProfCallback
(run on the H200).

Two configs, the ``float32`` then the ``mixed_bfloat16`` dtype policy: batch 128 of synthetic
64x64 images, one epoch of ``--steps`` steps with a window of ``--window`` steps in its
middle. Each config is one run, ``<runs>/keras_<backend>_<config>``. Prints, per config, the
step time, the report's Tensor Core share, its top kernels with their Tensor Core use and
precision, and the recommendation ids; writes ``<out>/keras_jax_cnn.json`` and the text
report of each run beside it.

    python3 gpu/keras_jax_cnn.py --out $OUT/keras --runs /tmp/keras_runs
    python3 gpu/keras_jax_cnn.py --out /tmp/kjc --tiny                    # CPU smoke test
    python3 gpu/keras_jax_cnn.py --out /tmp/kjc --tiny --backend torch    # report path on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="summary JSON and text reports go here")
    ap.add_argument("--runs", help="run directories (default: <out>/runs)")
    ap.add_argument("--backend", default="jax", choices=("jax", "tensorflow", "torch"))
    ap.add_argument("--tiny", action="store_true", help="a few small steps (CPU smoke test)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--configs", default="float32,mixed_bfloat16",
                    help="Keras dtype policies, comma-separated")
    args = ap.parse_args()
    if args.tiny:
        args.steps, args.window, args.batch, args.image = 12, 3, 8, 16
    return args


if __name__ == "__main__":  # (benchmarks/bench_keras_overhead.py imports build_model)
    ARGS = parse_args()
    os.environ["KERAS_BACKEND"] = ARGS.backend  # before keras is imported
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tb_gpuprof.analysis.format import render  # noqa: E402
from tb_gpuprof.keras import GpuProfCallback  # noqa: E402

layers = keras.layers


def conv_bn(x, filters: int, stride: int = 1, relu: bool = True):
    x = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    return layers.ReLU()(x) if relu else x


def build_model(image: int, tiny: bool) -> keras.Model:
    """Stem + three residual stages (two 3x3 convs each, 1x1 projection when shapes change)."""
    widths = (16, 32) if tiny else (64, 128, 256)
    inp = keras.Input((image, image, 3))
    x = conv_bn(inp, widths[0])
    for i, filters in enumerate(widths):
        stride = 1 if i == 0 else 2
        y = conv_bn(x, filters, stride)
        y = conv_bn(y, filters, relu=False)
        if stride != 1 or x.shape[-1] != filters:
            x = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(x)
        x = layers.ReLU()(layers.Add()([x, y]))
    x = layers.GlobalAveragePooling2D()(x)
    out = layers.Dense(10, dtype="float32")(x)  # logits in fp32 under mixed precision
    return keras.Model(inp, out)


def run_config(name: str, args: argparse.Namespace, runs: str) -> dict:
    keras.mixed_precision.set_global_policy(name)
    keras.utils.set_random_seed(0)
    model = build_model(args.image, args.tiny)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    x = rng.standard_normal((n, args.image, args.image, 3), dtype=np.float32)
    y = rng.integers(0, 10, n)
    start = args.steps // 2
    run = os.path.join(runs, f"keras_{args.backend}_{name}")
    cb = GpuProfCallback(run, iter_start=start, iter_stop=start + args.window)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, callbacks=[cb])
    fit_s = time.perf_counter() - t0
    times = cb.iteration_times_ms
    steady = times[2:start] or times  # after compilation, before the window
    r: dict = {"config": name, "run": run, "fit_s": round(fit_s, 2),
               "step_ms_median": round(statistics.median(steady), 3) if steady else None,
               "batch_end_dispatch": "async" if cb.batch_end_async else "sync",
               "warnings": sorted({str(w.message) for w in caught
                                   if "tb_gpuprof" in str(w.message)})}
    rep = cb.report
    if rep is None:
        return r
    r.update(report_iterations=rep["iterations"]["count"],
             report_step_ms=rep["iterations"]["mean_ms"],
             tensor_cores=rep["tensor_cores"], precision_us=rep["precision_us"],
             flags=rep["system"]["flags"], gpu_name=rep["system"]["gpu_name"],
             recommendations=[x["id"] for x in rep["recommendations"]],
             top_kernels=[{k: kern.get(k) for k in ("name", "pct", "count", "uses_tensor_cores",
                                                    "precision", "category", "ops")}
                          for kern in rep["kernels"][:10]])
    with open(os.path.join(args.out, f"report_{name}.txt"), "w") as f:
        f.write(render(rep, "text", top=20))
    return r


def main(args: argparse.Namespace) -> int:
    os.makedirs(args.out, exist_ok=True)
    runs = args.runs or os.path.join(args.out, "runs")
    results = []
    for name in args.configs.split(","):
        r = run_config(name, args, runs)
        results.append(r)
        print(f"== {name}: {r['step_ms_median']} ms/step (median, outside the window), "
              f"batch ends {r['batch_end_dispatch']}, fit {r['fit_s']} s")
        for w in r["warnings"]:
            print(f"   warning: {w}")
        if "report_iterations" not in r:
            print("   NO REPORT")
            continue
        tc = r["tensor_cores"]
        print(f"   report: {r['report_iterations']} iterations, {r['report_step_ms']:.2f} ms "
              f"mean; GPU {r['gpu_name']}; Tensor Cores {tc['tc_pct']}% of GPU time, eligible "
              f"not on TC {tc['eligible_not_tc_pct']}%; precision_us {r['precision_us']}")
        print(f"   flags: {r['flags']}")
        for k in r["top_kernels"]:
            print(f"   {k['pct']:6.2f}% TC={'yes' if k['uses_tensor_cores'] else 'no ':3} "
                  f"{k['precision']:>5} {k['category']:<11} {k['name'][:90]}")
        print(f"   recommendations: {r['recommendations']}")
    with open(os.path.join(args.out, "keras_jax_cnn.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
