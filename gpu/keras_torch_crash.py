"""Which part of a Keras-on-torch window crashes ResNet-50 on the GPU (issue 13).

bench_hook_overhead's Keras torch ResNet-50 (keras.applications.ResNet50, batch 128, 224 px)
dies with SIGSEGV in the window on the H200; on CPU it passes. Each variant trains ``--steps``
steps in its own process under ``python -X faulthandler`` (Python stacks of every thread on
the crash) and prints its exit code and the tail of stderr:

- ``none``: no callback, no profiler;
- ``plain``: torch.profiler started at step 5 and stopped at step 8 by a bare Keras callback;
- ``cb``: tb_gpuprof's GpuProfCallback, window [5, 8), defaults;
- ``nomem``: the same with ``record_memory=False``;
- ``noteardown``: the same with TEARDOWN_CUPTI=0 in the environment (no CUPTI teardown).

    python3 gpu/keras_torch_crash.py --out $OUT/kcrash
    python3 gpu/keras_torch_crash.py --smoke --out /tmp/kcrash     # CPU, 32 px, batch 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("none", "plain", "cb", "nomem", "noteardown")


def train(variant: str, steps: int, smoke: bool) -> None:
    os.environ["KERAS_BACKEND"] = "torch"
    sys.path.insert(0, os.path.join(HERE, ".."))
    import keras
    import numpy as np
    import torch

    size, batch = (32, 4) if smoke else (224, 128)
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=10)
    x = np.random.rand(batch, size, size, 3).astype("float32")
    y = np.random.randint(0, 10, batch)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks: list = []
    if variant == "plain":
        class Plain(keras.callbacks.Callback):
            prof = None

            def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
                if batch == 5:
                    acts = [torch.profiler.ProfilerActivity.CPU,
                            torch.profiler.ProfilerActivity.CUDA]
                    self.prof = torch.profiler.profile(activities=acts)
                    self.prof.start()

            def on_train_batch_end(self, batch: int, logs: object = None) -> None:
                if batch == 7 and self.prof is not None:
                    self.prof.stop()
                    self.prof.export_chrome_trace(tempfile.mktemp(suffix=".json"))
                    print("plain window exported", file=sys.stderr, flush=True)
        callbacks.append(Plain())
    elif variant in ("cb", "nomem", "noteardown"):
        from tb_gpuprof.keras import GpuProfCallback

        callbacks.append(GpuProfCallback(tempfile.mkdtemp(prefix="kcrash_"), iter_start=5,
                                         iter_stop=8, record_memory=variant != "nomem"))

    class Log(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            print(f"step {batch} done {time.perf_counter():.2f}", file=sys.stderr, flush=True)
    callbacks.append(Log())
    model.fit(np.repeat(x[None], steps, 0).reshape(-1, size, size, 3),
              np.repeat(y[None], steps, 0).reshape(-1), batch_size=batch, epochs=1, verbose=0,
              callbacks=callbacks)
    for cb in callbacks:
        wait = getattr(cb, "wait", None)
        if wait is not None:
            print("analysis finished:", wait(300), "report:", cb.report is not None,
                  file=sys.stderr, flush=True)
    print("ok", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.variant:
        train(a.variant, a.steps, a.smoke)
        return
    os.makedirs(a.out, exist_ok=True)
    results = {}
    for v in a.variants.split(","):
        env = dict(os.environ)
        if v == "noteardown":
            env["TEARDOWN_CUPTI"] = "0"
        cmd = [sys.executable, "-X", "faulthandler", __file__, "--variant", v, "--steps",
               str(a.steps), "--out", a.out] + (["--smoke"] if a.smoke else [])
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = "timeout", (e.stderr or b"").decode() if isinstance(e.stderr, bytes) \
                else (e.stderr or "")
        results[v] = {"rc": rc, "s": round(time.perf_counter() - t0, 1),
                      "stderr_tail": err[-6000:]}
        print(f"== {v}: rc={rc} {results[v]['s']} s", flush=True)
        print("\n".join(err.splitlines()[-40:]), flush=True)
        with open(os.path.join(a.out, "keras_torch_crash.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
