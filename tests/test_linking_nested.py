"""Linking's nested fast path (stacks found by counting, contexts folded depth by depth in
numpy) against the stack sweep it replaces: the same stacks on random ranges, and the same
launch contexts and op FLOPs on every real trace in tests/data."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from tb_gpuprof.analysis import columns, linking
from tb_gpuprof.analysis.classify import is_tc_eligible_op
from tb_gpuprof.readers import load_profile

DATA = os.path.join(os.path.dirname(__file__), "data")
TRACES = sorted(glob.glob(os.path.join(DATA, "**", "*.json.gz"), recursive=True)
                + glob.glob(os.path.join(DATA, "**", "*.pb"), recursive=True))


def _swept_tops(starts: np.ndarray, kinds: np.ndarray, ends: np.ndarray
                ) -> tuple[list[int], list[int]]:
    """The sweep's stack, event by event: its top after popping, and its size."""
    stack: list[int] = []
    tops, sizes = [], []
    for i, (start, kind) in enumerate(zip(starts.tolist(), kinds.tolist(), strict=True)):
        while stack and ends[stack[-1]] <= start:
            stack.pop()
        tops.append(stack[-1] if stack else -1)
        sizes.append(len(stack))
        if kind != linking._LAUNCH:
            stack.append(i)
    return tops, sizes


def _random_sweep(rng: np.random.Generator, nested: bool) -> tuple[np.ndarray, ...]:
    """Ranges (a random tree of children inside parents, or anywhere) and point launches,
    in the sweep's order; rounded so that starts and ends often coincide."""
    spans: list[tuple[float, float]] = []

    def grow(lo: float, hi: float, depth: int) -> None:
        t = lo
        while t < hi and depth < 6 and rng.random() < 0.8:
            s = round(t + rng.random() * (hi - t) / 3, 1)
            e = round(min(hi, s + rng.random() * (hi - s)), 1)
            if rng.random() < 0.01:
                e = s  # a range that ends at its start
            elif e <= s:
                break
            spans.append((s, e))
            grow(s, e, depth + 1)
            t = e + (0.0 if rng.random() < 0.3 else 0.5)

    grow(0.0, 100.0, 0)
    if not nested:
        for _ in range(int(rng.integers(1, 4))):
            s = round(rng.random() * 100, 1)
            spans.append((s, round(s + rng.random() * 30, 1)))
    n_launch = int(rng.integers(1, 40))
    launch_t = np.round(rng.random(n_launch) * 100, 1)
    starts = np.array([s for s, _ in spans] + launch_t.tolist(), np.float64)
    durs = np.array([e - s for s, e in spans] + [0.0] * n_launch, np.float64)
    kinds = np.array([linking._OP if rng.random() < 0.8 else linking._ANNOTATION
                      for _ in spans] + [linking._LAUNCH] * n_launch)
    index = np.arange(len(starts))
    order = linking._sweep_order(starts, durs, kinds, index)
    return starts[order], kinds[order], (starts + durs)[order]


def test_counted_stacks_are_the_sweeps_stacks_or_none():
    rng = np.random.default_rng(15)
    found = declined = 0
    for trial in range(400):
        starts, kinds, ends = _random_sweep(rng, nested=trial % 3 != 0)
        tops, sizes = _swept_tops(starts, kinds, ends)
        got = linking._stack_tops(starts, kinds, ends)
        if got is None:
            declined += 1
            continue
        found += 1
        assert got[0].tolist() == tops
        assert got[1].tolist() == sizes
    assert found > 150 and declined > 100  # both answers were exercised


def test_partly_overlapping_ranges_go_to_the_sweep():
    # B starts inside A and ends after it: the sweep keeps A below B after A has ended
    starts = np.array([0.0, 5.0, 12.0])
    kinds = np.array([linking._OP, linking._OP, linking._LAUNCH])
    ends = np.array([10.0, 15.0, 12.0])
    assert linking._stack_tops(starts, kinds, ends) is None
    assert _swept_tops(starts, kinds, ends)[0] == [-1, 0, 1]


def _linked(profile, nested: bool):
    stack_tops = linking._stack_tops
    used = []

    def tops(*args):
        got = stack_tops(*args) if nested else None
        used.append(got is not None)
        return got

    linking._stack_tops = tops
    try:
        with columns.column_scope():
            out, flops = linking.link_launches(profile, is_tc_eligible_op)
    finally:
        linking._stack_tops = stack_tops
    return list(out.items()), sorted(flops.items()), any(used)


@pytest.mark.parametrize("path", TRACES, ids=[os.path.relpath(p, DATA) for p in TRACES])
def test_nested_path_links_every_real_trace_as_the_sweep_does(path):
    profile = load_profile(path)
    fast, fast_flops, used = _linked(profile, nested=True)
    slow, slow_flops, _ = _linked(profile, nested=False)
    assert fast == slow  # every context, field by field, in the same order
    assert fast_flops == slow_flops
    if path.endswith(".json.gz") and slow:
        assert used  # PyTorch's ops nest: the fast path took these
