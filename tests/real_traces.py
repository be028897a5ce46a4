"""Every real GPU trace in tests/data, with what the hook knew when it was recorded, and its
report built once per session: the invariant tests (tests/test_invariants_*.py) run over all
of them, so a trace added to tests/data is covered without touching the tests.

Context files come in three shapes (tests/data/*/README.md): ``<case>.env.json`` is either the
hook's system/flags itself (tests/data/h200) or a record with ``hook_system`` and
``unprofiled`` (h200_loops, h200_ladders); a trace without one is analysed bare.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.readers import load_profile

DATA = Path(__file__).parent / "data"
TRACE_SUFFIXES = (".json.gz", ".xplane.pb")


def _case_name(path: Path) -> str:
    name = path.name
    for suffix in TRACE_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def trace_paths() -> list[Path]:
    """Every trace file under tests/data (sorted), whatever folder it is in."""
    return sorted(p for p in DATA.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def trace_ids() -> list[str]:
    return [str(p.relative_to(DATA)) for p in trace_paths()]


def context(path: Path) -> dict[str, Any] | None:
    """The ``env`` build_report takes for this trace (the hook's), or None when none was kept."""
    meta_path = path.with_name(f"{_case_name(path)}.env.json")
    if not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text())
    if "hook_system" not in meta and "unprofiled" not in meta:
        return meta  # tests/data/h200: the hook's system/flags as they are
    env = dict(meta.get("hook_system") or {})
    if meta.get("unprofiled"):
        env["unprofiled"] = meta["unprofiled"]
    return env


@functools.cache
def real_report(trace_id: str) -> dict[str, Any]:
    """The current analysis's report of tests/data/<trace_id>, with its context."""
    path = DATA / trace_id
    return build_report(load_profile(str(path), python_calls=False), env=context(path))


__all__ = ["DATA", "context", "real_report", "trace_ids", "trace_paths"]
