"""What-if re-timing: the iteration replayed with a fix applied to the work it changes.

A small discrete-event replay of the window (the approach of Daydream, USENIX ATC 2020, on the
dependencies a trace records): every GPU activity starts when its stream is free and its launch
has happened; the host's timeline is a piecewise-linear clock over the segments the bottleneck
model distinguishes (framework ops and their glue, op-less host work, data-loader waits), and a
host synchronization waits until the GPU has finished what was launched before it. A fix scales
kernel durations (TF32, AMP, channels_last, fusion), host segments (compile's cheaper dispatch,
an input pipeline moved to workers) or drops the waits (no per-step sync). A GPU speedup on a
host-bound iteration therefore predicts little, and a host fix on a GPU-bound one too.

The replay is calibrated before it predicts: host framework time is scaled until the replay
without any fix takes the un-profiled iteration time (the profiler inflates host time, not GPU
time). The prediction is the ratio replay(fix) / replay(no fix) applied to the measured time.
The speed-up factors live in one table, :data:`SPEEDUPS` (docs/recommendations.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..model import GpuActivity
from .intervals import Coverage, Intervals, merge, subtract

# Per-kernel-class speed-ups on an H200, as (typical, low, high): the kernel runs `typical`
# times faster after the fix; low/high bound the estimate's range. Measured by
# benchmarks/measure_speedups.py (docs/recommendations.md has the run and its shapes).
SPEEDUPS: dict[str, tuple[float, float, float]] = {
    "fp32_to_tf32_gemm": (3.5, 2.5, 4.5),  # FP32 SIMT GEMM -> TF32 Tensor Cores
    "fp32_to_tf32_conv": (2.4, 1.8, 3.0),
    "tf32_to_half_gemm": (1.9, 1.5, 2.3),  # TF32 -> BF16/FP16 Tensor Cores
    "tf32_to_half_conv": (1.5, 1.2, 1.9),
    "tf32_to_half_attention": (1.8, 1.4, 2.2),
    "memory_half": (1.8, 1.5, 2.0),  # memory-bound kernels move half the bytes
    "nchw_to_nhwc_norm": (1.8, 1.3, 2.4),  # batch norm / pooling / elementwise in a conv net
    "nchw_to_nhwc_half_conv": (1.6, 1.2, 2.0),  # FP16 convolutions without transposes
    "fusion_small_kernels": (2.0, 1.5, 3.0),  # elementwise/reduction/norm chains fused
    "compile_dispatch": (4.0, 2.5, 8.0),  # host dispatch per iteration, eager -> compiled
    "amp_dispatch": (0.85, 0.75, 0.95),  # autocast adds cast ops: host dispatch gets slower
}
PINNED_H2D_BYTES_PER_US = 50e3  # 50 GB/s: pinned host-to-device copies on the H200 (56 measured)
MIN_LAUNCH_LATENCY_US = 2.0


@dataclass(slots=True)
class SimKernel:
    """One GPU activity of the window with what the fixes need to know about it."""

    act: GpuActivity
    launch_us: float | None  # host time of its launch call, None when the trace has none
    category: str
    precision: str
    uses_tc: bool
    eligible: bool


@dataclass(slots=True)
class Fix:
    """What a recommendation changes: kernel durations, host segment rates, syncs."""

    kernel_factor: Callable[[SimKernel], float] = lambda k: 1.0
    framework_rate: float = 1.0  # host time inside framework ops and their glue
    outside_rate: float = 1.0  # host work outside ops (numpy, tokenisation)
    data_rate: float = 1.0  # data-loader waits
    copy_call_rate: float = 1.0  # host calls of pageable host-to-device copies
    syncs_wait: bool = True


@dataclass(slots=True)
class Replay:
    """The window's timeline, ready to be replayed under any fix."""

    kernels: list[SimKernel]
    syncs: list[tuple[float, float]]
    segments: list[tuple[float, float, str]]  # (start, end, kind) covering [start, end)
    start_us: float
    end_us: float
    latency_us: float
    seg_starts: list[float] = field(default_factory=list)

    def run(self, fix: Fix, host_scale: float = 1.0) -> float:
        """Replayed window time (us) under ``fix``; host framework time times ``host_scale``."""
        rates = {"framework": fix.framework_rate * host_scale,
                 "outside": fix.outside_rate * host_scale, "data": fix.data_rate,
                 "copy_call": fix.copy_call_rate * host_scale, "sync": 0.0}
        clock = _HostClock(self, rates)
        events: list[tuple[float, int, int]] = [(t0, 0, i) for i, (t0, _) in enumerate(self.syncs)]
        events += [((k.launch_us if k.launch_us is not None else k.act.start_us - self.latency_us),
                    1, i) for i, k in enumerate(self.kernels)]
        events.sort()
        waited = 0.0
        stream_free: dict[tuple[int, int], float] = {}
        gpu_done = float("-inf")
        for t, kind, i in events:
            now = clock.at(t) + waited
            if kind == 0:
                if fix.syncs_wait and gpu_done > now:
                    waited += gpu_done - now
                continue
            k = self.kernels[i]
            key = (k.act.device, k.act.stream)
            begin = max(now + self.latency_us, stream_free.get(key, float("-inf")))
            end = begin + k.act.dur_us / max(fix.kernel_factor(k), 1e-6)
            stream_free[key] = end
            gpu_done = max(gpu_done, end)
        host_end = clock.at(self.end_us) + waited
        return max(host_end, gpu_done) - clock.at(self.start_us)


