"""The report's one-pass forms (issue 15, branch perf9) against the per-item code they
replace, on every real trace in tests/data and ../shared/fixtures: the same floats (compared
by repr, so -0.0 and NaN count), the same orders.

- ``bottleneck.window_shares`` (every window at once) vs ``bottleneck.iteration_shares``;
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tb_gpuprof.analysis import stages
from tb_gpuprof.analysis.bottleneck import (
    gpu_intervals,
    host_timeline,
    iteration_shares,
    window_shares,
)
from tb_gpuprof.analysis.classify import classify_kernel
from tb_gpuprof.analysis.columns import column_scope
from tb_gpuprof.model import KERNEL
from tb_gpuprof.readers import load_profile

ROOT = Path(__file__).resolve().parent
TRACES = sorted([*ROOT.glob("data/**/*.json.gz"), *ROOT.glob("data/**/*.pb"),
                 *(ROOT.parents[1] / "shared" / "fixtures").glob("*.[gb]z"),
                 *(ROOT.parents[1] / "shared" / "fixtures").glob("*.pb")])


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name)
def traced(request):
    prof = load_profile(request.param)
    with column_scope():
        sel = stages.select_iterations(prof, None, None, None)
        linked = stages.assign_to_iterations(prof, sel.windows)
        yield prof, sel, linked


def _is_comm(name: str) -> bool:
    return classify_kernel(name, KERNEL).category == "communication"


def test_window_shares_are_iteration_shares(traced):
    prof, sel, _ = traced
    gpu, host = gpu_intervals(prof, _is_comm), host_timeline(prof)
    bounds = [(w.start_us, w.end_us) for w in sel.windows]
    # and windows the report does not make: overlapping, spanning two, empty, reversed
    first, last = bounds[0], bounds[-1]
    mid = (first[0] + first[1]) / 2
    bounds += [(first[0], last[1]), (mid, last[1]), (mid, mid), (first[1], first[0]),
               (first[0] - 1e6, first[0]), (last[1], last[1] + 1e6)]
    fast = window_shares(bounds, gpu, host)
    slow = [iteration_shares(s, e, gpu, host) for s, e in bounds]
    assert [repr(list(d.items())) for d in fast] == [repr(list(d.items())) for d in slow]
    assert any(d["gpu"] > 0 for d in fast) or not prof.gpu
