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

import bisect
import os
import random
import select
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from work_counter import Work

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


MAX_TURN_GAP_S = 2.0  # a control block further from the treated block than this: not its neighbour


def paired_ratios(blocks: Sequence[Block], times: Sequence[Sequence[float]],
                  control: Sequence[Sequence[float]], matched: bool = False) -> list[float]:
    """Each treated block over the mean of the two control blocks that ran just before and
    just after it (``control``: [start, end, *Block] sorted by start), where the neighbours
    are close in time; ``matched``: only where all three blocks' probes agree on the host
    state. Not by default: the two processes run on vCPUs of their own, whose states
    differ (on the H200 guest a quarter to a third of the triples agreed), while the drift that
    pairing cancels (up to 1.7x over a minute, GPT-2 at one probe speed) is the host's."""
    starts = [c[0] for c in control]
    out = []
    for b, (t0, t1) in zip(blocks, times, strict=True):
        i = bisect.bisect_left(starts, t1)
        if i == 0 or i >= len(control) or t1 <= t0:
            continue
        before, after = control[i - 1], control[i]
        if before[1] > t0 or t0 - before[1] > MAX_TURN_GAP_S or after[0] - t1 > MAX_TURN_GAP_S:
            continue
        cb = (before[2], before[3], before[4], before[5])
        ca = (after[2], after[3], after[4], after[5])
        if not matched or steady(b, cb, ca):
            out.append(b[0] / ((cb[0] + ca[0]) / 2))
    return out


def paired_summary(row: dict[str, Any], control_blocks: Sequence[Sequence[float]]
                   ) -> dict[str, Any]:
    """The ratios against a control process run in turn with this one (--paired).

    A treated block over its control neighbours still carries the two processes' fixed
    difference (their memory layout, their vCPUs), which the bare blocks of the always-on
    phase measure (``paired_null``); each ratio is divided by it. So the after-window
    ratio compares blocks run at the same time, not minutes apart as the in-process one does.
    """
    raw, times = row["raw_blocks"], row.get("block_times")
    if not times or not control_blocks:
        return {}

    def blocks(xs: Sequence[Sequence[float]]) -> list[Block]:
        return [(b[0], b[1], b[2], b[3]) for b in xs]

    ctrl = sorted(control_blocks)
    out: dict[str, Any] = {"control_blocks_n": len(ctrl)}
    # matched: only triples whose probes agree on the host state; worth it where the two
    # processes share one vCPU (--cpu-list with one CPU), whose state they then both see
    for tag, matched in (("paired", False), ("paired_matched", True)):
        null = paired_ratios(blocks([b for b, _ in raw["pairs"]]), times["bare"], ctrl,
                             matched)
        out[f"{tag}_null_ratio"] = round(statistics.median(null), 4) if null else None
        out[f"{tag}_null_n"] = len(null)
        for name, xs, t in (("always_on", [h for _, h in raw["pairs"]], times["hooked"]),
                            ("during_analysis", raw["during"], times["during"]),
                            ("after_window", raw["after"], times["after"])):
            r = paired_ratios(blocks(xs), t, ctrl, matched)
            out[f"{name}_{tag}_n"] = len(r)
            out[f"{name}_{tag}"] = None
            if r and null:
                out[f"{name}_{tag}"] = round(statistics.median(r) / statistics.median(null), 4)
                out[f"{name}_{tag}_ci90"] = bootstrap_ci(lambda g, r=r, null=null: (
                    statistics.median(g.choices(r, k=len(r)))
                    / statistics.median(g.choices(null, k=len(null)))))
            if r and null and not matched:
                # the mean as well: a stall in one block of ten (the trace export holding
                # the GIL) is a tenth of the phase's cost, which a median does not show
                out[f"{name}_{tag}_mean"] = round(statistics.fmean(r) / statistics.fmean(null),
                                                  4)
                out[f"{name}_{tag}_mean_ci90"] = bootstrap_ci(lambda g, r=r, null=null: (
                    statistics.fmean(g.choices(r, k=len(r)))
                    / statistics.fmean(g.choices(null, k=len(null)))))
    return out


WORK_FIELDS = (*Work._fields, "wall_ns")  # a block's counts, then its timed wall time


