"""The report's one-pass forms (issue 15, branch perf9) against the per-item code they
replace, on every real trace in tests/data and ../shared/fixtures: the same floats (compared
by repr, so -0.0 and NaN count), the same orders.

- ``bottleneck.window_shares`` (every window at once) vs ``bottleneck.iteration_shares``,
  also on windows the report does not make (overlapping, empty, reversed, outside the trace);
- ``stages.assign_to_iterations`` (columns) vs the loop it replaced (kept here as the
  reference), through ``stages.align_to_gpu``: the same windows, the same work in each;
- the times it hands on (``Linked.times``) against the activities' own, and the tally and
  the replay's kernel columns made from them against those that read the activities.
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


def _assign_loop(prof, windows):
    """assign_to_iterations as it was before branch perf9: an activity at a time."""
    import numpy as np

    from tb_gpuprof.analysis.classify import is_tc_eligible_op
    from tb_gpuprof.analysis.linking import link_launches

    launches, _ = link_launches(prof, is_tc_eligible_op)
    contexts = [launches.get(g.correlation) if g.correlation is not None else None
                for g in prof.gpu]
    backlog = np.array([ctx is None and bool(launches) and bool(g.correlation)
                        for ctx, g in zip(contexts, prof.gpu, strict=True)], bool)
    starts = np.array([g.start_us for g in prof.gpu], np.float64)
    launched = np.array([ctx.launch_us if ctx else g.start_us
                         for ctx, g in zip(contexts, prof.gpu, strict=True)], np.float64)
    window = stages._window_of(windows, launched)
    retry = (window < 0) & np.array([ctx is not None for ctx in contexts], bool)
    window[retry] = stages._window_of(windows, starts[retry])
    window[backlog] = -1
    per_window = [[] for _ in windows]
    for i, wi in enumerate(window.tolist()):
        if wi >= 0:
            per_window[wi].append((prof.gpu[i], contexts[i]))
    stages.align_to_gpu(windows, per_window, [g for g, wi in zip(prof.gpu, window.tolist(),
                                                                  strict=True) if wi < 0])
    return per_window


def _view(windows, per_window):
    return (repr([(w.index, w.step, w.start_us, w.end_us) for w in windows]),
            [[(id(a), None if c is None else (repr(c.launch_us), c.op, c.phase, c.flop_op))
              for a, c in acts] for acts in per_window])


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_assign_in_columns_is_the_loop(path):
    prof = load_profile(path)
    with column_scope():
        sel = stages.select_iterations(prof, None, None, None)
        fresh = stages.select_iterations(prof, None, None, None).windows
        fast = stages.assign_to_iterations(prof, sel.windows).per_window
    loop = _assign_loop(prof, fresh)
    assert _view(sel.windows, fast) == _view(fresh, loop)
    assert sum(map(len, fast)) > 0 or not prof.gpu


def test_the_times_assign_hands_on_are_the_activities_own(traced):
    """Linked.times (read once in assign_to_iterations) give the tally and the replay's
    kernel columns what reading the activities gives them."""
    import numpy as np

    from tb_gpuprof.analysis.whatif import _KernelColumns

    _, _, linked = traced
    acts = [(a, c) for w in linked.per_window for a, c in w]
    times = linked.times
    assert times is not None and len(times.start) == len(acts)
    assert times.start.tolist() == [a.start_us for a, _ in acts]
    assert times.dur.tolist() == [a.dur_us for a, _ in acts]
    assert times.has_launch.tolist() == [c is not None for _, c in acts]
    assert times.launch.tolist() == [c.launch_us if c else 0.0 for _, c in acts]
    given = stages.tally_activities(linked.per_window, times)
    read = stages.tally_activities(linked.per_window)
    assert given.times is times
    assert repr([given.totals, given.category_us, given.precision_us, given.phase_us,
                 [(w.breakdown_us, w.busy.iv) for w in given.windows]]) == repr(
        [read.totals, read.category_us, read.precision_us, read.phase_us,
         [(w.breakdown_us, w.busy.iv) for w in read.windows]])
    a, b = _KernelColumns.of(given.sim_kernels, times), _KernelColumns.of(read.sim_kernels)
    assert (a is None) == (b is None)
    if a is not None:
        for field in ("start", "dur", "launch", "has_launch", "stream", "is_kernel"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_the_replays_queues_in_columns_are_the_loop(traced):
    """whatif._Queues.columns (a queue's kernels between syncs at once) vs its loop, on the
    window's replay under host rates from idle to saturated queues, syncs waiting or not."""
    from tb_gpuprof.analysis import whatif

    prof, sel, linked = traced
    tally = stages.tally_activities(linked.per_window, linked.times)
    replay = stages.window_replay(prof, tally.sim_kernels, host_timeline(prof), sel.windows,
                                  tally.sim_classes, tally.times)
    if replay is None:
        pytest.skip("no GPU work in the window")
    table = replay._prepare()
    for scale in (0.0, 0.1, 0.45, 1.0, 3.0):
        now, origin, _ = table.host_time_column(
            {"framework": scale, "outside": scale, "data": 1.0, "copy_call": scale})
        for waits in (True, False):
            loop = whatif._Queues(origin, table.queues, replay.latency_us, replay.gap_us)
            loop.loop(now.tolist(), table.queue, table.duration_column.tolist(), waits)
            cols = whatif._Queues(origin, table.queues, replay.latency_us, replay.gap_us)
            cols.columns(now, table.queue_column, table.duration_column, waits)
            assert repr((cols.waited, cols.gpu_done, cols.free)) == repr(
                (loop.waited, loop.gpu_done, loop.free))


@pytest.mark.parametrize("seed", range(40))
def test_a_queue_chain_in_columns_is_the_loop(seed):
    """whatif._chain against _chain_loop on random queues: idle, saturated and mixed, with
    ties between a kernel's launch and its queue's ready time (whole microseconds)."""
    import numpy as np

    from tb_gpuprof.analysis import whatif

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    spacing = [0.0, 0.5, 2.0, 10.0][seed % 4]  # mean launch spacing vs ~2 us kernels
    if seed % 3 == 0:  # whole numbers: exact ties
        begin = np.cumsum(rng.integers(0, 2 * int(spacing) + 2, n)).astype(np.float64)
        dur = rng.integers(0, 5, n).astype(np.float64)
        gap = float(seed % 2)
    else:
        begin = 1e6 + np.cumsum(rng.exponential(spacing + 1e-3, n))
        dur = rng.exponential(2.0, n)
        gap = [0.0, 0.3, 1.7][seed % 3]
    ready0 = float(begin[0] + rng.normal(0, 5))
    fast = whatif._chain(begin, dur, ready0, gap)
    slow = whatif._chain_loop(begin, dur, ready0, gap)
    assert fast.tolist() == slow.tolist()
