"""What-if re-timing on synthetic timelines whose answer is known by construction."""

from __future__ import annotations

import pytest

from tb_gpuprof.analysis.intervals import Coverage
from tb_gpuprof.analysis.rules.trace import (
    fix_amp,
    fix_compile,
    fix_host_sync,
    fix_input_pipeline,
    fix_tf32,
)
from tb_gpuprof.analysis.savings import severity_for
from tb_gpuprof.analysis.whatif import (
    GPU_BOUND_HOST_SCALE,
    SPEEDUPS,
    Fix,
    SimKernel,
    build_replay,
    calibrate,
    calibrate_host,
    predicted_ms,
)
from tb_gpuprof.model import GpuActivity

TF32 = SPEEDUPS["fp32_to_tf32_gemm"][0]


def gemm(launch: float, start: float, dur: float) -> SimKernel:
    return SimKernel(GpuActivity("kernel", "sgemm_128x64_nn", start, dur), launch, "gemm",
                     "fp32", False, True)


def replay(kernels, *, framework=(), outside=(), syncs=(), end=None):
    end = end if end is not None else max(k.act.start_us + k.act.dur_us for k in kernels)
    # what is not framework time below is op-less: "outside" when long (GLUE_MAX_US = 100)
    return build_replay(list(kernels), list(syncs), data=Coverage([]),
                        sync=Coverage(list(syncs)), framework=Coverage(list(framework)),
                        copy_calls=Coverage([]), start_us=0.0, end_us=end, glue_max_us=100.0)


def test_gpu_bound_window_gets_the_kernel_speedup():
    # the host queues 10 FP32 GEMMs of 1 ms in the first 100 us; they run back to back
    ks = [gemm(10.0 * i, 100.0 + 1000 * i, 1000.0) for i in range(10)]
    r = replay(ks, framework=[(0, 100)])
    assert r.run(Fix()) == pytest.approx(10_100, rel=0.01)
    pred = predicted_ms(r, fix_tf32(0), 10.1, 1.0)
    assert pred == pytest.approx((100 + 10_000 / TF32) / 1000, rel=0.05)


def test_host_bound_window_gains_nothing_from_a_gpu_fix():
    # each 10 us GEMM waits for 1 ms of framework dispatch before its launch
    ks = [gemm(1000.0 * i + 990, 1000.0 * i + 1000, 10.0) for i in range(10)]
    r = replay(ks, framework=[(0, 10_000)])
    assert predicted_ms(r, fix_tf32(0), 10.0, 1.0) > 9.9  # < 1% saving
    compiled = predicted_ms(r, fix_compile(0), 10.0, 1.0)
    assert compiled == pytest.approx(10.0 / SPEEDUPS["compile_dispatch"][0], rel=0.05)


def test_the_bottleneck_moves_to_the_host():
    # 5 iterations: 500 us of dispatch launches 1000 us of FP32 GEMM; the host runs ahead
    ks = [gemm(500.0 * (i + 1), 500.0 + 1000 * i, 1000.0) for i in range(5)]
    r = replay(ks, framework=[(0, 2500)], end=5500)
    assert r.run(Fix()) == pytest.approx(5500, rel=0.01)
    # the GPU part shrinks 6.7x, but the host still needs 500 us per iteration
    pred = predicted_ms(r, fix_tf32(0), 5.5, 1.0)
    assert pred == pytest.approx(2.5 + 1.0 / TF32, rel=0.05)
    assert pred > 2.5


def test_removing_per_iteration_syncs_lets_host_and_gpu_overlap():
    # per iteration: 500 us dispatch, launch 500 us of GPU work, block until it is done
    ks, framework, syncs = [], [], []
    t = 0.0
    for _ in range(4):
        framework.append((t, t + 500))
        ks.append(gemm(t + 490, t + 500, 500.0))
        syncs.append((t + 500, t + 1000))
        t += 1000
    r = replay(ks, framework=framework, syncs=syncs, end=t)
    assert r.run(Fix()) == pytest.approx(4000, rel=0.02)
    assert predicted_ms(r, fix_host_sync(0), 4.0, 1.0) == pytest.approx(2.5, rel=0.05)


