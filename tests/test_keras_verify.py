"""verify= on the Keras callback: real ``model.fit`` runs on the torch backend (CPU), in a child
process (KERAS_BACKEND is read when keras is imported); the child reports what it saw as JSON.

The known effect is a sleep inside the model's own forward that a test-only fix removes
(injected through the callback's ``_switch_for``, as tests/test_verify_hook.py injects its
switches into the verifier)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.runs import cli_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES, BATCH = 256, 8  # 32 steps an epoch
SLEEP_S = 0.015  # the forward's sleep the "sleep" fix removes: most of an execution


def _child(out: str) -> None:
    os.environ["KERAS_BACKEND"] = "torch"
    import time
    import warnings

    import keras
    import numpy as np
    import torch

    from tb_gpuprof.capture import switches
    from tb_gpuprof.keras import GpuProfCallback, GpuProfWarning

    slow = {"on": True}  # the loop as it is: the forward sleeps

    class Sleepy(keras.layers.Layer):
        def call(self, x):
            if slow["on"]:
                time.sleep(SLEEP_S)
            return x

    class SleepSwitch:
        """The fix: no sleep in the forward (a setting the loop reads)."""
        fix_id = "sleep"
        warmup_hint_iterations = 0

        def unavailable(self):
            return None

        def apply(self):
            slow["on"] = False

        def restore(self):
            slow["on"] = True

    class RaisingSwitch:
        """Changes a real backend flag, then raises on its third switch-on."""
        fix_id = "raising"
        warmup_hint_iterations = 0

        def __init__(self):
            self.uses, self.saved = 0, torch.backends.cudnn.benchmark

        def unavailable(self):
            return None

        def apply(self):
            self.uses += 1
            torch.backends.cudnn.benchmark = not self.saved
            if self.uses == 3:
                raise RuntimeError("boom")

        def restore(self):
            torch.backends.cudnn.benchmark = self.saved

    class Injected(GpuProfCallback):
        def _switch_for(self, fix_id):
            if fix_id == "sleep":
                return SleepSwitch(), None
            if fix_id == "raising":
                return RaisingSwitch(), None
            if fix_id == "tf32":  # the real switch; its CUDA check skipped on this CPU
                return switches.Tf32Switch(require_cuda=False), None
            return super()._switch_for(fix_id)

    class StopWhen(keras.callbacks.Callback):
        async_safe = True

        def __init__(self, cb, when):
            super().__init__()
            self.cb, self.when = cb, when

        def on_train_batch_begin(self, batch, logs=None):
            if self.when(self.cb):
                self.model.stop_training = True

    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 16), dtype=np.float32)
    y = rng.integers(0, 4, SAMPLES)

    def model():
        m = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              Sleepy(), keras.layers.Dense(4)])
        m.compile(optimizer="sgd", jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    def flags():
        return {"snapshot": repr(switches.snapshot(None, None)),
                "default_dtype": str(torch.get_default_dtype()),
                "threads": torch.get_num_threads(),
                "grad": torch.is_grad_enabled()}

    def fit(name, cb_cls, cb_args, epochs, stop=None):
        before = flags()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GpuProfWarning)
            cb = cb_cls(os.path.join(out, name), iter_start=2, iter_stop=4, nvml=False,
                        **cb_args)
            cbs = [cb] + ([StopWhen(cb, stop)] if stop else [])
            hist = model().fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=cbs)
        slow["on"] = True
        return {"epochs": len(hist.history["loss"]), "state": cb._verify_state,
                "verification": (cb.report or {}).get("verification"),
                "flags_same": flags() == before,
                "warnings": [str(w.message) for w in caught
                             if issubclass(w.category, GpuProfWarning)]}

    res: dict = {}
    res["sleep"] = fit("sleep", Injected, {"verify": ["sleep"], "verify_max_s": 60}, 1000,
                       stop=lambda cb: cb._verify_state == "done")

    class Timer(keras.callbacks.Callback):
        """Each batch's wall time in a plain fit (no hook): the known effect, apart."""

        def __init__(self):
            super().__init__()
            self.ms: list[float] = []

        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.ms.append((time.perf_counter() - self.t) * 1e3)

    apart = {}
    for on in (True, False, True, False):  # interleaved: drift on the machine cancels
        slow["on"] = on
        timer = Timer()
        model().fit(x, y, batch_size=BATCH, epochs=4, verbose=0, callbacks=[timer])
        apart.setdefault(on, []).extend(timer.ms[8:])  # the first batches warm up
    slow["on"] = True
    res["sleep"]["apart_ms"] = {str(k): sorted(v)[len(v) // 2] for k, v in apart.items()}
    res["amp"] = fit("amp", GpuProfCallback,
                     {"verify": ["amp", "channels_last", "compile", "tf32"]}, 3)
    res["raising"] = fit("raising", Injected, {"verify": ["tf32", "raising"],
                                               "verify_max_s": 30}, 1000,
                         stop=lambda cb: cb._verify_state == "done")
    # the fit ends while TF32 is switched on in a trial: the callback's train end undoes it
    res["ended_mid_trial"] = fit(
        "ended_mid_trial", Injected, {"verify": ["tf32"], "verify_max_s": 60}, 1000,
        stop=lambda cb: cb._verifier is not None and cb._verifier._on)
    bad = []
    for kwargs in ({"verify": "tf32"}, {"verify": None}, {"verify": [1]},
                   {"verify": True, "verify_max_s": 0}, {"verify": True, "verify_max_s": "9"}):
        try:
            GpuProfCallback(os.path.join(out, "bad"), **kwargs)
            bad.append(None)
        except (TypeError, ValueError) as e:
            bad.append([type(e).__name__, str(e)])
    res["bad"] = bad
    res["bad_dir_made"] = os.path.exists(os.path.join(out, "bad"))
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(res, f)


@pytest.fixture(scope="module")
def keras_torch(tmp_path_factory):
    for name in ("keras", "torch"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    out = str(tmp_path_factory.mktemp("keras_verify"))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), out], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(out, "result.json")) as f:
        return out, json.load(f)


