"""The Keras callback on real ``fit`` runs (CPU), one subprocess per backend.

KERAS_BACKEND must be set before keras is imported, so each backend's fits run in a child
process (this file run as a script); the child reports what it saw as JSON and the tests read
the runs it wrote with the store reader and the CLI, like a user would.
"""

from __future__ import annotations

import gc
import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stdout

import pytest

from tb_gpuprof import cli
from tests.runs import cli_report, read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A real H200 profile whose FP32 math AMP speeds up by a re-timed quarter (TF32 ResNet-50): the
# callback's recorded policy must switch that advice on or off. (The JAX conv fixture's AMP
# saving re-times to nothing, so AMP is not listed there whatever the policy.)
FIXTURE_AMP = os.path.join(ROOT, "tests", "data", "h200", "resnet50_tf32.json.gz")
SAMPLES, BATCH = 96, 8  # 12 steps an epoch


# -- the child: fits on one backend ------------------------------------------------------------

def _child(backend: str, out: str) -> None:
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import warnings

    import keras
    import numpy as np

    from tb_gpuprof.keras import GpuProfCallback, GpuProfWarning

    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES)

    def model(spe: int = 1) -> keras.Model:
        m = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3),
                              keras.layers.ReLU(), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(10)])
        m.compile(optimizer="sgd", steps_per_execution=spe,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    def fit(name: str, m: keras.Model, cb_args: dict, epochs: int = 1, **fit_args) -> dict:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GpuProfWarning)
            cb = GpuProfCallback(os.path.join(out, name), **cb_args)
            hist = m.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=[cb],
                         **fit_args)
        return {"losses": hist.history["loss"], "async": cb.batch_end_async,
                "env": cb.env, "report_step": cb.report_step, "trace_path": cb.trace_path,
                "warnings": [str(w.message) for w in caught
                             if issubclass(w.category, GpuProfWarning)]}

    res: dict = {"backend": keras.backend.backend()}
    gc.disable()  # this child's own GC: what the window leaves unfreed stays visible
    res["fp32"] = fit("fp32", model(), {"iter_start": 2, "iter_stop": 7})
    res["live_profiler_results"] = _live_torch_profiler_results()
    gc.enable()
    # mixed precision, 3 steps per execution (torch allows only 1), a window in epoch 2
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    res["spe"] = spe = 1 if backend == "torch" else 3
    res["mixed_spe3"] = fit("mixed_spe3", model(spe=spe), {"iter_start": 12, "iter_stop": 18},
                            epochs=2)
    keras.mixed_precision.set_global_policy("float32")
    # a profiler already running: the window gives way with a warning, fit and scalars go on
    outside = _start_outside_profiler(backend, os.path.join(out, "outside"))
    try:
        res["conflict"] = fit("conflict", model(), {"iter_start": 1, "iter_stop": 3})
    finally:
        outside()
    # the run directory cannot be created: no events file, a warning, training goes on
    blocker = os.path.join(out, "not_a_dir")
    open(blocker, "w").close()
    res["bad_logdir"] = fit("not_a_dir/run", model(), {"iter_start": 1})
    res["tensorflow_imported"] = "tensorflow" in sys.modules
    # the callback's recorded env drives the recommendations of a real H200 profile
    if os.path.exists(FIXTURE_AMP):
        from tb_gpuprof.analysis.report import build_report
        from tb_gpuprof.readers import load_profile

        prof = load_profile(FIXTURE_AMP)
        res["fixture_recs"] = {case: [r["id"] for r in build_report(
            prof, env=res[case]["env"])["recommendations"]] for case in ("fp32", "mixed_spe3")}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(res, f)


def _live_torch_profiler_results() -> int | None:
    """torch.profiler results still in memory (collected or not); None without torch."""
    if "torch" not in sys.modules:
        return None
    from torch.autograd.profiler import profile

    return sum(1 for o in gc.get_objects() if isinstance(o, profile)
               and getattr(o, "kineto_results", None) is not None)


def _start_outside_profiler(backend: str, logdir: str):
    if backend == "tensorflow":
        import tensorflow as tf

        tf.profiler.experimental.start(logdir)
        return tf.profiler.experimental.stop
    if backend == "jax":
        import jax

        jax.profiler.start_trace(logdir)
        return jax.profiler.stop_trace
    import torch

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    return prof.stop


# -- the tests ---------------------------------------------------------------------------------

def _run_backend(backend: str, tmp_path_factory) -> tuple[str, dict]:
    modules = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}
    if importlib.util.find_spec("keras") is None or \
            importlib.util.find_spec(modules[backend]) is None:
        pytest.skip(f"keras with the {backend} backend is not installed")
    out = str(tmp_path_factory.mktemp(f"keras_{backend}"))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), backend, out], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(out, "result.json")) as f:
        return out, json.load(f)