class _HostClock:
    """Maps original host time to replayed host time: the integral of the segment rates."""

    def __init__(self, replay: Replay, rates: dict[str, float]) -> None:
        self.segments = replay.segments
        self.starts = replay.seg_starts
        self.rates = [rates.get(kind, 1.0) for _, _, kind in replay.segments]
        self.cum = [0.0]
        for (s, e, _), r in zip(self.segments, self.rates, strict=True):
            self.cum.append(self.cum[-1] + (e - s) * r)

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return t - (self.starts[0] if self.starts else 0.0)
        s, e, _ = self.segments[i]
        return self.cum[i] + (min(t, e) - s) * self.rates[i] + max(t - e, 0.0)


def build_replay(kernels: list[SimKernel], syncs: list[tuple[float, float]], *,
                 data: Coverage, sync: Coverage, framework: Coverage, copy_calls: Coverage,
                 start_us: float, end_us: float, glue_max_us: float) -> Replay:
    """Segments of [start, end) by the host's state, in the bottleneck model's precedence."""
    whole: Intervals = [(start_us, end_us)]

    def clip(cov: Coverage) -> Intervals:
        return [(max(s, start_us), min(e, end_us)) for s, e in cov.iv_between(start_us, end_us)]

    d = clip(data)
    sy = subtract(clip(sync), d)
    cc = subtract(subtract(clip(copy_calls), d), sy)
    fw = subtract(subtract(subtract(clip(framework), d), sy), cc)
    segments = [(s, e, "data") for s, e in d] + [(s, e, "sync") for s, e in sy]
    segments += [(s, e, "copy_call") for s, e in cc] + [(s, e, "framework") for s, e in fw]
    for s, e in subtract(whole, merge(d + sy + cc + fw)):
        segments.append((s, e, "framework" if e - s < glue_max_us else "outside"))
    segments.sort()
    replay = Replay(kernels, sorted(syncs), segments, start_us, end_us,
                    _launch_latency(kernels))
    replay.seg_starts = [s for s, _, _ in segments]
    return replay


def _launch_latency(kernels: Sequence[SimKernel]) -> float:
    """Median launch-to-start time of kernels that found their stream idle."""
    free: dict[tuple[int, int], float] = {}
    gaps = []
    for k in sorted(kernels, key=lambda k: k.act.start_us):
        key = (k.act.device, k.act.stream)
        if k.launch_us is not None and k.act.start_us > free.get(key, float("-inf")) + 1.0:
            gaps.append(k.act.start_us - k.launch_us)
        free[key] = max(free.get(key, float("-inf")), k.act.start_us + k.act.dur_us)
    gaps = sorted(g for g in gaps if g >= 0)
    return max(gaps[len(gaps) // 2], MIN_LAUNCH_LATENCY_US) if gaps else 5.0


def calibrate(replay: Replay, target_us: float | None) -> float:
    """Host framework scale at which the replay without a fix takes ``target_us``."""
    if not target_us:
        return 1.0
    identity = Fix()
    lo, hi = 0.02, 2.0
    if replay.run(identity, lo) >= target_us:
        return lo  # even a near-free host is too slow: the GPU alone sets the time
    if replay.run(identity, hi) <= target_us:
        return hi
    for _ in range(18):
        mid = (lo + hi) / 2
        if replay.run(identity, mid) < target_us:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def predicted_ms(replay: Replay, fix: Fix, measured_ms: float, host_scale: float) -> float:
    """The iteration time ``fix`` predicts, as a ratio on the measured (un-profiled) time."""
    base = replay.run(Fix(), host_scale)
    if base <= 0:
        return measured_ms
    return measured_ms * replay.run(fix, host_scale) / base
