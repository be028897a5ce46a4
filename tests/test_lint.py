"""The code base stays ruff-clean (the config is in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed (it is in the [test] extra)")
    proc = subprocess.run([ruff, "check", "tb_gpuprof", "tests", "benchmarks", "demo"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_needs_no_framework():
    code = ("import sys, tb_gpuprof, tb_gpuprof.readers, tb_gpuprof.analysis.report, "
            "tb_gpuprof.cli\n"
            "bad = [m for m in ('torch', 'tensorflow', 'jax', 'keras', 'pandas') "
            "if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "", f"importing tb_gpuprof pulled in: {out}"