def test_input_pipeline_moves_host_work_off_the_critical_path():
    ks = [gemm(2000.0 + 2500 * i, 2010.0 + 2500 * i, 500.0) for i in range(3)]
    framework = [(2000.0 + 2500 * i, 2010.0 + 2500 * i) for i in range(3)]
    r = replay(ks, framework=framework, end=7500)  # 2 ms of numpy before each launch
    pred = predicted_ms(r, fix_input_pipeline(0), 7.5, 1.0)
    assert pred == pytest.approx(1.5, rel=0.1)


def test_calibration_scales_host_time_to_the_unprofiled_period():
    ks = [gemm(1000.0 * i + 990, 1000.0 * i + 1000, 10.0) for i in range(10)]
    r = replay(ks, framework=[(0, 10_000)])
    scale = calibrate(r, 5_000)  # without the profiler the loop ran twice as fast
    assert r.run(Fix(), scale) == pytest.approx(5_000, rel=0.01)
    assert scale == pytest.approx(0.5, rel=0.05)
    gpu_bound = replay([gemm(10.0 * i, 100.0 + 1000 * i, 1000.0) for i in range(10)],
                       framework=[(0, 100)])
    assert calibrate(gpu_bound, 10_100) == GPU_BOUND_HOST_SCALE


def test_severity_follows_the_saving():
    assert [severity_for(p) for p in (45.0, 19.0, 9.0, 2.0)] == \
        ["high", "medium", "medium", "low"]


def test_a_full_queue_keeps_the_front_end_gap_between_kernels():
    # 40 GEMMs queued at once, each starting 3 us after the previous one ended: a GPU-bound
    # replay keeps those gaps (0.12 ms of 4.2), so a 2x faster kernel does not halve the time
    ks = [gemm(1.0 * i, 50.0 + 103.0 * i, 100.0) for i in range(40)]
    r = replay(ks, framework=[(0, 40)])
    assert r.gap_us == pytest.approx(3.0)
    assert r.run(Fix()) == pytest.approx(50 + 40 * 103 - 3, rel=0.001)
    half = r.run(Fix(kernel_factor=lambda k: 2.0))
    assert half == pytest.approx(50 + 40 * 53 - 3, rel=0.001)


def test_amp_speeds_up_fp32_tensor_core_attention_and_untyped_fp32_fusions():
    attn = SimKernel(GpuActivity("kernel", "fmha_cutlassF_f32_aligned_64x64_rf_sm80", 0, 10),
                     0.0, "attention", "fp32", True, True)
    fusion = SimKernel(GpuActivity("kernel", "loop_multiply_fusion_3", 0, 10), 0.0,
                       "elementwise", "unknown", False, False)
    assert fix_amp(0).kernel_factor(attn) == SPEEDUPS["tf32_to_half_attention"][0]
    # dtype-less kernels of a window that runs nothing in half precision are FP32 ...
    assert fix_amp(0, unknown_is_fp32=True).kernel_factor(fusion) == \
        SPEEDUPS["memory_half_elementwise"][0]
    # ... and unknown otherwise: no gain claimed
    assert fix_amp(0).kernel_factor(fusion) == 1.0


def test_a_fix_judged_per_kernel_class_replays_like_one_judged_per_kernel():
    """Fix.by_class calls the factor once per kernel class and divides in numpy: the
    replayed times are exactly those of calling it for every kernel."""
    import random

    from tb_gpuprof.analysis.rules.trace import fix_channels_last

    rng = random.Random(8)
    kernels, t = [], 0.0
    for _ in range(400):
        t += rng.uniform(0, 6)
        name = rng.choice(["sgemm_128x64_nn", "max_pool_kernel", "batch_norm_fwd", "nchwToNhwc"])
        cat = {"s": "gemm", "m": "other", "b": "norm", "n": "layout"}[name[0]]
        kernels.append(SimKernel(GpuActivity("kernel", name, t, rng.uniform(0.5, 9)),
                                 t - rng.uniform(0, 30), cat, rng.choice(["fp32", "bf16"]),
                                 rng.random() < 0.3, rng.random() < 0.7))
    r = replay(kernels, framework=[(0.0, t / 3)], syncs=[(t / 2, t / 2 + 1.0)])
    changed = 0
    for build in (fix_tf32, fix_amp, fix_channels_last, fix_compile):
        for v in (0, 1, 2):
            fix = build(v)
            assert fix.by_class
            per_kernel = Fix(kernel_factor=fix.kernel_factor, framework_rate=fix.framework_rate)
            assert r.run(fix, 0.7) == r.run(per_kernel, 0.7)
            changed += r.run(fix, 0.7) != r.run(Fix(framework_rate=fix.framework_rate), 0.7)
    assert changed >= 6  # the kernel factors matter to most of these replays


