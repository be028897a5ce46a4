"""One answer per run (issue 36): `report RUN`, `report RUN --reanalyze`, `report TRACE` on the
run's stored trace and `compare` give the same answer; a report an older analysis stored is
rebuilt with the context the hook stored beside its trace, and cached beside the run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tb_gpuprof.analysis.context import AnalysisContext
from tb_gpuprof.pipeline import analyse_trace, run_report
from tb_gpuprof.store import layout
from tb_gpuprof.store.writer import EventWriter, save_context, save_raw_trace
from tests.conftest import run_cli
from tests.runs import tiny_cpu_hook_run

DATA = Path(__file__).parent / "data"
TRACE = DATA / "h200" / "resnet50_tf32.json.gz"
# What the hook knew for that run (tests/data/h200/resnet50_tf32.env.json) and its un-profiled
# iteration time (tests/data/h200/README.md): the context stored beside the trace.
UNPROFILED = {"median_ms": 115.32, "count": 8, "source": "gpu_events"}


def _context() -> AnalysisContext:
    env = json.loads((DATA / "h200" / "resnet50_tf32.env.json").read_text())
    return AnalysisContext(env={**env, "unprofiled": UNPROFILED})


def _old_run(run_dir: Path, *, with_context: bool = True, with_trace: bool = True) -> Path:
    """A run as an older analysis stored it: its report says nothing and has another id."""
    report = analyse_trace(str(TRACE))  # without the hook's context, as a stale answer
    report.update(generator="tb_gpuprof 0.0.1", analysis_id="feedfacefeedface",
                  recommendations=[])
    with EventWriter(run_dir) as w:
        w.add_report(report, step=23)
    if with_trace:
        save_raw_trace(run_dir, str(TRACE), 23)
    if with_context:
        save_context(run_dir, 23, _context().to_dict())
    return run_dir


def _json(*args: str) -> dict:
    return json.loads(run_cli(*args, "--format", "json").stdout)


def test_report_reanalyze_and_the_stored_trace_give_one_answer(tmp_path):
    run = _old_run(tmp_path / "run")
    auto = _json("report", str(run))
    again = _json("report", str(run), "--reanalyze")
    stored_trace = next((run / "plugins" / "gpuprof" / "traces").rglob("*.json.gz"))
    raw = _json("report", str(stored_trace))
    assert auto == again
    assert auto["refreshed"]["from_generator"] == "tb_gpuprof 0.0.1"
    assert auto["refreshed"]["context"] == "stored"
    # the stored context was used: the un-profiled time the hook measured corrects the window
    assert auto["iterations"]["unprofiled_median_ms"] == pytest.approx(UNPROFILED["median_ms"])
    assert auto["system"]["flags"]["allow_tf32_matmul"] is True
    # report TRACE on the run's own trace reads the context beside it: the same answer
    for key in ("bottleneck", "recommendations", "throughput", "iterations"):
        assert raw[key] == auto[key], key
    # and it is cached beside the run, keyed by the analysis and the stored report
    cache = Path(layout.refreshed_report_path(run, 23))
    assert cache.exists()
    assert run_report(str(run)) == auto


def test_compare_reads_the_refreshed_report(tmp_path):
    run = _old_run(tmp_path / "run")
    cmp = _json("compare", str(run), str(TRACE))
    fresh = run_report(str(run))
    assert cmp["a"]["mfu_pct"] == fresh["throughput"]["mfu_pct"]
    assert cmp["a"]["iteration_ms"] is not None


def test_a_cache_from_another_analysis_is_not_used(tmp_path):
    run = _old_run(tmp_path / "run")
    first = run_report(str(run))
    cache = Path(layout.refreshed_report_path(run, 23))
    entry = json.loads(gzip.decompress(cache.read_bytes()))
    entry["key"]["analysis_id"] = "0000000000000000"
    entry["report"]["recommendations"] = []
    cache.write_bytes(gzip.compress(json.dumps(entry).encode()))
    assert run_report(str(run)) == first  # rebuilt, not the planted answer


def test_a_run_stored_before_contexts_gets_its_context_recovered(tmp_path):
    run = _old_run(tmp_path / "run", with_context=False)
    report = run_report(str(run))
    assert report["refreshed"]["context"] == "recovered"
    assert report["recommendations"], "the rebuilt report gives advice again"


def test_a_stale_report_without_its_trace_is_shown_with_a_warning(tmp_path):
    run = _old_run(tmp_path / "run", with_trace=False, with_context=False)
    report = _json("report", str(run))
    assert report["refreshed"] is None and report["recommendations"] == []
    assert any("older analysis" in w for w in report["warnings"])
    proc = run_cli("report", str(run), "--reanalyze", check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no raw trace" in proc.stderr


def test_reanalyze_on_a_trace_file_is_one_line(tmp_path):
    proc = run_cli("report", str(TRACE), "--reanalyze", check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--reanalyze" in proc.stderr


def test_a_run_that_cannot_hold_a_cache_is_refreshed_all_the_same(tmp_path):
    run = _old_run(tmp_path / "run")
    blocker = Path(layout.refreshed_report_path(run, 23)).parent
    blocker.write_text("a file where the cache folder would go")  # also bites as root
    report = run_report(str(run))
    assert report["refreshed"] is not None and report["recommendations"]
    assert blocker.is_file()


def test_a_hook_run_rebuilt_from_its_context_is_the_report_the_hook_stored(tmp_path):
    """The window child stores its context beside the raw trace: re-analysing the run gives
    the hook's own report, byte for byte (the same code path, the same inputs)."""
    pytest.importorskip("torch")
    from tb_gpuprof.store.reader import load_run_report

    run = tmp_path / "hooked"
    tiny_cpu_hook_run(str(run))
    stored = load_run_report(str(run))
    context = json.loads(next(run.rglob(layout.CONTEXT_FILE_NAME)).read_text())
    assert context["env"]["framework"] == "pytorch" and "flags" in context["env"]
    assert context["env"]["unprofiled"]["count"] >= 1  # the iterations outside the window
    assert run_report(str(run)) == stored  # current: returned as stored
    assert run_report(str(run), reanalyze=True) == stored
    # byte for byte as the CLI prints them (key order included), and no cache for it
    as_stored = run_cli("report", str(run), "--format", "json").stdout
    assert run_cli("report", str(run), "--reanalyze", "--format", "json").stdout == as_stored
    assert not list(run.rglob("reports"))