def _ratio_summary(out: dict[str, Any], name: str, bw: dict[str, list[Any]], f: int) -> None:
    bare = [w[f] for w in bw["bare"] if w and w[f] > 0]
    pairs = [(b[f], h[f]) for b, h in zip(bw["bare"], bw["hooked"], strict=True)
             if b and h and b[f] > 0]
    if not bare or not pairs:
        return
    ref = statistics.median(bare)
    out[f"{name}_per_block_bare"] = round(ref)
    for phase, ratios in (("always_on", [h / b for b, h in pairs]),
                          ("during_analysis", [w[f] / ref for w in bw["during"] if w]),
                          ("after_window", [w[f] / ref for w in bw["after"] if w])):
        out[f"{phase}_{name}_ratio"] = round(statistics.median(ratios), 4) if ratios else None
        out[f"{phase}_{name}_n"] = len(ratios)
        if ratios:
            out[f"{phase}_{name}_ci90"] = bootstrap_ci(lambda r, v=ratios: statistics.median(
                r.choices(v, k=len(v))))


def work_summary(bw: dict[str, list[Any]]) -> dict[str, Any]:
    """The blocks' counts (work_counter.Work differences, then the wall ns; None where a
    block has none) like the times: hooked / bare over the always-on pairs, and the blocks
    during and after the analysis over the bare blocks' median, for the training thread's
    instructions and cycles (where counted: the host's speed does not change instructions,
    so no state matching) and CPU time. The other threads' CPU time is given as its share of
    the block's wall time (the mean over each phase's blocks: a writer's burst in one block
    of ten is a tenth of its cost, not nothing), the switches and faults as medians per
    block."""
    out: dict[str, Any] = {}
    for name in ("instructions", "cycles", "thread_cpu_ns"):
        _ratio_summary(out, name, bw, WORK_FIELDS.index(name))
    others, wall = WORK_FIELDS.index("others_cpu_ns"), WORK_FIELDS.index("wall_ns")
    medians = [(WORK_FIELDS.index(name), name) for name in
               ("voluntary_switches", "involuntary_switches", "minor_faults")]
    for phase in ("bare", "hooked", "during", "after"):
        ws = [w for w in bw[phase] if w and w[wall] > 0]
        out[f"{phase}_others_cpu_share"] = (round(sum(w[others] for w in ws)
                                                  / sum(w[wall] for w in ws), 5)
                                            if ws else None)
        for f, name in medians:
            xs = [w[f] for w in bw[phase] if w]
            out[f"{phase}_{name}_median"] = statistics.median(xs) if xs else None
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
    out = plan.result(keep)
    if row.get("block_times") and row.get("control_blocks"):
        out.update(paired_summary(row, row["control_blocks"]))
    if row.get("block_work"):
        out["work"] = work_summary(row["block_work"])
    return out


TURN_FDS_ENV = "TB_GPUPROF_BENCH_TURN_FDS"  # "<go fd>,<ready fd>": a paired run's child


class Turns:
    """A paired run's child side: one block at a time, in turn with the control process.

    Before each block the child says it is ready (everything since its last block, a window
    included, is done) and waits for its turn; so the two processes' blocks alternate, never
    overlap, and each treated block has a control block just before and just after it, in
    the same seconds of the host's drift (see paired_summary)."""

    def __init__(self, go_fd: int, ready_fd: int) -> None:
        self.go_fd, self.ready_fd = go_fd, ready_fd

    @classmethod
    def from_env(cls) -> Turns | None:
        fds = os.environ.get(TURN_FDS_ENV)
        if not fds:
            return None
        go, ready = (int(x) for x in fds.split(","))
        return cls(go, ready)

    def wait(self) -> bool:
        """True when it is this process's turn; False once the coordinator has ended the run."""
        try:
            os.write(self.ready_fd, b"r")
            return os.read(self.go_fd, 1) == b"g"
        except OSError:
            return False