def _segments_with_lists(data, sync, framework, copy_calls, start, end, glue_max_us):
    """build_replay's segments as the interval lists made them (the reference)."""
    from tb_gpuprof.analysis.intervals import merge, subtract

    whole = [(start, end)]
    d = data.clip(start, end)
    sy = subtract(sync.clip(start, end), d)
    cc = subtract(subtract(copy_calls.clip(start, end), d), sy)
    fw = subtract(subtract(subtract(framework.clip(start, end), d), sy), cc)
    segments = [(s, e, "data") for s, e in d] + [(s, e, "sync") for s, e in sy]
    segments += [(s, e, "copy_call") for s, e in cc] + [(s, e, "framework") for s, e in fw]
    for s, e in subtract(whole, merge(d + sy + cc + fw)):
        segments.append((s, e, "framework" if e - s < glue_max_us else "outside"))
    return sorted(segments)


def test_replay_segments_in_columns_equal_the_interval_lists():
    """build_replay cuts the window in numpy; on random host timelines (small and columnar
    coverages, touching and overlapping ranges, windows cutting ranges) its segments are
    exactly the ones interval lists give."""
    import random

    rng = random.Random(21)

    def cov(n):
        return Coverage([(s := rng.randrange(0, 8000) / 4, s + rng.randrange(1, 60) / 4)
                         for _ in range(n)])

    for _ in range(40):
        covs = [cov(rng.choice([0, 5, 300])) for _ in range(4)]
        start = rng.randrange(-50, 1000) / 4
        end = start + rng.choice([0.0, rng.randrange(1, 9000) / 4])
        r = build_replay([gemm(start, start + 1.0, 2.0)], [], data=covs[0], sync=covs[1],
                         framework=covs[2], copy_calls=covs[3], start_us=start, end_us=end,
                         glue_max_us=3.0)
        got = list(zip(r.segments.start.tolist(), r.segments.end.tolist(),
                       r.segments.kinds(), strict=True))
        assert got == _segments_with_lists(*covs, start, end, 3.0)


def test_launch_latency_and_queue_gap_in_columns_equal_the_loops():
    """The replay's launch latency and queue gap are computed in numpy; on random kernels
    (streams, devices, shared launches as in CUDA graphs, ties, memcpys, no launch) they are
    exactly what the one-kernel-at-a-time loops give."""
    import random

    from tb_gpuprof.analysis import whatif

    rng = random.Random(3)
    seen = set()
    for _ in range(60):
        kernels, t = [], 0.0
        for _ in range(rng.choice([1, 20, 300, 300])):
            t += rng.choice([0.0, 0.5, rng.uniform(0, 20)])
            launch = rng.choice([None, t - rng.uniform(0, 80), t - 3.0, t + 1.0])
            if kernels and rng.random() < 0.2:
                launch = kernels[-1].launch_us  # a graph: kernels share one launch
            act = GpuActivity(rng.choice(["kernel", "kernel", "memcpy"]), "k", t,
                              rng.choice([0.0, rng.uniform(0, 5)]),
                              device=rng.randrange(2), stream=rng.choice([7, 13, 22]))
            kernels.append(SimKernel(act, launch, "gemm", "fp32", False, True))
        rng.shuffle(kernels)
        assert whatif._launch_latency(kernels) == whatif._launch_latency_loop(kernels)
        assert whatif._queue_gap(kernels) == whatif._queue_gap_loop(kernels)
        seen.add((whatif._launch_latency(kernels), whatif._queue_gap(kernels)))
        # a value numpy orders differently than sorted() (NaN) takes the loops
        kernels[0].act.start_us = float("nan")
        assert whatif._KernelColumns.of(kernels) is None
    assert len({lat for lat, _ in seen}) > 10 and len({gap for _, gap in seen}) > 10


