"""Interval helpers against a brute-force sweep on random intervals."""

from __future__ import annotations

import random

from tb_gpuprof.analysis.intervals import Coverage, intersect, length, merge, subtract


def _covered(ivs, a, b, step=0.25):
    # Brute force on a fine grid: every boundary below is a multiple of 0.5.
    n = 0
    t = a
    while t < b:
        if any(s <= t < e for s, e in ivs):
            n += 1
        t += step
    return n * step


def test_overlap_and_gaps_match_a_brute_force_sweep():
    rng = random.Random(7)
    for _ in range(200):
        ivs = [(s := rng.randrange(0, 200) / 2, s + rng.randrange(1, 30) / 2)
               for _ in range(rng.randrange(0, 12))]
        cov = Coverage(list(ivs))
        a = rng.randrange(-10, 200) / 2
        b = a + rng.randrange(0, 120) / 2
        assert cov.overlap(a, b) == _covered(ivs, a, b)
        assert sum(e - s for s, e in cov.gaps(a, b)) == (b - a) - cov.overlap(a, b)


def test_set_operations():
    a = merge([(0, 10), (5, 15), (20, 30)])
    assert a == [(0, 15), (20, 30)]
    b = merge([(12, 22)])
    assert intersect(a, b) == [(12, 15), (20, 22)]
    assert subtract(a, b) == [(0, 12), (22, 30)]
    assert length(a) == 25 and length(a, 10, 25) == 10