class TurnCoordinator:
    """The parent side: gives the treated child (``a``) and the control child (``b``) turns
    alternately, until the treated one exits; then the control's next wait returns False."""

    def __init__(self) -> None:
        self.fds: dict[str, tuple[int, int]] = {}  # name -> (our go write end, ready read end)
        self.child_fds: dict[str, tuple[int, int]] = {}

    def child_env(self, name: str) -> tuple[dict[str, str], tuple[int, int]]:
        """The environment entry for child ``name`` and the fds it must inherit."""
        go_r, go_w = os.pipe()
        ready_r, ready_w = os.pipe()
        self.fds[name] = (go_w, ready_r)
        self.child_fds[name] = (go_r, ready_w)
        return {TURN_FDS_ENV: f"{go_r},{ready_w}"}, (go_r, ready_w)

    def started(self) -> None:
        """After both children started: close their pipe ends here."""
        for go_r, ready_w in self.child_fds.values():
            os.close(go_r)
            os.close(ready_w)
        self.child_fds.clear()

    def _ready(self, name: str, deadline: float) -> bool:
        fd = self.fds[name][1]
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(name)
        return os.read(fd, 1) == b"r"

    def run(self, timeout: float) -> int:
        """Alternate turns; the number of turns the treated child had. TimeoutError past
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        alive_a, alive_b = self._ready("a", deadline), self._ready("b", deadline)
        turns = 0
        while alive_a:
            os.write(self.fds["a"][0], b"g")
            turns += 1
            alive_a = self._ready("a", deadline)
            if alive_b:
                os.write(self.fds["b"][0], b"g")
                alive_b = self._ready("b", deadline)
        self.close()
        return turns

    def close(self) -> None:
        for go_w, ready_r in self.fds.values():
            for fd in (go_w, ready_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fds.clear()


class Plan:
    """Blocks to time, the windows, and what came of them."""

    def __init__(self, block: int, groups: int, after: int, windows: int,
                 launch_probe: Callable[[], float] | None = None,
                 turns: Turns | None = None, control: bool = False,
                 work_counter: Any = None) -> None:
        self.launch_probe = launch_probe
        # work_counter.WorkCounter or None: the training thread's counts over each timed
        # part of a block (clock_started() to end_block())
        self.work_counter = work_counter
        self.work_start: Sequence[int] | None = None
        self.work_of: dict[int, list[int]] = {}
        self.turns, self.control = turns, control
        # (host clock at the block's start and end, the block): pairs blocks with the
        # control process's (time.perf_counter is CLOCK_MONOTONIC: one clock for both)
        self.timeline: list[tuple[float, float, Block]] = []
        self.t_start = 0.0
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

    def start_block(self) -> bool:
        """Probe the host before a block; in a paired run, wait for this process's turn
        first. False (control) or SystemExit (treated) once the coordinator ended the run."""
        if self.turns is not None and not self.turns.wait():
            if self.control:
                return False
            raise SystemExit("bench: the paired run's coordinator ended the run")
        self.launch_before = self.launch_probe() if self.launch_probe is not None else 0.0
        self.probe_before = cpu_probe_ms()
        self.t_start = time.perf_counter()
        return True

    def clock_started(self) -> None:
        """The timed part of a block starts now (after the lead-in and a synchronization)."""
        if self.work_counter is not None:
            self.work_start = self.work_counter.read()

    def end_block(self, ms: float) -> Block:
        t_end = time.perf_counter()
        work = self.work_counter.read() if self.work_counter is not None else None
        b = (ms, self.probe_before, cpu_probe_ms(), self.launch_before)
        self.timeline.append((self.t_start, t_end, b))
        if work is not None and self.work_start is not None:
            # the block's counts, then its timed wall time in ns (work_summary's shares)
            self.work_of[id(b)] = [x - y for x, y in zip(work, self.work_start, strict=True)] \
                + [round(ms * self.block_iterations * 1e6)]
        self.work_start = None
        return b

    def block_times(self, blocks: Sequence[Block]) -> list[list[float]]:
        """[start, end] on the host clock of each of ``blocks`` (timed by this plan)."""
        when = {id(b): (t0, t1) for t0, t1, b in self.timeline}  # later entries win
        return [list(when.get(id(b), (0.0, 0.0))) for b in blocks]

    def control_result(self) -> dict[str, Any]:
        """A control process's blocks: [start, end, ms, probe before, probe after, launch]."""
        return {"control_blocks": [[t0, t1, *b] for t0, t1, b in self.timeline],
                "block_iterations": self.block_iterations}

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
        if self.work_of:
            bw = {"bare": [self.work_of.get(id(b)) for b, _ in self.pairs],
                  "hooked": [self.work_of.get(id(h)) for _, h in self.pairs],
                  "during": [self.work_of.get(id(b)) for b in self.during],
                  "after": [self.work_of.get(id(b)) for b in self.post]}
            out["block_work"] = bw
            out["work"] = work_summary(bw)
        if self.timeline:
            out["block_times"] = {
                "bare": self.block_times([b for b, _ in self.pairs]),
                "hooked": self.block_times([h for _, h in self.pairs]),
                "during": self.block_times(self.during), "after": self.block_times(self.post)}
        return out