def _back_pressured_loop(n: int = 40, gemm_us: float = 1000.0, launch_us: float = 5.0):
    """A GPU-bound loop whose host filled the launch queue (4 launches deep): from the 5th
    launch on, each launch call waits until the GPU finishes the kernel 4 places before it,
    so the host's framework time spans the whole GPU time."""
    from tb_gpuprof.model import Profile, RuntimeCall

    calls, kernels, t = [], [], 0.0
    for i in range(n):
        start = t
        free_at = 100.0 + gemm_us * (i - 3) if i >= 4 else start  # queue slot frees
        end = max(start + launch_us, free_at)
        calls.append(RuntimeCall("cudaLaunchKernel", start, end - start, correlation=i))
        kernels.append(gemm(start, 100.0 + gemm_us * i, gemm_us))
        t = end + 1.0
    prof = Profile(source="synthetic", format="kineto", runtime=calls)
    return prof, kernels, t


def test_launches_waiting_on_a_full_queue_are_not_host_work():
    from tb_gpuprof.analysis.stages import blocked_launches

    prof, ks, host_end = _back_pressured_loop()
    end = 100.0 + 1000.0 * len(ks)
    starts, ends = blocked_launches(prof, 0.0, end)
    assert len(starts) == len(ks) - 4  # every launch after the queue filled waited
    assert (starts - [c.start_us for c in prof.runtime[4:]] == 5.0).all()  # past the median
    framework = [(0.0, host_end)]
    as_work = build_replay(ks, [], data=Coverage([]), sync=Coverage([]),
                           framework=Coverage(framework), copy_calls=Coverage([]),
                           start_us=0.0, end_us=end, glue_max_us=100.0)
    as_wait = build_replay(ks, [], data=Coverage([]),
                           sync=Coverage(list(zip(starts.tolist(), ends.tolist(), strict=True))),
                           framework=Coverage(framework), copy_calls=Coverage([]),
                           start_us=0.0, end_us=end, glue_max_us=100.0)
    measured = end / 1000
    # counted as host work, the wait caps TF32 at the old GPU time; as a wait, the GEMMs'
    # speed-up comes through (the host's own work is 40 launches of 5 us)
    assert predicted_ms(as_work, fix_tf32(0), measured, 1.0) > 0.9 * measured
    assert predicted_ms(as_wait, fix_tf32(0), measured, 1.0) == pytest.approx(
        (100 + 1000.0 * len(ks) / TF32) / 1000, rel=0.05)


def test_a_window_without_long_launches_has_no_blocked_spans():
    from tb_gpuprof.analysis.stages import blocked_launches
    from tb_gpuprof.model import Profile, RuntimeCall

    calls = [RuntimeCall("cudaLaunchKernel", 10.0 * i, 6.0) for i in range(50)]
    calls.append(RuntimeCall("cudaDeviceSynchronize", 600.0, 5000.0))  # a sync, not a launch
    starts, _ = blocked_launches(Profile(source="s", format="kineto", runtime=calls), 0.0, 1e4)
    assert len(starts) == 0


def _gpu_bound_step(host_us: float, *, sync_at_end: bool = False):
    """One GPU-bound iteration: the host dispatches 10 FP32 GEMMs of 1 ms evenly over
    ``host_us`` of profiled framework time; with ``sync_at_end`` it then waits for them."""
    ks = [gemm(host_us * i / 10 + 5, 100.0 + 1000 * i, 1000.0) for i in range(10)]
    syncs = [(host_us, 10_100.0)] if sync_at_end else []
    return replay(ks, framework=[(0, host_us)], syncs=syncs, end=10_100.0)


