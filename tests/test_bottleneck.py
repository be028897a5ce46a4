"""The critical-path account of an iteration on synthetic timelines whose answer is known."""

from __future__ import annotations

import pytest

from tb_gpuprof.analysis.bottleneck import (
    CLASSES,
    GLUE_MAX_US,
    bottleneck_section,
    gpu_intervals,
    host_timeline,
    iteration_shares,
)
from tb_gpuprof.analysis.linking import link_launches
from tb_gpuprof.model import (
    DATALOADER,
    MEMCPY,
    OPTIMIZER,
    Annotation,
    CpuOp,
    GpuActivity,
    Profile,
    RuntimeCall,
)


class Timeline:
    """Builds a Profile: ops on the host thread, launches inside them, kernels on the GPU."""

    def __init__(self) -> None:
        self.p = Profile(source="synthetic", format="kineto")
        self.corr = 0

    def op(self, name: str, start: float, dur: float, tid: int = 1) -> Timeline:
        self.p.cpu_ops.append(CpuOp(name, start, dur, tid=tid))
        return self

    def launch(self, at: float, k_start: float, k_dur: float, *, name: str = "gemm_kernel",
               kind: str = "kernel", tid: int = 1, call: str = "cudaLaunchKernel") -> Timeline:
        self.corr += 1
        self.p.runtime.append(RuntimeCall(call, at, 5.0, tid=tid, correlation=self.corr))
        self.p.gpu.append(GpuActivity(kind, name, k_start, k_dur, correlation=self.corr))
        return self

    def runtime(self, name: str, start: float, dur: float, tid: int = 1) -> Timeline:
        self.p.runtime.append(RuntimeCall(name, start, dur, tid=tid))
        return self

    def annotate(self, name: str, start: float, dur: float, kind: str) -> Timeline:
        self.p.annotations.append(Annotation(name, start, dur, kind=kind))
        return self

    def shares(self, start: float, end: float) -> dict[str, float]:
        gpu = gpu_intervals(self.p, lambda n: n.startswith("nccl"))
        out = iteration_shares(start, end, gpu, host_timeline(self.p))
        assert sum(out.values()) == pytest.approx(end - start)
        return out


def test_gpu_bound_when_kernels_run_back_to_back():
    t = Timeline()
    for i in range(10):  # the host launches everything up front; the GPU runs 1 ms of work
        t.op("aten::mm", i * 2.0, 2.0).launch(i * 2.0, 20 + 100 * i, 100)
    s = t.shares(0, 1020)
    assert s["gpu"] == pytest.approx(1000)
    assert s["dispatch"] == pytest.approx(20)


def test_dispatch_bound_when_each_kernel_waits_for_its_op():
    t = Timeline()
    for i in range(10):  # 100 us of op per 10 us kernel
        t.op("aten::add", 100 * i, 100).launch(100 * i + 90, 100 * i + 100, 10)
    s = t.shares(0, 1010)
    assert s["gpu"] == pytest.approx(100)
    assert s["dispatch"] == pytest.approx(910)
    assert s["host"] == 0


def test_host_bound_outside_ops_and_short_glue_is_dispatch():
    t = Timeline()
    glue = GLUE_MAX_US / 2
    t.op("aten::mm", 2000, 50).launch(2040, 2050, 1000)  # 2 ms of numpy before the first op
    t.op("aten::mm", 3050 + glue, 50).launch(3090 + glue, 3100 + glue, 1000)
    s = t.shares(0, 4100 + glue)
    assert s["host"] == pytest.approx(2000)
    assert s["dispatch"] == pytest.approx(50 + glue + 50)
    assert s["gpu"] == pytest.approx(2000)


def test_data_wait_wins_over_ops_inside_the_loader():
    t = Timeline()
    t.annotate("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, 3000,
               DATALOADER)
    t.op("aten::stack", 2500, 400)  # collate inside the fetch: still the loader's time
    t.op("aten::mm", 3000, 50).launch(3040, 3050, 950)
    s = t.shares(0, 4000)
    assert s["data_wait"] == pytest.approx(3000)
    assert s["gpu"] == pytest.approx(950)


def test_gap_that_opens_while_the_host_is_blocked_is_the_syncs():
    t = Timeline()
    t.op("aten::mm", 0, 20).launch(10, 20, 980)  # GPU busy until 1000
    t.op("aten::item", 100, 905).runtime("cudaStreamSynchronize", 110, 892)  # until 1002
    t.op("aten::add", 1002, 298).launch(1290, 1300, 100)  # refill after the sync
    s = t.shares(0, 1400)
    assert s["sync"] == pytest.approx(300)
    assert s["dispatch"] == pytest.approx(20)
    # the same gap without a sync before it is dispatch
    u = Timeline()
    u.op("aten::mm", 0, 20).launch(10, 20, 980)
    u.op("aten::add", 1002, 298).launch(1290, 1300, 100)
    assert u.shares(0, 1400)["sync"] == 0


