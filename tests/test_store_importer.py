"""`tb-gpuprof import`: real fixture traces become runs; bad names and inputs fail cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tb_gpuprof.store import layout
from tb_gpuprof.store.reader import event_files, iter_events
from tests.conftest import run_cli


@pytest.mark.parametrize("run", ["kineto", "xplane"])
def test_imported_run_reports_like_the_trace(imported_logdir, kineto_trace, xplane_trace, run):
    trace = {"kineto": kineto_trace, "xplane": xplane_trace}[run]
    from_trace = json.loads(run_cli("report", str(trace), "--format", "json").stdout)
    from_logdir = json.loads(run_cli("report", str(imported_logdir), "--run", run,
                                     "--format", "json").stdout)
    from_run_dir = json.loads(run_cli("report", str(imported_logdir / run),
                                      "--format", "json").stdout)
    assert from_logdir == from_trace
    assert from_run_dir == from_trace


def test_import_writes_scalars_report_and_raw_trace(imported_logdir, kineto_trace):
    run_dir = imported_logdir / "kineto"
    report = json.loads(run_cli("report", str(kineto_trace), "--format", "json").stdout)
    items = report["iterations"]["items"]
    assert items, "the fixture has iterations"
    # Unnumbered iterations (step null) are written at their index.
    steps = [it["step"] if it["step"] is not None else i for i, it in enumerate(items)]
    last_step = report["iterations"]["range"][1]
    if last_step is None:
        last_step = max(steps)

    scalars, report_steps = {}, []
    for path in event_files(str(run_dir)):
        for event in iter_events(path):
            for v in event.summary.value:
                if v.tag == layout.ITERATION_TIME_TAG:
                    scalars[event.step] = v.simple_value
                elif layout.parse_report_tag(v.tag):
                    report_steps.append(event.step)
    assert report_steps == [last_step]
    assert sorted(scalars) == sorted(steps)
    for step, it in zip(steps, items, strict=True):
        assert scalars[step] == pytest.approx(it["wall_ms"], rel=1e-6)

    copies = list((run_dir / "plugins" / "gpuprof" / "traces").rglob("*"))
    files = sorted(p for p in copies if p.is_file())
    # the raw trace, and beside it the context its analysis had (here: no key, no hook)
    assert [(p.parent.name, p.name) for p in files] == [
        (f"step_{last_step}", "context.json"), (f"step_{last_step}", kineto_trace.name)]
    assert files[1].read_bytes() == kineto_trace.read_bytes()
    assert json.loads(files[0].read_text()) == {}


def test_default_run_name_comes_from_the_trace(tmp_path, xplane_trace):
    out = run_cli("import", str(xplane_trace), "--logdir", str(tmp_path)).stdout
    assert (tmp_path / "jax_conv_h200").is_dir()
    assert f"tensorboard --logdir {tmp_path}" in out


@pytest.mark.parametrize("run", ["../escape", "/abs/run", "a/../../b", "."])
def test_run_names_cannot_leave_the_logdir(tmp_path, xplane_trace, run):
    logdir = tmp_path / "logs"
    proc = run_cli("import", str(xplane_trace), "--logdir", str(logdir), "--run", run,
                   check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "invalid run name" in proc.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == []


def test_reimport_into_the_same_run_is_refused(tmp_path, xplane_trace):
    run_cli("import", str(xplane_trace), "--logdir", str(tmp_path), "--run", "r")
    proc = run_cli("import", str(xplane_trace), "--logdir", str(tmp_path), "--run", "r",
                   check=False)
    assert proc.returncode == 2 and "already holds event files" in proc.stderr
    assert len(event_files(str(tmp_path / "r"))) == 1


def test_bad_trace_fails_in_one_line_and_creates_no_run(tmp_path):
    bad = tmp_path / "broken.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    logdir = tmp_path / "logs"
    proc = run_cli("import", str(bad), "--logdir", str(logdir), check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and str(bad) in proc.stderr
    assert not Path(logdir).exists() or not any(Path(logdir).rglob("*tfevents*"))


@pytest.mark.parametrize("var", ["SLURM_PROCID", "RANK", "OMPI_COMM_WORLD_RANK"])
def test_import_under_a_launchers_rank_is_an_ordinary_run(tmp_path, kineto_trace, var):
    """A shell inside a SLURM job or a torchrun worker has a rank in its environment; an
    import there is still one single-process run: no rank in file names, tags or traces."""
    import os

    env = {**os.environ, var: "1"}
    run_cli("import", str(kineto_trace), "--logdir", str(tmp_path), "--run", "r", env=env)
    run_dir = tmp_path / "r"
    files = event_files(str(run_dir))
    assert len(files) == 1 and ".rank" not in Path(files[0]).name
    tags = {v.tag for e in iter_events(files[0]) for v in e.summary.value}
    reports = [t for t in tags if layout.parse_report_tag(t)]
    assert reports == [layout.report_tag(layout.parse_report_tag(reports[0])[0])], reports
    traces = {p.parent.name for p in (run_dir / "plugins" / "gpuprof" / "traces").rglob("*")
              if p.is_file()}
    assert len(traces) == 1 and ".rank" not in next(iter(traces)), traces
    # and the plugin/CLI read it as the run's own report
    report = json.loads(run_cli("report", str(run_dir), "--format", "json").stdout)
    assert report["iterations"]["count"] >= 1


@pytest.mark.parametrize("where", ["is_a_file", "under_a_file"])
def test_bad_logdir_is_one_line_and_exit_2(tmp_path, kineto_trace, where):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    logdir = blocker if where == "is_a_file" else blocker / "runs"
    proc = run_cli("import", str(kineto_trace), "--logdir", str(logdir), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tb-gpuprof import: error:") and str(blocker) in lines[0]
    assert "Traceback" not in proc.stderr and blocker.read_text() == "not a directory"