def test_a_measured_host_time_sets_the_scale_a_gpu_bound_window_cannot():
    # profiled, the host took 8 ms to dispatch the step; the hook's probe (the same step on an
    # idle GPU, no profiler) took 6 ms: the host runs at 0.75 of its profiled time
    r = _gpu_bound_step(8_000.0)
    assert calibrate(r, 10_100) == GPU_BOUND_HOST_SCALE  # the window's time cannot tell
    scale = calibrate_host([r], 6_000.0)
    assert scale == pytest.approx(0.75, rel=0.01)
    assert r.host_time(Fix(), scale) == pytest.approx(6_000.0, rel=0.01)
    # after TF32 the GEMMs take 1.5 ms: the host's 6 ms sets the step, not the constant's 3.6
    assert predicted_ms(r, fix_tf32(0), 10.1, scale) == pytest.approx(6.0, rel=0.03)
    assert predicted_ms(r, fix_tf32(0), 10.1, GPU_BOUND_HOST_SCALE) == pytest.approx(
        3.6, rel=0.05)


def test_a_probe_that_waited_on_the_gpu_gives_no_scale():
    # the step ends in a sync: on an idle GPU the host still waits for all 10 ms of GEMMs, so
    # its time hardly moves with its speed; and a probe beyond any scale's reach
    waits = _gpu_bound_step(8_000.0, sync_at_end=True)
    assert calibrate_host([waits], waits.host_time(Fix(), 0.75)) is None
    assert calibrate_host([_gpu_bound_step(8_000.0)], 50_000.0) is None
    assert calibrate_host([], 6_000.0) is None


def test_the_probe_scale_is_the_median_over_iterations():
    its = [_gpu_bound_step(h) for h in (6_000.0, 8_000.0, 12_000.0)]  # profiled host times
    assert calibrate_host(its, 6_000.0) == pytest.approx(0.75, rel=0.01)  # the middle one


def test_the_hooks_probe_sets_the_host_scale_of_a_real_gpu_bound_window():
    # the H200 ViT-B/16 FP32 rung (GPU-bound, 165.7 ms un-profiled): the faster the host's
    # measured dispatch of a step, the smaller the scale the report says it used; a probe
    # longer than any scale reaches (the host waited) leaves the report as it was
    import copy
    import re

    from tb_gpuprof.analysis.report import build_report
    from tb_gpuprof.readers import load_profile
    from tests.real_traces import DATA, context

    path = DATA / "h200_ladders" / "vit_fp32.json.gz"
    profile = load_profile(str(path), python_calls=False)
    env = context(path)
    assert env is not None

    def tf32(probe_ms: float | None) -> dict:
        e = copy.deepcopy(env)
        if probe_ms is not None:
            e["unprofiled"]["host_probe"] = {"host_ms": probe_ms, "steps": 3}
        rec = next(r for r in build_report(profile, env=e)["recommendations"]
                   if r["id"] == "tf32")
        return rec

    plain = tf32(None)
    assert "dispatch of a step" not in plain["estimate_basis"]
    scales = []
    for probe in (10.0, 30.0, 60.0):
        basis = tf32(probe)["estimate_basis"]
        m = re.search(r"the host at ([0-9.]+) of its profiled time, from the hook's "
                      rf"un-profiled {probe:.1f} ms dispatch", basis)
        assert m, basis
        scales.append(float(m.group(1)))
    assert scales == sorted(scales) and scales[0] < scales[-1]
    assert scales[1] == pytest.approx(3 * scales[0], rel=0.05)  # host work scales linearly
    assert tf32(400.0) == plain  # beyond reach: no scale from the probe


def test_a_host_bound_window_keeps_its_own_calibration_whatever_the_probe():
    # the launch-bound eager GPT-2 (h200_loops): its un-profiled time already says how fast the
    # host is, so a probe (here half the iteration) changes nothing
    import copy

    from tb_gpuprof.analysis.report import build_report
    from tb_gpuprof.readers import load_profile
    from tests.real_traces import DATA, context

    path = DATA / "h200_loops" / "gpt2_eager.json.gz"
    profile = load_profile(str(path), python_calls=False)
    env = context(path)
    assert env is not None and env.get("unprofiled")
    plain = build_report(profile, env=env)["recommendations"]
    probed = copy.deepcopy(env)
    probed["unprofiled"]["host_probe"] = {"host_ms": env["unprofiled"]["median_ms"] / 2,
                                          "steps": 3}
    assert build_report(profile, env=probed)["recommendations"] == plain
    assert plain and all("dispatch of a step" not in (r.get("estimate_basis") or "")
                         for r in plain)


