"""Linking's host annotations read from the report's shared columns
(:func:`linking._host_annotations`) against the per-annotation loop they replaced (the
``host_ann`` list, ``opens_optimizer`` per annotation): the same start and duration columns,
the same optimizer flags, the same sweeps, on every real trace in tests/data and on a
synthetic mix of host and GPU annotations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tb_gpuprof.analysis import linking
from tb_gpuprof.analysis.classify import is_tc_eligible_op
from tb_gpuprof.analysis.columns import column_scope
from tb_gpuprof.model import OPTIMIZER, USER, Annotation, CpuOp, Profile, RuntimeCall
from tb_gpuprof.readers import load_profile

ROOT = Path(__file__).resolve().parent
TRACES = sorted([*ROOT.glob("data/**/*.json.gz"), *ROOT.glob("data/**/*.pb")])


def _loop(profile: Profile) -> tuple[np.ndarray, np.ndarray, list[bool]]:
    host_ann = [a for a in profile.annotations if not a.on_gpu]
    return (np.array([a.start_us for a in host_ann], np.float64),
            np.array([a.dur_us for a in host_ann], np.float64),
            [linking._StackFold.opens_optimizer(a) for a in host_ann])


def _same(profile: Profile) -> None:
    with column_scope():
        start, dur, opens = linking._host_annotations(profile)
        fold = linking._StackFold(profile, is_tc_eligible_op)
        new = list(linking._sweeps(profile, None, (start, dur)))
    old_start, old_dur, old_opens = _loop(profile)
    assert opens == old_opens
    assert all(type(o) is bool for o in opens)
    np.testing.assert_array_equal(start, old_start)
    np.testing.assert_array_equal(dur, old_dur)
    with column_scope():
        old = list(linking._sweeps(profile, fold.host_ann))
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_host_annotation_columns_are_the_loop(path: Path) -> None:
    _same(load_profile(path))


def test_host_annotation_columns_synthetic() -> None:
    anns = [
        Annotation("Optimizer.step#SGD.step", 0.0, 10.0, USER),  # by name
        Annotation("step", 1.0, 2.0, OPTIMIZER),  # by kind
        Annotation("Optimizer.step#SGD.step", 1.5, 1.0, OPTIMIZER, on_gpu=True),  # GPU: out
        Annotation("ProfilerStep#3", 0.0, 30.0, USER),
        Annotation("data", 12.5, 0.25, USER, on_gpu=True),
        Annotation("Optimizer.zero_grad#SGD.zero_grad", 20.0, 1.0, USER),
    ]
    profile = Profile("synthetic", "kineto", annotations=anns,
                      runtime=[RuntimeCall("cudaLaunchKernel", 2.0, 1.0, 1, 7, None),
                               RuntimeCall("cudaLaunchKernel", 21.0, 1.0, 1, 8, None)])
    with column_scope():
        start, dur, opens = linking._host_annotations(profile)
    assert opens == [True, True, False, True]
    assert start.tolist() == [0.0, 1.0, 0.0, 20.0]
    assert dur.tolist() == [10.0, 2.0, 30.0, 1.0]
    _same(profile)
    with column_scope():
        launches, _ = linking.link_launches(profile, is_tc_eligible_op)
    assert [launches[c].phase for c in (7, 8)] == [linking.OPTIMIZER_PHASE, None]


def _link_pair(profile: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    """link_launches with inert annotations left out against it with every one swept."""
    with column_scope():
        new, new_flops = linking.link_launches(profile, is_tc_eligible_op)
    sweeps = linking._sweeps

    def every_annotation(*args, **kwargs):
        kwargs["inert_annotations"] = False
        return sweeps(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(linking, "_sweeps", every_annotation)
        with column_scope():
            old, old_flops = linking.link_launches(profile, is_tc_eligible_op)
    assert list(new_flops.items()) == list(old_flops.items())
    assert new.keys() == old.keys()
    for attr in ("launch_us", "phase", "flop_op", "launch_op"):
        np.testing.assert_array_equal(getattr(new, attr), getattr(old, attr))
    # the kinds' codes follow the folds' addresses: compared by what they code
    assert ([new.kinds[k] for k in new.kind.tolist()] ==
            [old.kinds[k] for k in old.kind.tolist()])
    assert list(map(repr, new.values())) == list(map(repr, old.values()))  # NaN != NaN


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_inert_annotations_left_out_link_the_same(path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _link_pair(load_profile(path), monkeypatch)


@pytest.mark.parametrize("opener", [None, "Optimizer.step#Adam.step"])
def test_inert_annotations_synthetic(opener: str | None,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread without ops (XPlane-like) under annotations, with and without an optimizer
    step among them: with one, the annotations stay and its launches are the optimizer's."""
    anns = [Annotation("jit_train_step", 0.0, 50.0, USER),
            Annotation(opener or "TraceMe", 5.0, 10.0, USER),
            Annotation("overlap", 12.0, 20.0, USER),
            Annotation("gpu range", 6.0, 1.0, USER, on_gpu=True)]
    runtime = [RuntimeCall("cuLaunchKernel", t, 0.5, 3, c, None)
               for c, t in enumerate([1.0, 6.0, 6.0, 13.0, 16.0, float("nan"), 40.0])]
    profile = Profile("synthetic", "xplane", annotations=anns, runtime=runtime)
    _link_pair(profile, monkeypatch)
    with column_scope():
        launches, _ = linking.link_launches(profile, is_tc_eligible_op)
    phases = [launches[c].phase for c in range(7)]
    step = linking.OPTIMIZER_PHASE if opener else None
    assert phases == [None, step, step, step, step, None, None]  # "overlap" inherits the step


def test_inert_annotations_stay_on_threads_with_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """An annotation that overlaps an op without nesting keeps the op on the stack past its
    end: on a thread with ops the annotations stay, inert or not."""
    profile = Profile("synthetic", "kineto",
                      cpu_ops=[CpuOp("aten::mm", 0.0, 10.0, 3)],
                      annotations=[Annotation("range", 5.0, 25.0, USER)],
                      runtime=[RuntimeCall("cudaLaunchKernel", 12.0, 1.0, 3, 1, None),
                               RuntimeCall("cudaLaunchKernel", 2.0, 1.0, 4, 2, None)])
    _link_pair(profile, monkeypatch)
    with column_scope():
        launches, _ = linking.link_launches(profile, is_tc_eligible_op)
    assert launches[1].op == "aten::mm"  # under "range", pushed while aten::mm was open
    assert launches[2].op is None  # thread 4: no ops, the range left out
