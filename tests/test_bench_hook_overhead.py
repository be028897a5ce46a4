"""benchmarks/bench_hook_overhead.py end to end on CPU (smoke sizes): the harness the issue-13
figures come from runs real training loops with the real hooks, a control process in turn,
and its record summarises again the same way (a broken harness shows here, not on the GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_hook_overhead.py")


@pytest.mark.parametrize("hook", ["torch", "lightning"])
def test_a_paired_smoke_run_measures_every_phase_and_replays_from_its_record(tmp_path, hook):
    pytest.importorskip("transformers")
    if hook == "lightning":
        pytest.importorskip("lightning")
    out = tmp_path / "out"
    pin = ["--cpus", "1"] if hook == "torch" else []  # both processes on the first CPU
    proc = subprocess.run([sys.executable, BENCH, "--all", "--smoke", "--paired", "--workload",
                           "gpt2", "--hooks", hook, "--timeout", "240", "--out", str(out), *pin],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads((out / "bench_hook_overhead.json").read_text())
    assert "error" not in row and "control_error" not in row, row
    assert row["report"] is True  # every window was analysed into a report
    blocks = row["blocks"]
    assert blocks["pairs"] == 2 and blocks["after"] >= 2  # --smoke: 1 ABBA group, 6 after
    assert row["state_before"]["gc_enabled"] and row["state_after"]["gc_enabled"]
    assert row["state_after"]["TEARDOWN_CUPTI"] is None
    assert row["state_after"]["threads"] == ["MainThread"]  # the hooks left no thread behind
    assert row["state_after"]["cpus"] == row["state_before"]["cpus"]
    if pin:
        assert row["cpus"] == row["state_after"]["cpus"] == sorted(os.sched_getaffinity(0))[:1]
    # the control ran in turn: one block before and after each of the treated blocks
    n_treated = 2 * blocks["pairs"] + blocks["during"] + blocks["after"]
    assert len(row["control_blocks"]) >= n_treated - 1
    assert row["after_window_paired_n"] > 0 and row["after_window_paired"] > 0
    again = subprocess.run([sys.executable, BENCH, "--recorded",
                            str(out / "bench_hook_overhead.json")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"after {row['after_window_paired']:6.3f}" in again.stdout
