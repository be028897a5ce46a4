"""The statistics of bench_hook_overhead.py, framework-free: blocks, host states, ratios.

Why host states: on the GPU machine (a KVM guest) the pure-Python probe below runs at one of
two speeds, about 1.1 ms or about 2.1 ms, switching every few seconds on most vCPUs (another
guest's work on the same physical core, as far as we can tell), and a launch-bound loop runs
about 27 ms or about 38 ms per iteration with it (gpu/noise_structure.py; docs/performance.md).
Within one state, adjacent 10-iteration blocks of the same loop differ by 0.97-1.04
(10th-90th percentile); across a switch, by up to 1.4. So every block is timed between two
probes, a block whose probes disagree is left out, and a block is only ever compared with
blocks of the same host state.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

# (ms per iteration, probe ms just before the block, probe ms just after it, the launch
# probe's CUDA / CPU time ratio just before the block, or 0.0 where there is none)
Block = tuple[float, float, float, float]
STEADY_SPREAD = 1.25  # probes within this factor: one host state (the two are ~1.8x apart)
SAME_STATE = 1.25  # a block's reference: bare blocks whose probe is within this factor


def cpu_probe_ms() -> float:
    """A fixed pure-Python workload (no CUDA, so CUPTI cannot touch it), best of 3: the
    host's speed right now."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        acc = 0
        for i in range(20000):
            acc += i * i % 7
        table = {i: i for i in range(3000)}
        acc += sum(table.values())
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def steady(*blocks: Block) -> bool:
    probes = [p for b in blocks for p in b[1:3]]
    return max(probes) <= STEADY_SPREAD * min(probes)


def probe_of(b: Block) -> float:
    return (b[1] + b[2]) / 2


def bootstrap_ci(stat: Callable[[random.Random], float], n: int = 1000) -> list[float]:
    rng = random.Random(0)
    vals = sorted(stat(rng) for _ in range(n))
    return [round(vals[int(0.05 * n)], 4), round(vals[int(0.95 * n) - 1], 4)]


def pair_ratios(pairs: Sequence[tuple[Block, Block]], matched: bool) -> list[float]:
    """hooked / bare of adjacent blocks; ``matched``: only pairs within one host state."""
    return [h[0] / b[0] for b, h in pairs if not matched or steady(b, h)]


def state_matched_ratios(blocks: Sequence[Block], bare: Sequence[Block],
                         field: int = 0) -> list[float]:
    """Each steady block's ``field`` (0: ms per iteration, 3: the launch probe) against the
    median of that field over the steady bare blocks of its host state."""
    ref = [b for b in bare if steady(b) and b[field] > 0]
    out = []
    for b in blocks:
        if not steady(b) or b[field] <= 0:
            continue
        p = probe_of(b)
        same = [r[field] for r in ref if p / SAME_STATE <= probe_of(r) <= p * SAME_STATE]
        if len(same) >= 3:
            out.append(b[field] / statistics.median(same))
    return out


