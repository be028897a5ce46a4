"""`tb-gpuprof report` end to end: formats, options, and one-line errors for bad input."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from .h200 import DATA, TRANSFORMER


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tb_gpuprof", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def fp32_json():
    proc = cli("report", str(DATA / "resnet50_fp32.json.gz"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_has_the_issue_fields(fp32_json):
    rep = fp32_json
    assert rep["iterations"]["count"] == 3
    assert rep["iterations"]["mean_ms"] > 0
    k = rep["kernels"][0]
    for field in ("name", "count", "total_us", "uses_tensor_cores"):
        assert field in k
    assert {"tc_pct", "eligible_not_tc_pct", "other_pct", "memory_pct"} <= set(rep["tensor_cores"])
    assert "tf32" in [r["id"] for r in rep["recommendations"]]


def test_text_reads_like_a_summary(fp32_json):
    proc = cli("report", str(DATA / "resnet50_fp32.json.gz"), "--top", "5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Top 5 kernels" in out and "Recommendations" in out and "[tf32]" in out
    top = fp32_json["kernels"][0]
    assert (top.get("demangled") or top["name"])[:40] in out


def test_csv_lists_top_n_kernels(fp32_json):
    proc = cli("report", str(DATA / "resnet50_fp32.json.gz"), "--format", "csv", "--top", "7")
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert len(rows) == 7
    assert rows[0]["name"] == fp32_json["kernels"][0]["name"]


def test_iteration_range_and_key_options():
    proc = cli("report", str(DATA / "resnet50_tf32.json.gz"), "--format", "json",
               "--iter-start", "2", "--iter-stop", "3")
    assert json.loads(proc.stdout)["iterations"]["count"] == 1
    proc = cli("report", str(TRANSFORMER), "--format", "json", "--key", "Optimizer.zero_grad")
    rep = json.loads(proc.stdout)
    assert rep["iterations"]["method"] == "key_range"


@pytest.mark.parametrize("content,expect", [
    (None, "no such file"),
    (b"", "empty"),
    (b"\x00\x01garbage\xff" * 10, ""),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur"', ""),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, expect):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    proc = cli("report", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and str(path) in lines[0]
    assert expect in lines[0].lower()


def test_bad_options_exit_2():
    proc = cli("report", str(DATA / "resnet50_fp32.json.gz"), "--top", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