def _paced_step():
    """20 launches over 2 ms of profiled host time, kernels of 150 us: un-profiled at half
    that time the host outruns the GPU, so a launch queue of 4 fills and paces it."""
    ks = [gemm(100.0 * i + 5, 0.0, 150.0) for i in range(20)]
    return replay(ks, framework=[(0, 2_000)], end=3_100.0)


def test_a_probe_paced_by_a_full_launch_queue_gives_no_scale_not_a_wrong_one():
    r = _paced_step()
    paced = r.host_time(Fix(), 0.5, queue_depth=4)  # what the probe would measure
    assert paced > 2_100.0  # the last launch waited for the 16th kernel to start
    assert r.host_time(Fix(), 0.5) == pytest.approx(1_002.5, rel=0.01)  # a queue never full
    assert calibrate_host([r], paced) == pytest.approx(paced / 2_000, rel=0.02)  # wrong: > 1
    assert calibrate_host([r], paced, queue_depth=4) is None  # the host's speed is not in it
    # a queue deeper than the step's launches never fills: the same scale as without one
    free = r.host_time(Fix(), 0.5)
    assert calibrate_host([r], free, queue_depth=64) == pytest.approx(0.5, rel=0.01)


def test_the_launch_queue_depth_of_real_gpu_bound_windows():
    # H200 traces: where the host ran ahead until launches waited for a slot, about a
    # thousand launched kernels were pending (the queue holds bytes, so it varies by model);
    # a launch-bound loop never fills it
    from tb_gpuprof.analysis.stages import blocked_launches, launch_queue_depth
    from tb_gpuprof.readers import load_profile
    from tests.real_traces import DATA

    for name in ("vit_fp32", "resnet50_fp32"):
        prof = load_profile(str(DATA / "h200_ladders" / f"{name}.json.gz"), python_calls=False)
        assert len(blocked_launches(prof, -1e300, 1e300)[0]) > 100
        depth = launch_queue_depth(prof, -1e300, 1e300)
        assert depth is not None and 500 < depth < 1500, (name, depth)
    eager = load_profile(str(DATA / "h200_loops" / "gpt2_eager.json.gz"), python_calls=False)
    assert launch_queue_depth(eager, -1e300, 1e300) is None


def test_the_held_out_vit_amp_step_comes_true_within_15_percent():
    # the replay over the host's own iteration spans: where the GPU alone would take 22 ms
    # after AMP, the host's dispatch bounds the step (predicted 22.4 ms, -16.8%, when the
    # replay took the host timeline from where the GPU ran the window)
    import json

    from tb_gpuprof.analysis.report import build_report
    from tb_gpuprof.readers import load_profile
    from tests.real_traces import DATA, context

    ladder = DATA / "h200_ladders"
    path = ladder / "vit_tf32.json.gz"
    rec = next(r for r in build_report(load_profile(str(path), python_calls=False),
                                       env=context(path))["recommendations"]
               if r["id"] == "amp")
    measured = json.loads((ladder / "vit_bf16.env.json").read_text())["unprofiled"]["median_ms"]
    assert abs(rec["predicted_iteration_ms"] / measured - 1) <= 0.15, (rec, measured)


def test_a_slower_measured_host_leaves_a_gpu_fix_less_to_save():
    import copy

    from tb_gpuprof.analysis.report import build_report
    from tb_gpuprof.readers import load_profile
    from tests.real_traces import DATA, context

    path = DATA / "h200_ladders" / "vit_fp32.json.gz"
    profile = load_profile(str(path), python_calls=False)

    def tf32_pct(probe_ms: float) -> float:
        env = copy.deepcopy(context(path))
        env["unprofiled"]["host_probe"] = {"host_ms": probe_ms, "steps": 3}
        return next(r["estimated_saving_pct"] for r in build_report(profile, env=env)[
            "recommendations"] if r["id"] == "tf32")

    fast, slow = tf32_pct(20.0), tf32_pct(100.0)  # the GPU takes 166 ms, 50 ms after TF32
    assert slow < fast - 10.0, (fast, slow)
