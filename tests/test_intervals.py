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


def test_column_queries_equal_the_scalar_ones_bit_for_bit():
    """overlaps/gap_columns (numpy, all queries at once) give exactly overlap/gaps' floats,
    on both construction paths (plain merge below 256 intervals, numpy above), with queries
    on interval boundaries, empty and reversed ranges."""
    import numpy as np

    rng = random.Random(11)
    for _ in range(150):
        n = rng.choice([0, 1, 5, 40, 600])
        ivs = [(s := rng.uniform(0, 1000), s + rng.choice([0.0, rng.uniform(0, 20), 1.0]))
               for _ in range(n)]
        cov = Coverage(ivs)
        edges = [x for iv in cov.iv for x in iv]
        for _ in range(20):
            a = rng.choice([rng.uniform(-10, 1010), *rng.sample(edges, min(2, len(edges)))])
            b = rng.choice([a, a - 1.0, a + rng.uniform(0, 100), 2000.0,
                            *rng.sample(edges, min(1, len(edges)))])
            gs, ge = cov.gap_columns(a, b)
            assert list(zip(gs.tolist(), ge.tolist(), strict=True)) == cov.gaps(a, b)
            qa, qb = np.array([a, b, a]), np.array([b, a, b + 3.0])
            assert cov.overlaps(qa, qb).tolist() == [cov.overlap(x, y) for x, y in
                                                     zip(qa.tolist(), qb.tolist(), strict=True)]


def test_clip_columns_and_segment_sums_equal_the_loops():
    import numpy as np

    from tb_gpuprof.analysis.intervals import segment_sums

    rng = random.Random(5)
    for _ in range(100):
        n = rng.choice([0, 3, 40, 600])
        cov = Coverage([(s := rng.uniform(0, 1000), s + rng.uniform(0, 30)) for _ in range(n)])
        a = np.array([rng.uniform(-10, 1010) for _ in range(25)])
        b = a + np.array([rng.choice([0.0, -2.0, rng.uniform(0, 200)]) for _ in range(25)])
        query, ps, pe = cov.clip_columns(a, b)
        got: list[list[tuple[float, float]]] = [[] for _ in a]
        for q, s, e in zip(query.tolist(), ps.tolist(), pe.tolist(), strict=True):
            got[q].append((s, e))
        assert got == [cov.clip(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
        # sums in the loop's order: values of very different size, so the order shows
        seg = sorted(rng.randrange(6) for _ in range(rng.randrange(60)))
        vals = [rng.choice([1e12, 1.0, 1e-7]) * rng.random() for _ in seg]
        want = [0.0] * 6
        for g, v in zip(seg, vals, strict=True):
            want[g] += v
        assert segment_sums(np.array(vals), np.array(seg, np.int64), 6).tolist() == want


def test_subtract_in_columns_equals_the_loop():
    """Large inputs take numpy's path: the same pieces as the loop, also with zero-length and
    touching intervals (which split a), and an empty or unsorted b."""
    rng = random.Random(9)
    for _ in range(200):
        a = merge((s := float(rng.randrange(4000)) / 2, s + rng.choice([1.0, 2.5]))
                  for _ in range(rng.choice([1, 300])))
        b = merge((s := float(rng.randrange(4000)) / 2, s + rng.choice([0.5, 3.0]))
                  for _ in range(rng.choice([0, 300])))
        if b and rng.random() < 0.5:
            b = sorted(b + [(s, s) for s, _ in b[::7]])  # zero-length, touching its neighbour
        want = _subtract_loop(a, b)
        assert subtract(a, b) == want
    unsorted = [(5.0, 6.0), (1.0, 2.0)] * 200
    assert subtract(unsorted, [(1.5, 5.5)]) == _subtract_loop(unsorted, [(1.5, 5.5)])


def _subtract_loop(a, b):
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def test_columnar_coverage_answers_scalar_queries_like_the_merged_list():
    """Above 256 intervals a Coverage keeps only numpy columns (no lists of tuples); its
    scalar queries must give exactly what the merged list gives."""
    rng = random.Random(13)
    for _ in range(20):
        ivs = [(s := rng.randrange(0, 4000) / 2, s + rng.randrange(0, 12) / 2)
               for _ in range(rng.choice([300, 700]))]
        cov = Coverage(ivs)
        merged = merge(ivs)
        assert cov._iv is None and len(cov) == len(merged)  # the columnar form
        assert cov.iv == merged and cov.starts == [s for s, _ in merged]
        assert cov.total() == sum(e - s for s, e in merged)
        for _ in range(30):
            a = rng.choice([rng.randrange(-20, 2040) / 2, rng.choice(merged)[0]])
            b = a + rng.choice([0.0, -1.0, rng.randrange(1, 80) / 2, 5000.0])
            if 0 < b - a < 50:
                assert cov.overlap(a, b) == _covered(merged, a, b)
            assert cov.overlap(a, b) == (length(merged, a, b) if b > a else 0.0)
            assert cov.clip(a, b) == [(max(s, a), min(e, b)) for s, e in merged
                                      if s < b and e > a]
            want_gaps = subtract([(a, b)], merged) if b > a else []
            assert cov.gaps(a, b) == want_gaps


def test_union_of_parts_is_the_coverage_of_their_concatenation():
    """Coverage.union merges each part first, then the parts' runs: the same runs, bit for
    bit, as one merge of all the spans (ties, touching and empty spans, NaN, empty parts)."""
    import numpy as np

    rng = random.Random(39)
    for _ in range(200):
        parts = []
        for _ in range(rng.randrange(1, 4)):
            n = rng.choice([0, 1, 5, 300])
            s = np.array([rng.randrange(0, 400) / 2 for _ in range(n)], np.float64)
            e = s + np.array([rng.choice([0, 0.5, 1, 3, 40, -1]) for _ in range(n)])
            if n and rng.random() < 0.2:
                s[rng.randrange(n)] = float("nan")
            parts.append((s, e))
        one = Coverage.of_arrays(np.concatenate([s for s, _ in parts]),
                                 np.concatenate([e for _, e in parts]))
        got = Coverage.union(parts)
        for a, b in zip(got.arrays(), one.arrays(), strict=True):
            assert a.tobytes() == b.tobytes()
