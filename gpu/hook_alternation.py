"""The hooks' cost, timed in short alternating blocks of one process (issue 13).

On the H200 guest a launch-bound loop's speed drifts by tens of percent over seconds
(docs/performance.md), so blocks of 10 iterations with a fresh hook in each cannot resolve
1 %. Here one long-lived hook runs for the whole process, and its per-iteration calls are
made in every other block of ``--k`` iterations (ABBA order): a hooked block and the bare
block beside it are a fraction of a second apart, so the drift between them is small, and
there are hundreds of such pairs per phase. Phases: ``before`` the window, the window itself
(hooked throughout, not timed), ``during`` its analysis, ``after`` it.

What a pair ratio (hooked / bare) holds: the hook's work on the training thread in its
per-iteration calls, and anything those calls leave for the next iteration of the block. What
it cannot hold: the hook's threads (scalar writer, NVML sampler) run through both arms, and so
does anything process-wide that the window left (CUPTI, the analysis child). So per phase
this also counts, from /proc/self/task/*/schedstat (CPU time and run-queue wait, ns, every
native thread): the CPU time of the hook's threads per iteration. Their Python work holds the
GIL, so their CPU time per iteration over the iteration time bounds what they take from a
GIL-bound loop; ``threads_share`` is that bound. And ``bare_after_over_before``: the bare
blocks after the window against the bare blocks before it, each against the median of the
bare blocks in the same host state (the pure-Python probe): what the window left, with the
drift of the minutes between the phases in it (the paired runs of bench_hook_overhead.py
measure that part against a control process). Every analysis child's own timing (its steps,
CPU time and threads, the trace's size) is kept in ``child_timings``. Every block also holds
the training threads' CPU time (``TrainingClock``), and each pair ratio is given by that clock
too (``*_cpu``); ``cupti_after`` says whether CUPTI's callback subscriber was free at the end
of the after phase (gpu/launch_after_window.py's check).

    python3 gpu/hook_alternation.py --hook torch --out $OUT/alt_torch.json          # GPU
    python3 gpu/hook_alternation.py --hook lightning --out $OUT/alt_light.json
    python3 gpu/hook_alternation.py --hook keras-jax --out $OUT/alt_kjax.json
    python3 gpu/hook_alternation.py --hook torch --no-shapes --out $OUT/alt_noshapes.json
    python3 gpu/hook_alternation.py --hook keras-torch --workload resnet50 --k 1 --pairs 40
    python3 gpu/hook_alternation.py --hook torch --pairs 60 --replays 16 --windows 8
    python3 gpu/hook_alternation.py --hook keras-torch --pairs 40 --replays 12 --child-away
    python3 gpu/hook_alternation.py --hook keras-torch --pairs 16 --child-blas-threads
    python3 gpu/hook_alternation.py --hook torch --replays 0 --windows 20 --window-control
    python3 gpu/hook_alternation.py --hook lightning --pairs 60 --replays 0 --null  # A/A
    python3 gpu/hook_alternation.py --hook torch --smoke                            # CPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))

from overhead_stats import SAME_STATE, STEADY_SPREAD, bootstrap_ci, cpu_probe_ms  # noqa: E402

WINDOW_LENGTH = 3
T = TypeVar("T")


def schedstat(tid: int | str) -> tuple[int, int]:
    """(CPU ns, run-queue wait ns) of one thread of this process; OSError or ValueError where
    it has ended or the kernel keeps no schedstat."""
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run), int(wait)


def task_clocks() -> dict[int, tuple[str, int, int]]:
    """Every native thread of this process: tid -> (name, CPU ns, run-queue wait ns)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            out[int(tid)] = (name, *schedstat(tid))
        except (OSError, ValueError):
            pass  # ended since the listing, or no schedstat in this kernel
    return out


