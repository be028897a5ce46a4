"""`tb-gpuprof compare A B` as a CI gate, on real H200 traces and stored runs."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from tb_gpuprof import cli
from tb_gpuprof.compare import compare_reports, render_comparison
from tb_gpuprof.store.writer import EventWriter
from tests import h200

FP32 = str(h200.DATA / "resnet50_fp32.json.gz")
TF32 = str(h200.DATA / "resnet50_tf32.json.gz")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["compare", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def stored_run(tmp_path, case: str) -> str:
    """A run directory holding the case's report as a capture hook stores it (with flags)."""
    run = tmp_path / case
    with EventWriter(run) as w:
        w.add_report(h200.report(case), step=5)
    return str(run)


def test_faster_candidate_passes_the_gate(capsys):
    rc, out, err = run_cli(capsys, FP32, TF32, "--max-slowdown", "0", "--format", "json")
    assert rc == 0 and err == ""
    cmp = json.loads(out)
    a, b = h200.report("resnet50_fp32", False), h200.report("resnet50_tf32", False)
    ta, tb = a["iterations"]["median_ms"], b["iterations"]["median_ms"]
    assert cmp["time_source"] == "median_ms"
    assert cmp["a"]["iteration_ms"] == ta and cmp["b"]["iteration_ms"] == tb
    assert cmp["iteration_change_pct"] == pytest.approx(100 * (tb - ta) / ta, abs=0.01)
    assert cmp["speedup"] == pytest.approx(ta / tb, abs=1e-3)
    assert cmp["a"]["tensor_core_pct"] == a["tensor_cores"]["tc_pct"] == 0.0
    assert cmp["b"]["tensor_core_pct"] > 0
    assert cmp["a"]["mfu_pct"] == a["throughput"]["mfu_pct"]
    # MFU is against the BF16 peak for both, so the 2x faster TF32 run reads about 2x the MFU
    # (not 38.6% -> 10.9%, as against each precision's own peak)
    assert cmp["b"]["mfu_pct"] / cmp["a"]["mfu_pct"] == pytest.approx(cmp["speedup"], rel=0.01)
    assert (cmp["a"]["precision"], cmp["b"]["precision"]) == ("fp32", "tf32")
    assert cmp["a"]["precision_utilization_pct"] > cmp["b"]["precision_utilization_pct"]
    # the FP32 SIMT kernels vanished: the largest changes are falls A -> B
    assert cmp["kernels"][0]["delta_ms"] < 0 and cmp["kernels"][0]["b_ms"] == 0.0
    assert cmp["warnings"] == []  # same GPU, same FLOPs per iteration


def test_an_mfu_stored_against_its_own_precision_is_not_compared_as_is():
    # a report stored before MFU moved to the BF16 peak (no peak_precision, MFU vs FP32's 67)
    old = copy.deepcopy(h200.report("resnet50_fp32", False))
    tp = old["throughput"]
    for field in ("peak_precision", "precision_peak_tflops", "precision_peak_source",
                  "precision_utilization_pct"):
        del tp[field]
    tp["peak_tflops"], tp["mfu_pct"] = 67.0, 100 * tp["achieved_tflops"] / 67.0
    cmp = compare_reports(old, h200.report("resnet50_tf32", False))
    assert any("not against the same peak" in w for w in cmp["warnings"])
    text = render_comparison(cmp)
    assert "MFU (vs" not in text and "MFU  " in text
    assert "MFU (vs BF16 peak)" in render_comparison(compare_reports(
        h200.report("resnet50_fp32", False), h200.report("resnet50_tf32", False)))


def test_slower_candidate_fails_with_one_line(capsys):
    rc, out, err = run_cli(capsys, TF32, FP32, "--max-slowdown", "5")
    assert rc == 1
    assert "iteration time" in out  # the comparison is still printed
    assert err.count("\n") == 1 and "slower than A" in err and "5%" in err
    # within a generous allowance the same pair passes
    rc, _, err = run_cli(capsys, TF32, FP32, "--max-slowdown", "500")
    assert rc == 0 and err == ""
    # no --max-slowdown: report only, never a failure
    assert run_cli(capsys, TF32, FP32)[0] == 0


def test_kernel_changes_account_for_the_gpu_time_difference():
    a, b = h200.report("resnet50_amp"), h200.report("resnet50_amp_cl")
    cmp = compare_reports(a, b, top=100_000)
    per_iter = [r["gpu_time_us"] / r["iterations"]["count"] / 1e3 for r in (a, b)]
    assert sum(k["delta_ms"] for k in cmp["kernels"]) == pytest.approx(
        per_iter[1] - per_iter[0], abs=0.05)
    deltas = [abs(k["delta_ms"]) for k in cmp["kernels"]]
    assert deltas == sorted(deltas, reverse=True)


@pytest.mark.parametrize(("base", "fixed", "fix", "flag"), [
    ("resnet50_fp32", "resnet50_tf32", "tf32", "allow_tf32_matmul"),
    ("resnet50_amp", "resnet50_amp_cl", "channels_last", "channels_last"),
    ("mlp_eager_small", "mlp_compiled_small", "compile", "compiled"),
])
def test_predicted_vs_measured_for_the_fix_applied(tmp_path, capsys, base, fixed, fix, flag):
    rc, out, _ = run_cli(capsys, stored_run(tmp_path, base), stored_run(tmp_path, fixed),
                         "--format", "json")
    assert rc == 0
    cmp = json.loads(out)
    (applied,) = [f for f in cmp["fixes"] if f["id"] == fix]
    assert applied["flags"][flag] == [False, True]
    rec = {r["id"]: r for r in h200.report(base)["recommendations"]}[fix]
    assert applied["recommended_by_a"] is True
    assert applied["predicted_saving_pct"] == rec["estimated_saving_pct"]
    assert applied["measured_saving_pct"] == pytest.approx(-cmp["iteration_change_pct"])
    assert applied["measured_saving_pct"] > 0
    text = run_cli(capsys, stored_run(tmp_path / "t", base), stored_run(tmp_path / "t", fixed))[1]
    assert f"{rec['estimated_saving_pct']:.1f}%" in text and fix in text


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    for a, b in ((str(tmp_path / "missing.json"), TF32), (FP32, str(garbage)),
                 (str(empty_dir), TF32)):
        rc, out, err = run_cli(capsys, a, b)
        assert rc == 2 and out == ""
        assert err.startswith("tb-gpuprof compare: error:") and err.count("\n") == 1


def test_bad_arguments_exit_2_without_a_traceback():
    for extra in (["--max-slowdown", "-3"], ["--max-slowdown", "nan"], ["--format", "xml"]):
        p = subprocess.run([sys.executable, "-m", "tb_gpuprof", "compare", FP32, TF32, *extra],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == ""


def test_compare_and_throughput_import_no_framework():
    code = ("import sys, tb_gpuprof, tb_gpuprof.cli, tb_gpuprof.compare, "
            "tb_gpuprof.analysis.throughput\n"
            "loaded = [m for m in ('torch', 'transformers', 'tensorflow') if m in sys.modules]\n"
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
