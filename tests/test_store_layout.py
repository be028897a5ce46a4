"""store/layout.py owns every storage name: build/parse pairs agree, ``safe_join`` holds on a
real directory tree with hostile names and symlinks, and no other module spells a tag."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from tb_gpuprof.store import layout
from tb_gpuprof.store.reader import find_runs, stored_reports
from tb_gpuprof.store.writer import EventWriter, save_raw_trace

PACKAGE = Path(layout.__file__).resolve().parents[1]
FRONTEND_SRC = PACKAGE.parent / "frontend" / "src"


@pytest.mark.parametrize("step,rank", [(0, None), (7, 0), (12, 3), (10**9, 15)])
def test_build_and_parse_are_inverse(step, rank):
    assert layout.parse_report_tag(layout.report_tag(step, rank)) == (step, rank or 0)
    assert layout.parse_trace_dir_name(layout.trace_dir_name(step, rank)) == (step, rank or 0)
    if rank:
        assert layout.parse_rank_run_name(layout.rank_run_name(rank)) == (".", rank)
        assert layout.parse_rank_run_name(layout.rank_run_name(rank, "ddp/a")) == ("ddp/a", rank)
    name = layout.scalar_tag(f"gpu{step % 8}/sm_util_pct")
    assert name == layout.telemetry_tag(step % 8, "sm_util_pct")
    assert layout.is_telemetry_scalar(name) and layout.scalar_name(name).startswith("gpu")
    for other in ("gpuprof/reportx/1", "gpuprof/report/-1", "gpuprof/report/1/rank", "step_1x"):
        assert layout.parse_report_tag(other) is None
        assert layout.parse_trace_dir_name(other) is None


def test_writer_and_reader_agree_through_the_layout(tmp_path):
    run = tmp_path / "logs" / "job"
    with EventWriter(run, rank=2) as w:
        w.add_scalar(layout.ITERATION_TIME_TAG, 3.0, 0)
        w.add_report({"schema_version": 1}, step=5)
    (name,) = os.listdir(run)
    assert layout.is_events_file(name) and name.endswith(".gpuprof.rank2")
    assert [(r.step, r.rank) for r in stored_reports(str(run))] == [(5, 2)]
    (tmp_path / "in").mkdir()
    src = tmp_path / "in" / "x.tfevents.trace.json"
    src.write_text("{}")
    copy = Path(save_raw_trace(run, src, 5, rank=2))
    assert not layout.is_events_file(copy.name)  # TensorBoard must not read the trace
    assert layout.parse_trace_dir_name(copy.parent.name) == (5, 2)
    assert copy.parent.parent == Path(layout.traces_root(run))
    assert list(find_runs(str(tmp_path / "logs"))) == ["job"]


def test_safe_join_stays_inside_the_root(tmp_path):
    root = tmp_path / "logs"
    (root / "run" / "sub").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.mkdir()
    (root / "run" / "escape").symlink_to(outside)
    (root / "run" / "inner").symlink_to(root / "run" / "sub")
    real = os.path.realpath(root)
    assert layout.safe_join(root, "run", "sub") == os.path.join(real, "run", "sub")
    assert layout.safe_join(root, "run", "inner") == os.path.join(real, "run", "sub")
    assert layout.safe_join(root) == real and layout.safe_join(root, ".") == real
    for parts in (("..",), ("run", "..", ".."), ("run/../../x",), ("run\\..\\..",),
                  (str(outside),), ("run", "escape"), ("run", "escape", "f"), ("a\0b",)):
        assert layout.safe_join(root, *parts) is None, parts


def _strings(path: Path) -> list[tuple[int, str, bool]]:
    """(line, text, is the start of an f-string) of every string in code, docstrings left out."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            out.append((n.lineno, n.value, False))
        elif isinstance(n, ast.JoinedStr) and n.values and isinstance(n.values[0], ast.Constant):
            out.append((n.lineno, str(n.values[0].value), True))
    return out


# A tag, an events-file mark, or the head of a built trace-dir / rank / events-file name.
STORAGE_NAME = re.compile(r"^(gpuprof/|tfevents$|events\.out)")
BUILT_NAME = re.compile(r"^(gpuprof/|step_$|\.?rank$|events\.out)")


def test_no_module_but_the_layout_spells_a_storage_name():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "layout.py" and path.parent.name == "store":
            continue
        for line, s, fstring in _strings(path):
            if (BUILT_NAME if fstring else STORAGE_NAME).match(s):
                offenders.append(f"{path.relative_to(PACKAGE)}:{line}: {s!r}")
    assert not offenders, offenders


def test_the_frontend_takes_tag_names_from_the_server():
    if not FRONTEND_SRC.is_dir():
        pytest.skip("no frontend sources in this checkout")
    literal = re.compile(r"""["'`]gpuprof/[a-z]""")
    offenders = [f"{p.name}:{i}" for p in FRONTEND_SRC.rglob("*.ts*")
                 if not p.name.endswith(".gen.ts")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert not offenders, offenders
