"""Shared access to the real H200 profiles in tests/data/h200 (analysis cached per session)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.readers import load_profile

DATA = Path(__file__).parent / "data" / "h200"
# Copies of shared/fixtures, so the tests run from a plain clone (tests/data/h200/README.md).
TRANSFORMER = DATA.parent / "kineto_transformer_bf16_h200.json.gz"
JAX_CONV = DATA.parent / "jax_conv_h200.xplane.pb"


@functools.cache
def profile(case: str):
    return load_profile(DATA / f"{case}.json.gz")


def env(case: str) -> dict:
    return json.loads((DATA / f"{case}.env.json").read_text())


@functools.cache
def report(case: str, with_env: bool = True) -> dict:
    return build_report(profile(case), env=env(case) if with_env else None)


def rec_ids(rep: dict) -> list[str]:
    return [r["id"] for r in rep["recommendations"]]


LOOPS = DATA.parent / "h200_loops"  # real loops recorded through our hooks (README.md there)
LADDERS = DATA.parent / "h200_ladders"  # rungs of the savings ladders (benchmarks/bench_savings)


def loop_env(case: str) -> dict:
    """What the hook knew: its system/flags, and the un-profiled iteration time measured beside
    the window (``unprofiled``), as the hook passes it to build_report."""
    meta = json.loads((_loop_dir(case) / f"{case}.env.json").read_text())
    env = dict(meta.get("hook_system") or {})
    if meta.get("unprofiled"):
        env["unprofiled"] = meta["unprofiled"]
    return env


@functools.cache
def loop_report(case: str, corrected: bool = True) -> dict:
    path = next(_loop_dir(case).glob(f"{case}.*[bz]"))  # .json.gz or .xplane.pb
    env = loop_env(case)
    if not corrected:
        env.pop("unprofiled", None)
    return build_report(load_profile(path), env=env)


def _loop_dir(case: str) -> Path:
    return LOOPS if (LOOPS / f"{case}.env.json").exists() else LADDERS
