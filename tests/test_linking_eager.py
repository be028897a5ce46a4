"""Linking's eager fold (each range folded when the sweep pushes it, a launch reads the top)
against the lazy fold it replaced (kept here: a launch folds the entries pushed since the last
one), on every real trace in tests/data and ../shared/fixtures and on random nestings: the
same launch contexts field by field in the same order, the same FLOPs dict in the same order.
"""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from tb_gpuprof.analysis import linking
from tb_gpuprof.analysis.classify import is_tc_eligible_op
from tb_gpuprof.analysis.columns import column_scope
from tb_gpuprof.model import OPTIMIZER, Annotation, CpuOp, Profile, RuntimeCall
from tb_gpuprof.readers import load_profile

ROOT = Path(__file__).resolve().parent
TRACES = sorted([*ROOT.glob("data/**/*.json.gz"), *ROOT.glob("data/**/*.pb"),
                 *(ROOT.parents[1] / "shared" / "fixtures").glob("*.[gb]z"),
                 *(ROOT.parents[1] / "shared" / "fixtures").glob("*.pb")])


class _LazyFold(linking._StackFold):
    """The fold before perf10: entries keep [end, kind, index, fold or None]."""

    def push_annotation(self, acc: tuple, j: int) -> tuple:
        if acc[7] is None and self.opens_optimizer(self.host_ann[j]):
            return (*acc[:7], j, *acc[8:])
        return acc

    def summary(self, stack: list[list]) -> tuple:
        low = len(stack) - 1
        while low >= 0 and stack[low][3] is None:
            low -= 1
        acc = stack[low][3] if low >= 0 else linking._EMPTY
        for entry in stack[low + 1:]:
            if entry[1] == linking._ANNOTATION:
                acc = entry[3] = self.push_annotation(acc, entry[2])
            else:
                acc, flops = self.push_op(acc, entry[2])
                entry[3] = acc
                self.lazy_flops[entry[2]] = flops
        return acc


def _lazy_link(profile: Profile, is_eligible) -> tuple[dict, dict]:
    out: dict = {}
    in_optimizer: dict = {}
    fold = _LazyFold(profile, is_eligible)
    fold.lazy_flops = {}
    correlation = [c.correlation for c in profile.runtime]
    for swept in linking._sweeps(profile, fold.host_ann):
        stack: list[list] = []
        for start, kind, idx, end in linking._as_python(swept):
            while stack and stack[-1][0] <= start:
                stack.pop()
            if kind != linking._LAUNCH:
                stack.append([end, kind, idx, None])
                continue
            corr = correlation[idx]
            (outer, _inner, is_elig, flop_op, types, source, launch_op, opt_range, backward,
             saw_op) = fold.summary(stack) if stack else linking._EMPTY
            if backward:
                phase = linking.BACKWARD
            elif opt_range is not None:
                phase = linking.OPTIMIZER_PHASE
            else:
                phase = linking.FORWARD if saw_op else None
            out[corr] = linking.LaunchContext(start, outer, is_elig, phase, flop_op, types,
                                              source, launch_op)
            if opt_range is not None:
                in_optimizer[corr] = opt_range
    _split_closures(out, in_optimizer)
    return out, {i: f for i, f in fold.lazy_flops.items() if f}


def _split_closures(out: dict, in_optimizer: dict) -> None:
    """The closures' split on a dict of LaunchContext, before linking kept them in columns."""
    last_backward: dict[int, float] = {}
    for corr, rng in in_optimizer.items():
        ctx = out[corr]
        if ctx.phase == linking.BACKWARD and ctx.launch_us > last_backward.get(rng, float("-inf")):
            last_backward[rng] = ctx.launch_us
    for corr, rng in in_optimizer.items():
        ctx = out[corr]
        if ctx.phase == linking.OPTIMIZER_PHASE and \
                ctx.launch_us < last_backward.get(rng, float("-inf")):
            ctx.phase = linking.FORWARD