def last_cpu(tid: int) -> int:
    """The CPU a thread of this process last ran on (/proc/.../stat, field 39)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()  # fields 3.. (the name may hold spaces)
    return int(rest[39 - 3])


def with_siblings(cpus: set[int]) -> set[int]:
    """``cpus`` and their SMT siblings, as this machine's topology lists them."""
    out = set(cpus)
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                text = f.read().strip()
        except OSError:
            continue
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def keep_children_away(main_tid: int) -> None:
    """``--child-away``: every child process this one starts (the hook's analysis child) is
    given, right after its start, the CPUs other than those the training threads (this
    thread and torch's autograd threads) last ran on, and their SMT siblings. A test of
    whether the analysis slows training through shared cores; the library is unchanged."""
    import subprocess

    class Away(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            try:
                tids = [t for t, (name, _, _) in task_clocks().items()
                        if t == main_tid or name.startswith("pt_autograd")]
                free = os.sched_getaffinity(0) - with_siblings({last_cpu(t) for t in tids})
                if free:
                    os.sched_setaffinity(self.pid, free)
                    CHILD_CPUS.append(len(free))
            except OSError:
                pass

    subprocess.Popen = Away  # type: ignore[misc]


CHILD_CPUS: list[int] = []  # how many CPUs each child was given (--child-away)
CHILD_TIMINGS: list[dict[str, Any]] = []  # each analysis child's steps (its result's timing)


def record_child_timings() -> None:
    """Keep each analysis child's own timing, its wall time here and its trace's size."""
    from tb_gpuprof import _hookcore

    inner = _hookcore.run_window_child

    def timed(job: dict[str, Any]) -> dict[str, Any]:
        size = os.path.getsize(job["trace"]) if os.path.exists(job["trace"]) else None
        t = time.perf_counter()
        result = inner(job)
        CHILD_TIMINGS.append({"wall_s": round(time.perf_counter() - t, 3),
                              "trace_mb": size and round(size / 1e6, 2),
                              **(result.get("timing") or {})})
        return result

    _hookcore.run_window_child = timed  # type: ignore[assignment]


class TrainingClock:
    """CPU time and run-queue wait of the training threads (this thread and torch's autograd
    threads, ``pt_autograd*``: the main thread sleeps while they run the backward pass),
    from their schedstat. On this guest a launch-bound block's wall time spreads by ~10%
    between adjacent blocks; its CPU time leaves out the time the vCPU was not running
    (preempted on the host, or waiting in the run queue), so the hook's own work on these
    threads shows through less noise. It cannot show GIL waits (the waiting thread sleeps):
    the hook threads' CPU share bounds those."""

    def __init__(self, main_tid: int) -> None:
        self.main_tid = main_tid
        self.tids = [main_tid]

    def refresh(self) -> None:
        """Find the autograd threads again (they start at the first backward pass)."""
        self.tids = [self.main_tid, *sorted(
            t for t, (name, _, _) in task_clocks().items()
            if t != self.main_tid and name.startswith("pt_autograd"))]

    def read(self) -> tuple[int, int]:
        """(CPU ns, run-queue wait ns), summed over the training threads."""
        run = wait = 0
        for tid in self.tids:
            try:
                r, w = schedstat(tid)
            except (OSError, ValueError):
                continue  # ended, or no schedstat in this kernel
            run, wait = run + r, wait + w
        return run, wait


def thread_names() -> dict[int, str]:
    """Native id -> Python thread name, for the threads Python knows."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


class Alternation:
    """The harness: which blocks are hooked, their times, the phases and their counts."""

    def __init__(self, k: int, pairs: int, sync: Callable[[], None], null: bool = False
                 ) -> None:
        self.k, self.pairs, self.sync = k, pairs, sync
        # the null: "hooked" blocks make no call outside the window (an A/A comparison, with
        # the hook's threads, window and analysis as in a real run)
        self.null = null
        self.phase = "before"
        self.blocks: dict[str, list[dict[str, Any]]] = {"before": [], "during": [], "after": []}
        self.counts: dict[str, dict[str, Any]] = {}
        self.in_block = 0  # iterations done in the current block
        self.block_no = 0
        self.t0 = self.probe0 = 0.0
        self.tasks0: dict[int, tuple[str, int, int]] = {}
        self.phase_t0, self.phase_iterations = 0.0, 0
        self.main_tid = threading.get_native_id()
        self.clock = TrainingClock(self.main_tid)
        self.clock0 = (0, 0)
        self.iteration_calls_s = 0.0  # the hook's own calls in this iteration
        self.calls_us: list[float] = []  # ... per hooked iteration of this phase
        self.calls_by_us: dict[str, list[float]] = {}  # each call's time, by its name

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Make one of the hook's per-iteration calls, timing it: its cost on the training
        thread counted directly, beside the pair ratios that time it among the host's noise."""
        if self.null and self.phase != "window":
            return
        t = time.perf_counter()
        fn(*args)
        spent = time.perf_counter() - t
        self.iteration_calls_s += spent
        self.calls_by_us.setdefault(getattr(fn, "__name__", "call"), []).append(spent * 1e6)

    def hooked(self) -> bool:
        """Whether the hook's calls are made in this iteration (every iteration of the window
        phase; ABBA blocks otherwise)."""
        if self.phase == "window":
            return True
        b = self.block_no
        return (b % 2 == 1) if (b // 2) % 2 == 0 else (b % 2 == 0)

    def begin_phase(self, phase: str, sync: bool = True) -> None:
        self.phase = phase
        self.block_no = self.in_block = 0
        if sync:
            self.sync()
        self.clock.refresh()
        self.tasks0, self.phase_t0, self.phase_iterations = task_clocks(), time.perf_counter(), 0
        self.calls_us, self.calls_by_us = [], {}

    def end_phase(self, sync: bool = True) -> None:
        if sync:
            self.sync()
        wall = time.perf_counter() - self.phase_t0
        tasks, names, n = task_clocks(), thread_names(), max(self.phase_iterations, 1)
        per: dict[str, dict[str, float]] = {}
        for tid, (comm, run, wait) in tasks.items():
            r0, w0 = self.tasks0.get(tid, (comm, 0, 0))[1:]
            who = "training" if tid == self.main_tid else names.get(tid, f"native:{comm}")
            d = per.setdefault(who, {"cpu_us": 0.0, "runqueue_wait_us": 0.0, "tasks": 0})
            d["cpu_us"] += (run - r0) / n / 1e3
            d["runqueue_wait_us"] += (wait - w0) / n / 1e3
            d["tasks"] += 1
        iteration_ms = wall / n * 1e3
        hook_us = sum(v["cpu_us"] for k, v in per.items() if k.startswith("tb_gpuprof"))
        self.counts[self.phase] = {
            "iterations": self.phase_iterations, "iteration_ms": round(iteration_ms, 3),
            "per_iteration": {k: {m: round(x, 1) for m, x in v.items()} for k, v in
                              sorted(per.items(), key=lambda kv: -kv[1]["cpu_us"])},
            "hook_threads_us": round(hook_us, 1),
            "threads_share": round(hook_us / 1e3 / iteration_ms, 5)}
        if self.calls_us:  # per hooked iteration, and its mean over the iteration's time
            mean = statistics.fmean(self.calls_us)
            self.counts[self.phase].update(
                hook_calls_us={"median": round(statistics.median(self.calls_us), 1),
                               "mean": round(mean, 1), "max": round(max(self.calls_us), 1)},
                calls_share=round(mean / 1e3 / iteration_ms, 5),
                hook_calls_by_us={name: {"median": round(statistics.median(xs), 1),
                                         "mean": round(statistics.fmean(xs), 1)}
                                  for name, xs in sorted(self.calls_by_us.items()) if xs})

    def iteration_start(self) -> None:
        self.iteration_calls_s = 0.0
        if self.phase == "window":
            return
        if self.in_block == 0:
            if self.block_no % 2 == 0:
                self.probe0 = cpu_probe_ms()
            self.sync()
            self.clock0 = self.clock.read()
            self.t0 = time.perf_counter()

    def iteration_end(self, analysis_running: bool) -> None:
        """After the hook's per-iteration call (or where it would have been)."""
        self.phase_iterations += 1
        if self.phase == "window":
            return
        if self.hooked():
            self.calls_us.append(self.iteration_calls_s * 1e6)
        self.in_block += 1
        if self.in_block < self.k:
            return
        self.sync()
        ms = (time.perf_counter() - self.t0) * 1e3 / self.k
        run, wait = self.clock.read()
        self.blocks[self.phase].append({
            "hooked": self.hooked(), "ms": ms, "probe": self.probe0,
            "analysis": analysis_running, "cpu_ms": (run - self.clock0[0]) / 1e6 / self.k,
            "wait_ms": (wait - self.clock0[1]) / 1e6 / self.k})
        if self.block_no % 2 == 1:
            self.blocks[self.phase][-1]["probe_after"] = cpu_probe_ms()
            self.blocks[self.phase][-2]["probe_after"] = self.blocks[self.phase][-1][
                "probe_after"]
        self.in_block = 0
        self.block_no += 1

    def phase_done(self) -> bool:
        return self.phase != "window" and self.in_block == 0 and \
            self.block_no >= 2 * self.pairs


def mixed_pairs(rows: list[T], on: Callable[[T], Any]) -> list[tuple[T, T, T]]:
    """(first, on, off) of each adjacent pair of rows (0-1, 2-3, ...) that holds one row of
    each arm; the harness's ABBA order makes every pair such a pair."""
    out = []
    for a, b in zip(rows[0::2], rows[1::2], strict=False):
        if bool(on(a)) != bool(on(b)):
            out.append((a, a, b) if on(a) else (a, b, a))
    return out


def pair_ratios(blocks: list[dict[str, Any]], key: str = "ms") -> list[float]:
    """hooked / bare of each adjacent pair whose two probes agree on the host state, by wall
    time (``ms``) or by the training threads' CPU time (``cpu_ms``)."""
    out = []
    for a, h, n in mixed_pairs(blocks, lambda b: b["hooked"]):
        p = (a["probe"], a.get("probe_after", a["probe"]))
        if max(p) > STEADY_SPREAD * min(p):
            continue
        if key in h and n.get(key):
            out.append(h[key] / n[key])
    return out


def same_state_ratio(xs: list[dict[str, Any]], ref: list[dict[str, Any]], key: str = "ms"
                     ) -> list[float]:
    """Each block of ``xs`` over the median of the ``ref`` blocks of its host state."""
    out = []
    for b in xs:
        p = b["probe"]
        same = [r[key] for r in ref if p / SAME_STATE <= r["probe"] <= p * SAME_STATE
                and key in r]
        if len(same) >= 5 and key in b:
            out.append(b[key] / statistics.median(same))
    return out


def summary(ratios: list[float]) -> dict[str, Any]:
    if not ratios:
        return {"n": 0}
    out: dict[str, Any] = {"n": len(ratios)}
    for name, stat in (("median", statistics.median), ("mean", statistics.fmean)):
        out[name] = round(stat(ratios), 4)
        out[f"{name}_ci90"] = bootstrap_ci(lambda r, f=stat: f(r.choices(ratios,
                                                                       k=len(ratios))))
    return out


def phase_figures(alt: Alternation) -> dict[str, Any]:
    """The during phase as a whole (every stall in it) and the window's own cost.

    Phase against phase: both walls hold the harness's probes and syncs (4-5 % over the
    blocks' own times), so a phase's wall is compared with another phase's wall, never with
    block times. ``during_over_neighbours``: the during blocks against the 20 blocks each
    side of the window and its analysis, the nearest in time (the host drifts by tens of
    percent over minutes). ``during_counted``: the analysis thread's CPU time (an upper
    bound on its GIL hold) over the analysis's wall time, plus the hook threads' share: what
    the analysis can take from a GIL-bound loop, counted instead of timed."""
    out: dict[str, Any] = {}
    c, before = alt.counts.get("during"), alt.counts.get("before")
    if c and before:
        out["during_phase_over_before_phase"] = round(c["iteration_ms"] /
                                                      before["iteration_ms"], 4)
    near = [b["ms"] for b in alt.blocks["before"][-20:] + alt.blocks["after"][:20]]
    if alt.blocks["during"] and near:
        out["during_over_neighbours"] = round(statistics.fmean(
            b["ms"] for b in alt.blocks["during"]) / statistics.fmean(near), 4)
    w = alt.counts.get("window")
    if w and before:  # the window's iterations, its stop and its export, over un-profiled
        out["window_extra_s"] = round((w["iteration_ms"] - before["iteration_ms"])
                                      * w["iterations"] / 1e3, 3)
    if ANALYSIS_CPU and c:
        cpu, wall = ANALYSIS_CPU[0]  # the window's own (replays follow)
        out["analysis_thread"] = {"cpu_s": round(cpu, 4), "wall_s": round(wall, 3)}
        out["during_counted"] = round(1 + cpu / wall + c["threads_share"], 4)
    return out


ANALYSIS_CPU: list[tuple[float, float]] = []  # (thread CPU s, wall s) of each _analyze run


def count_analysis(cls: Any) -> None:
    """Time ``cls._analyze`` (the hook's analysis thread) by its thread's CPU clock."""
    inner = cls._analyze

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return inner(self, *args, **kwargs)
        finally:
            ANALYSIS_CPU.append((time.thread_time() - c0, time.perf_counter() - t0))

    cls._analyze = counted


class Replay:
    """After the ``after`` phase: the window's analysis again, on a copy of its stored trace,
    in every other block (ABBA). An ``on`` block lasts as long as that analysis runs; the
    ``off`` block beside it as many iterations as the last ``on`` block. One window gives
    one during phase of 1-2 s, one sample of a host that drifts by tens of percent over
    seconds; this gives ``pairs`` such samples, each beside its own control. The hook's
    per-iteration calls are made in both arms. ``prepare`` copies the stored trace before
    an ``on`` block's clock starts, and gives what starts the analysis on that copy."""

    def __init__(self, pairs: int, sync: Callable[[], None]) -> None:
        self.pairs, self.sync = pairs, sync
        self.blocks: list[dict[str, Any]] = []
        self.prepare: Callable[[], Callable[[], threading.Thread]] | None = None  # Driver's
        self.copy_ms: list[float] = []  # each prepare's time (outside the blocks)
        self.thread: threading.Thread | None = None
        self.n = 0  # iterations done in the current block
        self.off_len = 0
        self.t0 = self.probe0 = 0.0
        self.clock = TrainingClock(threading.get_native_id())
        self.clock0 = (0, 0)

    def on(self) -> bool:
        b = len(self.blocks)
        return (b % 2 == 0) if (b // 2) % 2 == 0 else (b % 2 == 1)

    def iteration_start(self) -> None:
        if self.n == 0:
            launch = None
            if self.on() and self.prepare is not None:
                t = time.perf_counter()
                launch = self.prepare()
                self.copy_ms.append((time.perf_counter() - t) * 1e3)
            self.probe0 = cpu_probe_ms()
            self.sync()
            if not self.blocks:
                self.clock.refresh()
            self.clock0 = self.clock.read()
            self.t0 = time.perf_counter()
            if launch is not None:
                self.thread = launch()

    def iteration_end(self) -> bool:
        """False when every pair is done."""
        self.n += 1
        on = self.on()
        if (self.thread is not None and self.thread.is_alive()) if on else \
                self.n < self.off_len:
            return True
        self.sync()
        ms = (time.perf_counter() - self.t0) * 1e3 / self.n
        run, _ = self.clock.read()
        self.blocks.append({"on": on, "iterations": self.n, "ms": ms, "probe": self.probe0,
                            "cpu_ms": (run - self.clock0[0]) / 1e6 / self.n})
        if on:
            self.off_len, self.thread = self.n, None
        self.n = 0
        return len(self.blocks) < 2 * self.pairs

    def ratios(self, key: str = "ms") -> list[float]:
        """on / off of each pair, by wall time or by the training threads' CPU time."""
        return [on[key] / off[key] for _, on, off in mixed_pairs(self.blocks, lambda b: b["on"])
                if off.get(key)]


def unstored_copy(stored: str, name: str) -> tuple[str, str]:
    """A fresh folder holding ``name``: the stored profile, decompressed where gzipped."""
    import gzip

    tmp = tempfile.mkdtemp(prefix="alt_replay_")
    raw = os.path.join(tmp, name)
    with (gzip.open if stored.endswith(".gz") else open)(stored, "rb") as src, \
            open(raw, "wb") as dst:
        dst.write(src.read())
    return tmp, raw


def started(target: Callable[..., Any], *args: Any) -> threading.Thread:
    t = threading.Thread(target=target, name="tb_gpuprof-window", args=args)
    t.start()
    return t


def torch_replay(prof: Any) -> Callable[[], Callable[[], threading.Thread]]:
    """The torch hook's analysis thread, on a fresh copy of its window's trace."""
    def prepare() -> Callable[[], threading.Thread]:
        _, raw = unstored_copy(prof.trace_path,
                               os.path.basename(prof.trace_path).removesuffix(".gz"))
        return lambda: started(prof._analyze, raw, prof.iter_stop - 1, dict(prof.env),
                               (time.time() - 1, time.time()))
    return prepare


def keras_replay(cb: Any, backend: str) -> Callable[[], Callable[[], threading.Thread]]:
    """The Keras callback's analysis thread, on a fresh copy of its stored profile."""
    import shutil
    import types

    def prepare() -> Callable[[], threading.Thread]:
        stored = os.path.basename(cb.trace_path)
        tmp, raw = unstored_copy(cb.trace_path, "window.pt.trace.json" if backend == "torch"
                                 else stored)
        win = types.SimpleNamespace(
            raw_trace=lambda: raw, first_step=cb.report_step - WINDOW_LENGTH + 1,
            t0=time.time() - 1, t1=time.time(), stored_name=lambda: stored,
            gzip_raw=stored.endswith(".gz"), cleanup=lambda: shutil.rmtree(tmp, True))
        return lambda: started(cb._analyze, win, cb.report_step, dict(cb.env))
    return prepare


class Driver:
    """The per-iteration calls of a run: the alternation's phases, then the replay."""

    def __init__(self, alt: Alternation, replay: Replay | None,
                 starter: Callable[[], Callable[[], Callable[[], threading.Thread]]]
                 ) -> None:
        self.alt, self.replay, self.starter = alt, replay, starter
        self.replaying = False
        self.cupti_after: str | None = None

    def iteration_start(self) -> None:
        (self.replay if self.replaying and self.replay else self.alt).iteration_start()

    def hooked(self) -> bool:
        return self.replaying or self.alt.hooked()

    def iteration_end(self, hook: Any) -> bool:
        """False when the run is over."""
        if self.replaying and self.replay is not None:
            return self.replay.iteration_end()
        self.alt.iteration_end(running(hook))
        if advance(self.alt, hook):
            return True
        from launch_after_window import cupti_subscriber
        self.cupti_after = cupti_subscriber()  # the after phase's end: is CUPTI let go?
        if self.replay is None or getattr(hook, "trace_path", None) is None:
            return False
        self.replay.prepare = self.starter()
        self.replaying = True
        self.alt.null = False  # the replays time the analysis with the hook's calls, as ever
        return True


def replay_figures(replay: Replay | None, first_cpu: int) -> dict[str, Any]:
    if replay is None or not replay.blocks:
        return {}
    runs = ANALYSIS_CPU[first_cpu:]
    share = [cpu / wall for cpu, wall in runs if wall > 0]
    return {"replay_on_over_off": summary(replay.ratios()),
            "replay_on_over_off_cpu": summary(replay.ratios("cpu_ms")),
            "replay_iterations_on": [b["iterations"] for b in replay.blocks if b["on"]],
            "replay_analysis_cpu_share": round(statistics.median(share), 4) if share else None,
            "replay_copy_ms": round(statistics.median(replay.copy_ms), 1)
            if replay.copy_ms else None,
            "replay_blocks": [[int(b["on"]), b["iterations"], round(b["ms"], 3),
                               round(b["probe"], 3), round(b["cpu_ms"], 3)]
                              for b in replay.blocks]}


def new_replay(args: argparse.Namespace, sync: Callable[[], None]) -> Replay | None:
    return Replay(args.replays, sync) if args.replays > 0 else None


def results(drive: Driver, extra: dict[str, Any]) -> dict[str, Any]:
    alt, replay = drive.alt, drive.replay
    out: dict[str, Any] = {"k": alt.k, "pairs": alt.pairs, **extra,
                           "cupti_after": drive.cupti_after, "counts": alt.counts}
    if ANALYSIS_CPU:  # the window's own analysis (the hook's attribute is the last replay's)
        out["analysis_s"] = round(ANALYSIS_CPU[0][1], 3)
    out.update(replay_figures(replay, 1))
    for phase, blocks in alt.blocks.items():
        out[f"{phase}_hooked_over_bare"] = summary(pair_ratios(blocks))
        out[f"{phase}_hooked_over_bare_cpu"] = summary(pair_ratios(blocks, "cpu_ms"))
    bare_before = [b for b in alt.blocks["before"] if not b["hooked"]]
    bare_after = [b for b in alt.blocks["after"] if not b["hooked"]]
    out["bare_after_over_before"] = summary(same_state_ratio(bare_after, bare_before))
    # what the window left on the training threads' CPU (CUPTI's callbacks run there)
    out["bare_after_over_before_cpu"] = summary(same_state_ratio(bare_after, bare_before,
                                                                 "cpu_ms"))
    during = [b for b in alt.blocks["during"] if b["analysis"]]
    out["during_over_bare_before"] = summary(same_state_ratio(during, bare_before))
    out["during_over_bare_before_cpu"] = summary(same_state_ratio(during, bare_before,
                                                                  "cpu_ms"))
    out.update(phase_figures(alt))
    out["during_block_ms"] = [round(b["ms"], 2) for b in during]
    out["bare_ms_median"] = {p: round(statistics.median([b["ms"] for b in bs if not
                                                          b["hooked"]]), 3)
                             for p, bs in alt.blocks.items() if any(not b["hooked"] for b in bs)}
    out["blocks"] = {p: [[int(b["hooked"]), round(b["ms"], 3), round(b["probe"], 3),
                          int(b["analysis"]), round(b["cpu_ms"], 3), round(b["wait_ms"], 3),
                          round(b.get("probe_after", b["probe"]), 3)]
                         for b in bs] for p, bs in alt.blocks.items()}
    return out


# -- the drivers: one per hook, the same phases -------------------------------------------------

def analysis_started(hook: Any) -> bool:
    return getattr(hook, "_analysis", None) is not None


def advance(alt: Alternation, hook: Any) -> bool:
    """Move to the next phase where this one is over; False when the run is over."""
    ph = alt.phase
    if ph == "before" and alt.phase_done():
        alt.end_phase()
        alt.begin_phase("window")
    elif ph == "window" and analysis_started(hook):
        # no synchronization here: the analysis thread's export holds the GIL now, and the
        # training thread's stall on it belongs to the during phase's wall time
        alt.end_phase(sync=False)
        alt.begin_phase("during", sync=False)
    elif ph == "during" and alt.in_block == 0 and alt.block_no % 2 == 0 and hook.wait(0):
        alt.end_phase()
        alt.begin_phase("after")
    elif ph == "after" and alt.phase_done():
        alt.end_phase()
        return False
    return True


def running(hook: Any) -> bool:
    return analysis_started(hook) and not hook.wait(0)


def window_start(args: argparse.Namespace) -> int:
    """The hook's own iteration count at the end of ``before`` is pairs * k (it sees only the
    hooked blocks, none under ``--null``); its window begins a few iterations into the window
    phase."""
    return 3 if args.null else args.pairs * args.k + 3


NEAR_BLOCKS = 20  # blocks each side of a repeated window


def repeated_windows(args: argparse.Namespace, step: Callable[[], None],
                     sync: Callable[[], None], new_hook: Callable[[int], Any]
                     ) -> dict[str, Any]:
    """``--windows N``: N more hooks, one after the other, each with one window; every
    iteration hooked. Per window: the blocks while its analysis runs against the
    ``NEAR_BLOCKS`` blocks before the window and after the analysis. The main run has one
    window, one sample of the during phase; this gives N, each beside its own neighbours,
    with everything the window leaves in its first seconds (the analysis replays leave
    that out). ``--window-control``: every other window's analysis is a sleep as long as the
    last real one (no child, no telemetry, no report), so that pairs of windows tell the
    analysis's part of the during phase from what the window itself leaves behind."""
    def block(hook: Any) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(args.k):
            step()
            hook.step()
        sync()
        return (time.perf_counter() - t0) * 1e3 / args.k

    rows: list[dict[str, Any]] = []
    real_s = [1.0]  # the last real analysis's wall time in the child step, for the control
    for i in range(args.windows):
        hook = new_hook(NEAR_BLOCKS * args.k + 2)  # opens at iteration NEAR_BLOCKS * k + 1
        control = args.window_control and i % 2 == 1
        if control:
            hook._analyze_in_child = lambda *_a, **_k: time.sleep(real_s[0])
        pre = [block(hook) for _ in range(NEAR_BLOCKS)]
        while getattr(hook, "_analysis", None) is None:  # the window, untimed
            step()
            hook.step()
        during = []
        while not hook.wait(0):
            during.append(block(hook))
        post = [block(hook) for _ in range(NEAR_BLOCKS)]
        hook.close()
        if not control and hook.analysis_timing:
            real_s[0] = hook.analysis_timing["telemetry_s"] + hook.analysis_timing["child_s"]
        rows.append({"control": control, "during_over_near": statistics.fmean(during) /
                     statistics.fmean(pre + post) if during else None,
                     "during_blocks": len(during),
            "export_s": getattr(hook, "export_seconds", None),
            "analysis_s": getattr(hook, "analysis_seconds", None),
            "report": hook.report is not None,
            "ms": {"pre": [round(x, 2) for x in pre], "during": [round(x, 2) for x in during],
                   "post": [round(x, 2) for x in post]}})
    def near(control: bool) -> list[float]:
        return [r["during_over_near"] for r in rows
                if r["during_over_near"] is not None and r["control"] == control]
    out = {"windows_during_over_near": summary(near(False)), "windows": rows}
    if args.window_control:
        pairs = [(a["during_over_near"], b["during_over_near"])
                 for a, b in zip(rows[0::2], rows[1::2], strict=False)
                 if a["during_over_near"] and b["during_over_near"]]
        out["control_windows_during_over_near"] = summary(near(True))
        out["windows_real_over_control"] = summary([a / b for a, b in pairs])
    return out


def torch_workload(args: argparse.Namespace) -> Callable[[], None]:
    """The torch workload's step, warmed up; the torch hook's analysis counted."""
    from bench_hook_overhead import gpt2_step, resnet50_step

    from tb_gpuprof.torch import GpuProfiler

    count_analysis(GpuProfiler)
    _, step = (gpt2_step if args.workload == "gpt2" else resnet50_step)(args.smoke)
    for _ in range(10):
        step()
    return step


def off_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--off a,b``: the hook's options ``a=False, b=False``."""
    return {name: False for name in args.off.split(",") if name}


def run_torch(args: argparse.Namespace) -> dict[str, Any]:
    from bench_hook_overhead import sync

    from tb_gpuprof.torch import GpuProfiler

    step = torch_workload(args)
    shapes = not args.no_shapes

    def new_hook(first: int) -> GpuProfiler:
        return GpuProfiler(tempfile.mkdtemp(prefix="alt_torch_"), iter_start=first,
                           iter_stop=first + WINDOW_LENGTH, record_shapes=shapes,
                           with_flops=shapes, **off_options(args)).start()

    prof = new_hook(window_start(args))
    alt = Alternation(args.k, args.pairs, sync, args.null)
    drive = Driver(alt, new_replay(args, sync), lambda: torch_replay(prof))
    alt.begin_phase("before")
    go = True
    while go:
        drive.iteration_start()
        step()
        if drive.hooked():
            alt.call(prof.step)
        go = drive.iteration_end(prof)
    prof.wait(300)
    extra = {"hook": "torch", "off": args.off, "export_s": prof.export_seconds,
             "report": prof.report is not None}
    prof.close()
    if args.windows:
        extra.update(repeated_windows(args, step, sync, new_hook))
    return results(drive, extra)


def run_lightning(args: argparse.Namespace) -> dict[str, Any]:
    import lightning as L
    from bench_hook_overhead import lightning_fit, sync

    from tb_gpuprof.lightning import GpuProfCallback

    step = torch_workload(args)
    first = window_start(args)
    cb = GpuProfCallback(tempfile.mkdtemp(prefix="alt_light_"), iter_start=first,
                         iter_stop=first + WINDOW_LENGTH, **off_options(args))
    alt = Alternation(args.k, args.pairs, sync, args.null)
    drive = Driver(alt, new_replay(args, sync), lambda: torch_replay(cb.profiler))

    class Harness(L.Callback):
        def on_train_start(self, trainer: Any, pl: Any) -> None:
            cb.on_train_start(trainer, pl)
            alt.begin_phase("before")

        def on_train_batch_start(self, trainer: Any, pl: Any, batch: Any, idx: int) -> None:
            drive.iteration_start()
            if drive.hooked():
                alt.call(cb.on_train_batch_start, trainer, pl, batch, idx)

        def on_train_batch_end(self, trainer: Any, pl: Any, out: Any, batch: Any,
                               idx: int) -> None:
            if drive.hooked():
                alt.call(cb.on_train_batch_end, trainer, pl, out, batch, idx)
            if not drive.iteration_end(cb.profiler):
                trainer.should_stop = True

        def on_train_end(self, trainer: Any, pl: Any) -> None:
            if cb.profiler is not None:
                cb.profiler.wait(300)
            cb.on_train_end(trainer, pl)

    lightning_fit(None, step, Harness())
    last = cb.last_profiler
    return results(drive, {"hook": "lightning", "off": args.off,
                           "export_s": last.export_seconds if last else None,
                           "report": last is not None and last.report is not None})


def run_keras(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    os.environ["KERAS_BACKEND"] = backend
    import keras
    from bench_hook_overhead import keras_model, same_batch, sync

    from tb_gpuprof.keras import GpuProfCallback

    count_analysis(GpuProfCallback)
    model, x, y = keras_model(keras, args.workload, args.smoke)
    if args.batch:  # a larger batch of the same model, e.g. to make the GPU bound its step
        reps = -(-args.batch // len(x))
        x, y = x.repeat(reps, axis=0)[:args.batch], y.repeat(reps, axis=0)[:args.batch]
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    first = window_start(args)
    cb = GpuProfCallback(tempfile.mkdtemp(prefix="alt_keras_"), iter_start=first,
                         iter_stop=first + WINDOW_LENGTH, **off_options(args))
    alt = Alternation(args.k, args.pairs, sync if backend == "torch" else lambda: None,
                      args.null)
    drive = Driver(alt, new_replay(args, alt.sync), lambda: keras_replay(cb, backend))
    warm = 10

    class Harness(keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            cb.set_model(self.model)
            cb.on_train_begin(logs)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if batch == warm:
                alt.begin_phase("before")
            if batch >= warm:
                drive.iteration_start()
                if drive.hooked():
                    alt.call(cb.on_train_batch_begin, batch, logs)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch < warm:
                return
            if drive.hooked():
                alt.call(cb.on_train_batch_end, batch, logs)
            if not drive.iteration_end(cb):
                self.model.stop_training = True

        def on_train_end(self, logs: Any = None) -> None:
            cb.wait(300)
            cb.on_train_end(logs)

    model.fit(same_batch(keras, x, y), epochs=1, verbose=0, callbacks=[Harness()])
    return results(drive, {"hook": f"keras-{backend}", "off": args.off,
                           "report": cb.report is not None})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hook", choices=("torch", "lightning", "keras-jax", "keras-torch"),
                    default="torch")
    ap.add_argument("--workload", choices=("gpt2", "resnet50"), default="gpt2")
    ap.add_argument("--k", type=int, default=3, help="iterations per block")
    ap.add_argument("--pairs", type=int, default=300, help="pairs of blocks per phase")
    ap.add_argument("--batch", type=int, default=0,
                    help="Keras: this batch size instead of keras_model's")
    ap.add_argument("--no-shapes", action="store_true",
                    help="torch: a window without operator shapes or FLOPs (a smaller export)")
    ap.add_argument("--replays", type=int, default=20,
                    help="pairs of blocks with and without a replay of the window's analysis")
    ap.add_argument("--windows", type=int, default=0,
                    help="torch: this many more hooks after the run, one window each, for "
                         "the during phase of each against its neighbouring blocks")
    ap.add_argument("--window-control", action="store_true",
                    help="--windows: every other window's analysis is a sleep as long")
    ap.add_argument("--child-away", action="store_true",
                    help="start the analysis child off the training threads' CPUs")
    ap.add_argument("--child-blas-threads", action="store_true",
                    help="let the analysis child's numpy start its BLAS threads (as before)")
    ap.add_argument("--off", default="",
                    help="the hook's options to turn off, comma-separated (torch and "
                         "Lightning: memory,nvtx,nvml,scalars; Keras: memory,nvml,scalars): "
                         "which of its parts costs")
    ap.add_argument("--null", action="store_true",
                    help="the A/A null: hooked blocks outside the window make no hook call, "
                         "so their pair ratios are the host's spread with the hook present")
    ap.add_argument("--smoke", action="store_true", help="tiny models, few pairs (CPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.windows and args.hook != "torch":
        ap.error("--windows: the torch hook only")
    if args.smoke:
        args.pairs, args.replays = min(args.pairs, 6), min(args.replays, 2)
    runs: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "torch": run_torch, "lightning": run_lightning,
        "keras-jax": lambda a: run_keras(a, "jax"),
        "keras-torch": lambda a: run_keras(a, "torch")}
    if args.child_away:
        keep_children_away(threading.get_native_id())
    from tb_gpuprof import _hookcore
    if args.child_blas_threads:
        _hookcore.CHILD_THREAD_LIMITS = {}
    record_child_timings()
    t0 = time.perf_counter()
    out = runs[args.hook](args)
    out["child_cpus"] = CHILD_CPUS or None
    out["child_timings"] = CHILD_TIMINGS
    out["child_thread_limits"] = _hookcore.CHILD_THREAD_LIMITS
    out["workload"], out["wall_s"] = args.workload, round(time.perf_counter() - t0, 1)
    out["batch"] = args.batch or None
    out["null"] = args.null
    text = json.dumps({k: v for k, v in out.items() if k != "blocks"}, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