def test_a_fix_that_removes_a_known_sleep_is_verified_in_a_fit(keras_torch):
    out, res = keras_torch
    r = res["sleep"]
    assert r["state"] == "done" and r["flags_same"], r
    section = r["verification"]
    assert section["status"] == "done" and section["restored"] is True, section
    trials = section["trials"]
    assert list(trials) == ["aa", "sleep"]
    # stored in the run: the CLI's report is the verified one
    assert cli_report(os.path.join(out, "sleep"))["verification"]["trials"].keys() == \
        trials.keys()
    # the A/A control measures no change; on a loaded shared machine it may instead say the
    # loop was too noisy to tell ("inconclusive"), never a saving or a slowdown
    assert trials["aa"]["status"] == "no_change" or \
        trials["aa"]["verdict"].startswith("inconclusive"), trials["aa"]
    s = trials["sleep"]
    # Under another test suite's load on this 2-core machine the noise run sized blocks of
    # ~80-100 executions and the trial stopped at its 1,000 iterations "inconclusive" (6
    # pairs): then only the direction is checked. Measured: the interval must hold the effect.
    assert s["status"] in ("measured", "stopped") and s["saving_pct"] > 0, s
    if s["status"] == "stopped":
        assert s["verdict"].startswith("inconclusive"), s
        return
    # the known effect, measured apart: plain fits with and without the sleep, interleaved
    # (removing a sleep also saves the thread's wake-up after it, so it is more than the
    # sleep's nominal share)
    apart = r["apart_ms"]
    expected = 100.0 * (1.0 - apart["False"] / apart["True"])
    lo, hi = s["interval_pct"]
    assert 0 < lo and lo - 5.0 <= expected <= hi + 5.0, (expected, apart, s)


def test_fixes_keras_cannot_switch_are_not_verifiable_and_training_completes(keras_torch):
    out, res = keras_torch
    r = res["amp"]
    assert r["epochs"] == 3 and r["flags_same"] and r["warnings"] == [], r
    section = r["verification"]
    trials = section["trials"]
    # nothing switchable here: no noise run, no A/A control, each fix with its reason
    assert list(trials) == ["amp", "channels_last", "compile", "tf32"], trials
    assert section["iterations"] == 0 and section["restored"] is True
    for fix, words in (("amp", "dtype policy"), ("channels_last", "data_format"),
                       ("compile", "train function"), ("tf32", "CUDA is not available")):
        assert trials[fix]["status"] == "not_verifiable", trials[fix]
        assert words in trials[fix]["reason"], trials[fix]
    assert cli_report(os.path.join(out, "amp"))["verification"]["trials"]["amp"]["reason"]


def test_backend_flags_are_restored_after_verification_and_after_a_raising_trial(keras_torch):
    _, res = keras_torch
    r = res["raising"]
    assert r["flags_same"] and r["state"] == "done", r
    trials = r["verification"]["trials"]
    assert trials["raising"]["status"] == "failed" and "boom" in trials["raising"]["reason"]
    assert trials["tf32"]["status"] not in ("failed", "not_verifiable"), trials["tf32"]
    assert trials["tf32"]["blocks"] >= 4, trials["tf32"]
    assert r["verification"]["restored"] is True
    assert any("verifying raising failed" in w for w in r["warnings"]), r["warnings"]
    m = res["ended_mid_trial"]
    assert m["flags_same"] and m["state"] == "done", m
    assert m["verification"]["restored"] is True
    assert m["verification"]["status"] == "capped"


def test_bad_verify_values_raise_at_construction(keras_torch):
    _, res = keras_torch
    kinds = [b[0] if b else None for b in res["bad"]]
    assert kinds == ["TypeError", "TypeError", "TypeError", "ValueError", "TypeError"], res
    for _, message in res["bad"]:
        assert message.startswith(("verify must be", "verify_max_s must be")), message
        assert "\n" not in message
    assert not res["bad_dir_made"]


if __name__ == "__main__":
    _child(sys.argv[1])