def _assert_same(profile: Profile) -> tuple[dict, dict]:
    with column_scope():
        eager, eager_flops = linking.link_launches(profile, is_tc_eligible_op)
    lazy, lazy_flops = _lazy_link(profile, is_tc_eligible_op)
    assert list(eager) == list(lazy) and len(eager) == len(lazy)
    for corr, ctx in lazy.items():
        assert repr(msgspec.structs.astuple(eager[corr])) == repr(msgspec.structs.astuple(ctx))
        assert eager[corr].input_types is ctx.input_types
    # the columns' bulk lookup and the mapping's agree, absent ids included
    probe = [*lazy, None, -1, max(lazy, default=0) + 1, *list(lazy)[:3]]
    rows = eager.rows(probe)
    assert [eager.get(c) is None for c in probe] == (rows < 0).tolist()
    assert [c in eager for c in probe] == (rows >= 0).tolist()
    assert repr([msgspec.structs.astuple(c) if c else c for c in eager.contexts(rows)]) == \
        repr([msgspec.structs.astuple(lazy[c]) if c in lazy else None for c in probe])
    assert repr(list(eager_flops.items())) == repr(list(lazy_flops.items()))
    return eager, eager_flops


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_eager_fold_is_the_lazy_one_on_real_traces(path):
    profile = load_profile(path)
    eager, _ = _assert_same(profile)
    if profile.runtime and profile.cpu_ops:
        assert eager  # the comparison covered some launches


def _random_profile(rng: random.Random, nan: bool) -> Profile:
    """Nested and overlapping ops, optimizer and user ranges, launches on two threads; whole
    microseconds so that starts and ends tie; ops with and without FLOPs, types, stacks."""
    names = ["aten::linear", "aten::mm", "aten::addmm", "autograd::engine::evaluate_function: "
             "MmBackward0", "aten::relu", "Optimizer.step#AdamW.step", "aten::add_",
             "MmBackward0", "aten::copy_"]
    stacks = [None, [], ["site-packages/torch/nn.py(1): f", "train.py(9): step"],
              ["<built-in method>"]]
    ops, calls = [], []
    for _ in range(rng.randrange(1, 120)):
        start = float(rng.randrange(0, 200))
        dur = float(rng.choice([0, 1, 2, 5, 20, 80, rng.randrange(0, 200)]))
        if nan and rng.random() < 0.05:
            dur = float("nan")
        shapes = rng.choice([None, [[4, 8], [8, 16]], [[2, 4, 8], [16, 8]], [[3], [4]]])
        ops.append(CpuOp(rng.choice(names), start, dur, tid=rng.choice([1, 2]),
                         input_shapes=shapes,
                         input_types=rng.choice([None, [], ["float", "float"]]),
                         flops=rng.choice([None, None, 0.0, 1e6]),
                         stack=rng.choice(stacks)))
    for i in range(rng.randrange(1, 80)):
        start = float(rng.randrange(0, 220))
        if nan and rng.random() < 0.05:
            start = float("nan")
        calls.append(RuntimeCall("cudaLaunchKernel", start, 1.0, tid=rng.choice([1, 2, 3]),
                                 correlation=rng.choice([i, i, i, None, rng.randrange(5)])))
    anns = [Annotation(rng.choice(["Optimizer.step#SGD.step", "fwd", "ProfilerStep#1"]),
                       float(rng.randrange(0, 200)), float(rng.randrange(0, 100)),
                       kind=rng.choice([OPTIMIZER, "user"]), on_gpu=rng.random() < 0.2)
            for _ in range(rng.randrange(0, 6))]
    return Profile("random", "kineto", cpu_ops=ops, runtime=calls, annotations=anns)


@pytest.mark.parametrize("nan", [False, True])
def test_eager_fold_is_the_lazy_one_on_random_nestings(nan):
    rng = random.Random(15 + nan)
    launched = flopped = 0
    for _ in range(300):
        eager, flops = _assert_same(_random_profile(rng, nan))
        launched += len(eager)
        flopped += len(flops)
    assert launched > 1000 and flopped > 100  # the cases reached launches under FLOP ops


@pytest.mark.parametrize("seed", range(20))
def test_the_sweep_in_small_chunks_links_as_in_one(seed, monkeypatch):
    """The sweep turns its columns into Python values a chunk at a time (memory on big
    traces); the stack carried across chunk boundaries must link every launch the same."""
    profile = _random_profile(random.Random(seed), nan=False)
    with column_scope():
        whole, whole_flops = linking.link_launches(profile, is_tc_eligible_op)
    monkeypatch.setattr(linking, "SWEEP_CHUNK", 3)
    with column_scope():
        chunked, chunked_flops = linking.link_launches(profile, is_tc_eligible_op)
    assert repr([(c, msgspec.structs.astuple(x)) for c, x in chunked.items()]) == \
        repr([(c, msgspec.structs.astuple(x)) for c, x in whole.items()])
    assert chunked_flops == whole_flops
    assert whole or not profile.cpu_ops