@pytest.fixture(scope="module")
def tf_run(tmp_path_factory):
    return _run_backend("tensorflow", tmp_path_factory)


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    return _run_backend("torch", tmp_path_factory)


def check_step_scalars(times: dict[int, float], expected: list[int], exact: bool) -> None:
    """One positive value per execution. With async batch ends (torch, JAX) Keras' worker
    threads may deliver two ends out of order; that execution gets no value rather than a
    wrong one, so there some may be missing: how many depends on the machine's load (CI saw
    4 of 12 on a loaded 2-core machine), so at least half must be there."""
    assert all(v > 0 for v in times.values())
    if exact:
        assert sorted(times) == expected
    else:
        assert set(times) <= set(expected) and len(times) >= 0.5 * len(expected)


def check_window_run(out: str, res: dict, backend: str) -> None:
    run = os.path.join(out, "fp32")
    r = res["fp32"]
    assert r["warnings"] == [] and len(r["losses"]) == 1
    scalars = read_scalars(run)
    check_step_scalars(scalars["gpuprof/iteration_time_ms"], list(range(SAMPLES // BATCH)),
                       exact=not r["async"])
    report = cli_report(run)
    assert report["iterations"]["count"] == 5
    assert report["iterations"]["range"] == [2, 6]
    assert report["iterations"]["method"] == "profiler_step"
    assert r["report_step"] == 6
    system = report["system"]
    assert system["framework"] == "keras" and system["keras_backend"] == backend
    assert system["flags"]["mixed_precision_policy"] == "float32"
    assert isinstance(system["flags"]["jit_compile"], bool)
    assert system["steps_per_execution"] == 1
    # the un-profiled period the report is corrected with: steps outside the window only
    it = report["iterations"]
    assert it["unprofiled_source"] == "wall_time", it
    outside = [v for step, v in scalars["gpuprof/iteration_time_ms"].items()
               if step > 0 and not 1 <= step <= 7]
    assert min(outside) <= it["unprofiled_median_ms"] <= max(outside)
    # the raw profile is stored in the run, and the text report renders from the run too
    assert r["trace_path"] and os.path.isfile(r["trace_path"])
    assert os.path.commonpath([r["trace_path"], run]) == run
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli.main(["report", run]) == 0
    assert "Recommendations" in buf.getvalue()


def check_steps_per_execution(out: str, res: dict) -> None:
    r, spe = res["mixed_spe3"], res["spe"]
    assert r["warnings"] == [] and len(r["losses"]) == 2
    times = read_scalars(os.path.join(out, "mixed_spe3"))["gpuprof/iteration_time_ms"]
    check_step_scalars(times, list(range(0, 2 * SAMPLES // BATCH, spe)), exact=not r["async"])
    report = cli_report(os.path.join(out, "mixed_spe3"))
    # one step marker per execution: steps 12, 12 + spe, ... before 18
    assert report["iterations"]["count"] == len(range(12, 18, spe))
    assert report["iterations"]["range"] == [12, 18 - spe]
    assert report["system"]["flags"]["mixed_precision_policy"] == "mixed_bfloat16"
    assert report["system"]["steps_per_execution"] == spe


def check_robustness(out: str, res: dict) -> None:
    c = res["conflict"]
    assert len(c["losses"]) == 1 and c["report_step"] is None
    assert any("window disabled" in w for w in c["warnings"]), c["warnings"]
    check_step_scalars(read_scalars(os.path.join(out, "conflict"))["gpuprof/iteration_time_ms"],
                       list(range(SAMPLES // BATCH)), exact=not c["async"])
    b = res["bad_logdir"]
    assert len(b["losses"]) == 1
    assert any("event writer disabled" in w for w in b["warnings"]), b["warnings"]


def check_flags_reach_recommendations(res: dict) -> None:
    if "fixture_recs" not in res:
        pytest.fail(f"{FIXTURE_AMP} is missing (it ships in tests/data)")
    # the same GPU profile: FP32 policy -> AMP advice; a mixed policy silences it
    assert "amp" in res["fixture_recs"]["fp32"]
    assert "amp" not in res["fixture_recs"]["mixed_spe3"]


def test_tensorflow_fit_window_report(tf_run):
    out, res = tf_run
    assert res["backend"] == "tensorflow"
    check_window_run(out, res, "tensorflow")
    assert res["fp32"]["async"] is False  # Keras never dispatches batch ends async on TF
    flags = res["fp32"]["env"]["flags"]
    assert isinstance(flags["tf32_enabled"], bool) and flags["channels_last"] is True
    assert res["fp32"]["trace_path"].endswith(".xplane.pb")


def test_tensorflow_steps_per_execution_and_mixed_precision(tf_run):
    check_steps_per_execution(*tf_run)


def test_tensorflow_robustness(tf_run):
    check_robustness(*tf_run)


def test_tensorflow_env_reaches_recommendations(tf_run):
    check_flags_reach_recommendations(tf_run[1])


def test_torch_fit_window_report(torch_run):
    out, res = torch_run
    assert res["backend"] == "torch"
    check_window_run(out, res, "torch")
    # our callback is async_safe: Keras keeps dispatching batch ends on its worker threads
    assert res["fp32"]["async"] is True
    assert not res["tensorflow_imported"]
    assert res["fp32"]["trace_path"].endswith(".pt.trace.json.gz")
    # freed by the analysis, not left to a full collection in the training thread
    assert res["live_profiler_results"] == 0


def test_torch_steps_per_execution_and_mixed_precision(torch_run):
    check_steps_per_execution(*torch_run)


def test_torch_robustness(torch_run):
    check_robustness(*torch_run)


def test_jax_fit_markers_on_cpu(tmp_path_factory):
    """JAX on CPU: scalars, async dispatch and the stored XPlane's step markers (the window's
    report needs GPU activity or TF-style host ops, which a CPU-only JAX profile lacks)."""
    out, res = _run_backend("jax", tmp_path_factory)
    from tb_gpuprof.model import STEP
    from tb_gpuprof.readers import load_profile

    r = res["fp32"]
    assert r["async"] is True and not res["tensorflow_imported"]
    check_step_scalars(read_scalars(os.path.join(out, "fp32"))["gpuprof/iteration_time_ms"],
                       list(range(SAMPLES // BATCH)), exact=False)
    steps = [a.step for a in load_profile(r["trace_path"]).annotations if a.kind == STEP]
    assert sorted(steps) == [2, 3, 4, 5, 6]
    check_robustness(out, res)


def test_bad_window_arguments_raise_at_once():
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed")
    code = ("import os; os.environ['KERAS_BACKEND'] = 'torch'\n"
            "from tb_gpuprof.keras import GpuProfCallback\n"
            "for a in ((-1, None), (5, 5), (5, 3)):\n"
            "    try:\n"
            "        GpuProfCallback('/nonexistent', *a)\n"
            "    except ValueError as e:\n"
            "        print('ValueError', e)\n")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.stdout.count("ValueError") == 3, proc.stderr[-2000:]
    assert not os.path.exists("/nonexistent")


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])


def test_memory_peaks_are_read_at_most_every_interval(tmp_path):
    """The callback reads the device's memory peaks at most every ``memory_interval_s``
    (a torch reading costs tens of µs of the training thread); 0 reads every execution.
    A counting probe stands in for the GPU's (CPU fits have none)."""
    for name in ("keras", "torch"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    code = textwrap.dedent(f"""
        import json, os, sys
        os.environ['KERAS_BACKEND'] = 'torch'
        import keras, numpy as np
        from tb_gpuprof.keras import GpuProfCallback

        class Counted(GpuProfCallback):
            def on_train_begin(self, logs=None):
                super().on_train_begin(logs)
                self.readings = 0
                def probe():
                    self.readings += 1
                    return float(self.readings), None
                self._mem_probe = probe
                self._on['memory'] = True  # on a GPU only, as the probe

        class InOrder(keras.callbacks.Callback):  # not async-safe: Keras calls batch ends
            def on_train_batch_end(self, batch, logs=None):  # in order, on its own thread
                pass

        x = np.random.default_rng(0).random(({SAMPLES}, 4), dtype=np.float32)
        y = np.zeros({SAMPLES})
        out = {{}}
        for interval in (0, 3600):
            m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            m.compile(optimizer='sgd', loss='sparse_categorical_crossentropy')
            cb = Counted(os.path.join(sys.argv[1], f'i{{interval}}'), nvml=False,
                         memory_interval_s=interval)
            m.fit(x, y, batch_size={BATCH}, epochs=1, verbose=0, callbacks=[cb, InOrder()])
            out[interval] = cb.readings
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    readings = json.loads(proc.stdout.strip().splitlines()[-1])
    assert readings == {"0": SAMPLES // BATCH, "3600": 1}
    peaks = read_scalars(str(tmp_path / "i3600"))["gpuprof/memory_allocated_peak_mb"]
    assert sorted(peaks) == [0]  # the first execution's reading only
    assert len(read_scalars(str(tmp_path / "i0"))["gpuprof/memory_allocated_peak_mb"]) == 12