def _summary(name: str, ratios: list[float], raw: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {f"{name}_ratio": None, f"{name}_ratio_raw": raw,
                           f"{name}_n": len(ratios)}
    if ratios:
        out[f"{name}_ratio"] = round(statistics.median(ratios), 4)
        out[f"{name}_ci90"] = bootstrap_ci(lambda r: statistics.median(
            r.choices(ratios, k=len(ratios))))
    return out


def launch_summary(bare: Sequence[Block], during: Sequence[Block],
                   post: Sequence[Block]) -> dict[str, Any]:
    """The launch probe (CUDA over CPU time of the same tiny op, back to back) during and
    after the windows against bare blocks of the same host state: how much slower a CUDA
    launch is, which is what a CUPTI left subscribed changes. (The ratio itself depends on
    the host state, about 1.7 in the slow one and 2.1 in the fast one.)"""
    ref = [b[3] for b in bare if b[3] > 0]
    out: dict[str, Any] = {"launch_probe_bare": round(statistics.median(ref), 4) if ref
                           else None}
    for name, xs in (("during_analysis", during), ("after_window", post)):
        ratios = state_matched_ratios(xs, bare, field=3)
        out[f"{name}_launch_ratio"] = round(statistics.median(ratios), 4) if ratios else None
        out[f"{name}_launch_n"] = len(ratios)
        if ratios:
            out[f"{name}_launch_ci90"] = bootstrap_ci(lambda r, v=ratios: statistics.median(
                r.choices(v, k=len(v))))
    return out


def from_recorded(row: dict[str, Any]) -> dict[str, Any]:
    """A recorded row (``--out``'s JSON) summarised again from its ``raw_blocks``."""
    raw = row["raw_blocks"]

    def block(b: Sequence[float]) -> Block:  # older records: no launch probe, one probe
        return (b[0], b[1], b[2] if len(b) > 2 else b[1], b[3] if len(b) > 3 else 0.0)

    pairs = [(block(b), block(h)) for b, h in raw["pairs"]]
    plan = Plan(row.get("block_iterations", 10), 0, 0, row.get("windows", 1))
    plan.window = row.get("windows", 1)
    plan.pairs = pairs
    plan.bare = [b for b, _ in pairs]
    plan.during = [block(b) for b in raw["during"]]
    plan.post = [block(b) for b in raw["after"]]
    keep = {k: row[k] for k in ("hook", "workload", "analysis_s", "report", "seconds")
            if k in row}
    return plan.result(keep)


class Plan:
    """Blocks to time, the windows, and what came of them."""

    def __init__(self, block: int, groups: int, after: int, windows: int,
                 launch_probe: Callable[[], float] | None = None) -> None:
        self.launch_probe = launch_probe
        self.block_iterations, self.groups = block, groups
        self.after, self.windows = after, windows
        self.pairs: list[tuple[Block, Block]] = []
        self.bare: list[Block] = []
        self.during: list[Block] = []
        self.post: list[Block] = []
        self.window = 0  # windows begun
        self.after_iterations = 0  # in the current window's "after" phase
        self.probe_before = 0.0
        self.launch_before = 0.0

    def always_on_order(self) -> list[bool]:
        """hooked? per block, ABBA groups: bare, hooked, hooked, bare."""
        return [False, True, True, False] * self.groups

    def start_block(self) -> None:
        self.launch_before = self.launch_probe() if self.launch_probe is not None else 0.0
        self.probe_before = cpu_probe_ms()

    def end_block(self, ms: float) -> Block:
        return (ms, self.probe_before, cpu_probe_ms(), self.launch_before)

    def record_always_on(self, times: list[tuple[bool, Block]]) -> None:
        self.bare = [b for hooked, b in times if not hooked]
        hooked = [b for h, b in times if h]
        # ABBA: pair each hooked block with the bare block beside it
        self.pairs = list(zip(self.bare, hooked, strict=True))

    def begin_window(self) -> bool:
        """False when every window has run."""
        if self.window >= self.windows:
            return False
        self.window += 1
        self.after_iterations = 0
        return True

    def record_post(self, b: Block, analysis_was_running: bool) -> bool:
        """One block after a window; False once enough iterations ran after its analysis."""
        if analysis_was_running:
            self.during.append(b)
        else:
            self.post.append(b)
            self.after_iterations += self.block_iterations
        return self.after_iterations < self.after

    def result(self, extra: dict[str, Any]) -> dict[str, Any]:
        def raw(xs: Sequence[Block]) -> float | None:
            if not xs or not self.bare:
                return None
            return round(statistics.median(b[0] for b in xs) /
                         statistics.median(b[0] for b in self.bare), 4)

        all_pairs = pair_ratios(self.pairs, matched=False)
        out: dict[str, Any] = {
            **extra, "block_iterations": self.block_iterations, "windows": self.window,
            "bare_ms": round(statistics.median(b[0] for b in self.bare), 3) if self.bare
            else None,
            **_summary("always_on", pair_ratios(self.pairs, matched=True),
                       round(statistics.median(all_pairs), 4) if all_pairs else None),
            **_summary("during_analysis", state_matched_ratios(self.during, self.bare),
                       raw(self.during)),
            **_summary("after_window", state_matched_ratios(self.post, self.bare),
                       raw(self.post)),
            **launch_summary(self.bare, self.during, self.post),
            "blocks": {"pairs": len(self.pairs), "bare": len(self.bare),
                       "during": len(self.during), "after": len(self.post)},
            "raw_blocks": {"pairs": self.pairs, "during": self.during, "after": self.post}}
        return out