def test_pageable_device_to_host_copy_is_a_sync():
    t = Timeline()
    t.op("aten::mm", 0, 20).launch(10, 20, 980)
    t.op("aten::item", 100, 905).launch(
        100, 1000, 2, name="Memcpy DtoH (Device -> Pageable)", kind=MEMCPY,
        call="cudaMemcpyAsync")
    t.p.runtime[-1].dur_us = 905  # the host call returns when the copy is done
    t.op("aten::add", 1005, 295).launch(1290, 1300, 100)
    s = t.shares(0, 1400)
    assert s["sync"] == pytest.approx(298)


def test_copies_and_collectives_count_only_where_no_compute_runs():
    t = Timeline()
    t.op("aten::copy_", 0, 10).launch(0, 10, 500, name="Memcpy HtoD (Pageable -> Device)",
                                        kind=MEMCPY)
    t.op("aten::mm", 10, 10).launch(15, 300, 400)  # overlaps the copy's second half
    t.op("c10d::allreduce_", 20, 10).launch(25, 700, 300, name="ncclDevKernel_AllReduce")
    s = t.shares(0, 1000)
    assert s["gpu"] == pytest.approx(400)
    assert s["copy"] == pytest.approx(290)
    assert s["communication"] == pytest.approx(300)


def test_dispatch_on_the_autograd_thread_counts_but_a_pin_memory_thread_does_not():
    t = Timeline()
    t.op("aten::mm", 0, 10).launch(5, 10, 90)
    t.op("autograd::engine::evaluate_function: MmBackward0", 100, 100, tid=2)
    t.launch(1190, 1200, 100, tid=2)
    for i in range(50):  # the main thread launches most work, the autograd thread 2%
        t.launch(2000 + i, 2000 + i, 0.5)
    t.op("aten::pin_memory", 200, 990, tid=3)  # a thread that launches nothing
    s = t.shares(0, 1300)
    assert s["dispatch"] == pytest.approx(10 + 100 + 10)
    assert s["host"] == pytest.approx(990)


def test_section_corrects_host_time_to_the_unprofiled_period():
    per_iter = [{**dict.fromkeys(CLASSES, 0.0), "gpu": 10_000.0, "dispatch": 30_000.0}] * 3
    sec = bottleneck_section(per_iter, [0, 1, 2], [40_000.0] * 3, unprofiled_ms=30.0,
                             framework="pytorch")
    assert sec["mean_pct"]["dispatch"] == 75.0
    assert sec["corrected_ms"]["gpu"] == pytest.approx(10.0)  # GPU time is kept
    assert sec["corrected_ms"]["dispatch"] == pytest.approx(20.0)  # host time shrinks
    assert sec["bound"] == "dispatch" and sec["corrected_pct"]["dispatch"] == pytest.approx(66.67)
    assert "un-profiled 30.0 ms" in sec["verdict"]
    gpu_bound = bottleneck_section(per_iter, [0, 1, 2], [40_000.0] * 3, unprofiled_ms=12.0,
                                   framework="pytorch")
    assert gpu_bound["bound"] == "gpu"  # without the profiler the host keeps up
    plain = bottleneck_section(per_iter, [0, 1, 2], [40_000.0] * 3, unprofiled_ms=None,
                               framework="pytorch")
    assert plain["corrected_ms"] is None and plain["basis"] == "profiled"
    assert plain["bound"] == "dispatch"
    three = [{**dict.fromkeys(CLASSES, 0.0), "gpu": 10.0, "dispatch": 15.0, "host": 15.0}]
    mixed = bottleneck_section(three, [0], [40.0], unprofiled_ms=None, framework="pytorch")
    assert mixed["bound"] == "mixed"
    assert "op dispatch 38%" in mixed["verdict"] and "host work outside ops 38%" in mixed["verdict"]


def test_closure_optimizer_forward_and_backward_are_not_optimizer_time():
    t = Timeline()
    t.annotate("Optimizer.step#SGD.step", 0, 1000, OPTIMIZER)
    t.op("aten::linear", 10, 100).launch(50, 60, 10)  # the closure's forward
    t.op("autograd::engine::evaluate_function: AddmmBackward0", 200, 100, tid=2)
    t.launch(250, 260, 10, tid=2)
    t.op("aten::_foreach_add_", 500, 100).launch(550, 560, 10)  # the update itself
    launches, _ = link_launches(t.p, lambda name: False)
    phases = [launches[c].phase for c in (1, 2, 3)]
    assert phases == ["forward", "backward", "optimizer"]


def test_the_linking_sweep_order_is_the_four_key_lexsort():
    """The sweep orders events by start, then longest first, kind, index: a stable sort by
    start with only the events sharing a start re-sorted must be exactly that lexsort (ties,
    zero durations, NaN starts)."""
    import numpy as np

    from tb_gpuprof.analysis.linking import _sweep_order

    rng = np.random.default_rng(4)
    for trial in range(300):
        n = int(rng.integers(1, 400))
        starts = np.round(rng.random(n) * rng.choice([5, 50, 1000]), int(rng.integers(0, 3)))
        durs = np.round(rng.random(n) * 10, 1) * (rng.random(n) > 0.3)
        kinds = rng.integers(0, 3, n)
        index = rng.permutation(n)
        if trial % 10 == 0:
            starts[0] = np.nan
        want = np.lexsort((index, kinds, -durs, starts))
        assert (_sweep_order(starts, durs, kinds, index) == want).all()
