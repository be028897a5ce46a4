"""gpu/cpu_contention.py, the SMT-sibling probe: it answers a ratio for every other CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "gpu", "cpu_contention.py")


def test_every_other_cpu_gets_a_busy_over_idle_ratio(tmp_path):
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("pins itself and a busy process to CPUs: Linux, 2 CPUs or more")
    out = tmp_path / "c.json"
    subprocess.run([sys.executable, SCRIPT, "--rounds", "1", "--probes", "2", "--out",
                    str(out)], check=True, timeout=60, capture_output=True)
    result = json.loads(out.read_text())
    others = sorted(os.sched_getaffinity(0))[1:]
    assert sorted(int(c) for c in result["busy_over_idle"]) == others
    assert all(r > 0 for r in result["busy_over_idle"].values())
