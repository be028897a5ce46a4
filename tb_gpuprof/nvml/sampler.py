"""Background NVML sampler for the GPUs this process uses.

    sampler = NvmlSampler()              # GPUs from CUDA_VISIBLE_DEVICES, 0.5 s interval
    if not sampler.start():              # never raises
        print(sampler.unavailable_reason)
    ...                                  # training
    samples = sampler.drain()            # since the last drain, thread-safe
    writer.add_scalars({layout.scalar_tag(k): v for k, v in sampler.scalars(samples).items()},
                       step)
    report_telemetry = sampler.window_summary(samples)
    sampler.stop()

Default interval 0.5 s: one tick costs ~15 NVML calls per GPU (well under a millisecond of CPU;
see docs/performance.md), so the thread uses far below 1 % of a core, while a 0.5 s grid still
gives several samples per logged step for typical 1-10 s logging intervals. GPM pairs are taken
at the same ticks, always ≥ 100 ms apart (NVML's minimum for stable GPM rates).

Fields degrade one by one: an NVML answer that cannot change on retry (NOT_SUPPORTED, no
permission, ...) marks that field unsupported for that GPU and it is never asked again; other
errors skip the value, and three in a row also retire the field. A lost GPU
(NVML_ERROR_GPU_IS_LOST) is dropped with one warning. Nothing here raises into the caller.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .backend import DeviceInfo, FieldError, GpuLostError, NvmlUnavailableError
from .devices import select_devices
from .fields import (
    GPM_METRICS,
    POWER_REASONS,
    RAW_FIELDS,
    RAW_FIELDS_REPLACED_BY_GPM,
    THERMAL_REASONS,
    decode_clock_events,
    gpm_to_metrics,
    raw_to_metrics,
)
from .protocol import NvmlApi

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5
MAX_BUFFERED_SAMPLES = 200_000  # bounds memory if nobody drains (~a day at 0.5 s x 2 GPUs)
TRANSIENT_ERRORS_TO_RETIRE = 3


@dataclass(slots=True)
class Sample:
    """One GPU at one tick. ``gpu`` is the CUDA ordinal; values are named as in fields.METRICS."""

    time: float  # time.time()
    gpu: int
    values: dict[str, float]
    clock_events: list[str] | None = None  # None: reasons not readable on this GPU


@dataclass(slots=True)
class _DeviceState:
    gpu: int
    info: DeviceInfo
    gpm: bool
    gpm_ids: list[int]
    unsupported: dict[str, str] = field(default_factory=dict)  # field/metric -> NVML error code
    failures: dict[str, int] = field(default_factory=dict)
    lost: bool = False


class NvmlSampler:
    """Samples NVML (and GPM where supported) for the given CUDA ordinals on a daemon thread."""

    def __init__(self, devices: list[int] | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 gpm: bool = True, backend: NvmlApi | None = None, *,
                 cuda_visible_devices: str | None = None) -> None:
        self.wanted = list(devices) if devices is not None else None
        self.interval_s = max(0.01, float(interval_s))
        self.gpm = gpm
        self.unavailable_reason: str | None = None
        self.warnings: list[str] = []
        self.system: dict[str, Any] = {}
        self.cpu_time_s = 0.0  # CPU time the sampler thread has used (time.thread_time)
        self.ticks = 0
        self._backend: NvmlApi | None = backend
        self._cuda_visible = (cuda_visible_devices if cuda_visible_devices is not None
                              else os.environ.get("CUDA_VISIBLE_DEVICES"))
        self._states: list[_DeviceState] = []
        self._buffer: deque[Sample] = deque(maxlen=MAX_BUFFERED_SAMPLES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = False

    # ---- setup ----
    def open(self) -> bool:
        """Start NVML and pick the devices without starting the thread (dmon samples inline)."""
        if self._opened:
            return True
        if self.unavailable_reason is not None:
            return False
        try:
            if self._backend is None:
                from .backend import NvmlBackend

                self._backend = NvmlBackend()
            backend = self._backend
            backend.init()
            try:
                chosen = select_devices(backend.devices(), self._cuda_visible, self.wanted)
                self.system = dict(backend.system_info())
            except BaseException:
                backend.shutdown()
                raise
        except NvmlUnavailableError as e:
            self.unavailable_reason = str(e)
            return False
        except Exception as e:  # a broken driver must not take the training job down
            self.unavailable_reason = f"NVML unavailable: {type(e).__name__}: {e}"
            return False
        for gpu, info in chosen:
            use_gpm = self.gpm and backend.gpm_supported(info.uuid)
            state = _DeviceState(gpu=gpu, info=info, gpm=use_gpm, gpm_ids=list(GPM_METRICS))
            if not use_gpm:
                state.unsupported["gpm"] = "NOT_SUPPORTED" if self.gpm else "DISABLED"
            self._states.append(state)
        self._opened = True
        return True

    def start(self) -> bool:
        """Start sampling in the background; False (with ``unavailable_reason``) if impossible."""
        if self._thread is not None:
            return True
        if not self.open():
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tb_gpuprof-nvml", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the thread and release NVML; buffered samples stay drainable."""
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout=max(5.0, 3 * self.interval_s))
        if self._opened:
            try:
                self.backend.shutdown()
            except Exception:  # shutting down a broken driver is best effort
                pass
            self._opened = False

    def __enter__(self) -> NvmlSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def devices(self) -> list[tuple[int, DeviceInfo]]:
        """(CUDA ordinal, device) pairs being sampled."""
        return [(s.gpu, s.info) for s in self._states]

    @property
    def unsupported(self) -> dict[int, dict[str, str]]:
        """Per CUDA ordinal: field or metric -> NVML error code that retired it."""
        return {s.gpu: dict(s.unsupported) for s in self._states}

    @property
    def all_lost(self) -> bool:
        return bool(self._states) and all(s.lost for s in self._states)

    @property
    def backend(self) -> NvmlApi:
        """The backend in use (after :meth:`open`; a RuntimeError before)."""
        if self._backend is None:
            raise RuntimeError("NvmlSampler.backend read before open()")
        return self._backend

    # ---- sampling ----
    def _run(self) -> None:
        next_tick = time.monotonic()
        failures = 0
        while not self._stop.is_set():
            try:
                samples = self.sample_once()
                failures = 0
            except Exception as e:  # a bug or a driver surprise: warn, keep the job alive
                failures += 1
                samples = []
                self._warn(f"NVML sampling failed: {type(e).__name__}: {e}")
                if failures >= TRANSIENT_ERRORS_TO_RETIRE:
                    self._warn("NVML sampler stopped after repeated failures")
                    break
            if samples:
                with self._lock:
                    self._buffer.extend(samples)
            self.cpu_time_s = time.thread_time()
            if self.all_lost:
                break
            next_tick += self.interval_s
            now = time.monotonic()
            if next_tick < now:  # fell behind (suspended process): don't burst
                next_tick = now + self.interval_s
            self._stop.wait(next_tick - now)

    def sample_once(self) -> list[Sample]:
        """One tick over every live device, on the calling thread."""
        if not self._opened:
            return []
        self.ticks += 1
        out: list[Sample] = []
        for state in self._states:
            if state.lost:
                continue
            try:
                sample = self._sample_device(state)
            except GpuLostError:
                state.lost = True
                self._warn(f"GPU {state.gpu} ({state.info.uuid}) is lost; "
                           "stopped sampling it")
                continue
            out.append(sample)
        return out

    def _sample_device(self, state: _DeviceState) -> Sample:
        skip = set(state.unsupported)
        if state.gpm and "pcie_tx_mib_s" not in state.unsupported:
            skip.update(RAW_FIELDS_REPLACED_BY_GPM)  # GPM measures PCIe without blocking 20 ms
        fields = [f for f in RAW_FIELDS if f not in skip]
        backend = self.backend
        raw = backend.read(state.info.uuid, fields)
        clean: dict[str, Any] = {}
        for k, v in raw.items():
            if isinstance(v, FieldError):
                self._failed(state, k, v)
            else:
                clean[k] = v
                state.failures.pop(k, None)  # only consecutive failures retire a field
        values = raw_to_metrics(clean, backend.pid)
        if state.gpm and state.gpm_ids:
            answer = backend.gpm_read(state.info.uuid, state.gpm_ids)
            if answer is not None:
                good = {m: v for m, v in answer.items() if not isinstance(v, FieldError)}
                for m, v in answer.items():
                    if not isinstance(v, FieldError):
                        state.failures.pop(GPM_METRICS[m], None)
                    elif self._failed(state, GPM_METRICS[m], v) and m in state.gpm_ids:
                        state.gpm_ids.remove(m)
                if not state.gpm_ids:
                    state.gpm = False
                    state.unsupported["gpm"] = "NOT_SUPPORTED"
                values.update(gpm_to_metrics(good))
        reasons = clean.get("clock_event_reasons")
        events = decode_clock_events(int(reasons)) if isinstance(reasons, int) else None
        return Sample(time=time.time(), gpu=state.gpu, values=values, clock_events=events)

    def _failed(self, state: _DeviceState, name: str, err: FieldError) -> bool:
        """Count a failure of ``name``; True once it is retired."""
        if err.permanent:
            state.unsupported[name] = err.code
            log.info("GPU %d: %s unsupported (%s); no longer queried", state.gpu, name, err.code)
            return True
        state.failures[name] = state.failures.get(name, 0) + 1
        if state.failures[name] >= TRANSIENT_ERRORS_TO_RETIRE:
            state.unsupported[name] = err.code
            self._warn(f"GPU {state.gpu}: {name} failed {TRANSIENT_ERRORS_TO_RETIRE} times "
                       f"({err.code}); no longer queried")
            return True
        return False

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
            log.warning("%s", message)

    def drain(self) -> list[Sample]:
        """Samples taken since the previous drain, oldest first."""
        with self._lock:
            out = list(self._buffer)
            self._buffer.clear()
        return out

    # ---- aggregation ----
    def scalars(self, samples: list[Sample]) -> dict[str, float]:
        """Mean of each metric per GPU: {"gpu0/sm_util_pct": 87.5, ...} (no "gpuprof/")."""
        out: dict[str, float] = {}
        for gpu, stats in _per_gpu(samples).items():
            for name, mean in stats["mean"].items():
                out[f"gpu{gpu}/{name}"] = mean
            if stats["events_known"]:
                out[f"gpu{gpu}/clock_event_power_pct"] = stats["power_pct"]
                out[f"gpu{gpu}/clock_event_thermal_pct"] = stats["thermal_pct"]
        return out

    def window_summary(self, samples: list[Sample]) -> dict[str, Any]:
        """report["telemetry"]: per-GPU means/maxima, clock-event shares, what is unsupported."""
        per_gpu = _per_gpu(samples)
        gpus = []
        for state in self._states:
            stats = per_gpu.get(state.gpu)
            gpus.append({
                "gpu": state.gpu, "nvml_index": state.info.index, "uuid": state.info.uuid,
                "name": state.info.name, "mig": state.info.mig_parent_uuid is not None,
                "samples": stats["n"] if stats else 0,
                "mean": {k: round(v, 3) for k, v in stats["mean"].items()} if stats else {},
                "max": {k: round(v, 3) for k, v in stats["max"].items()} if stats else {},
                "clock_events_pct": stats["events_pct"] if stats else {},
                "clock_event_power_pct": stats["power_pct"] if stats else None,
                "clock_event_thermal_pct": stats["thermal_pct"] if stats else None,
                "gpm": state.gpm, "lost": state.lost, "unsupported": dict(state.unsupported)})
        times = [s.time for s in samples]
        return {"source": "nvml", "interval_s": self.interval_s, "samples": len(samples),
                "duration_s": round(max(times) - min(times), 3) if times else 0.0,
                "gpus": gpus, "driver_version": self.system.get("driver_version"),
                "unavailable_reason": self.unavailable_reason, "warnings": list(self.warnings)}


def _per_gpu(samples: list[Sample]) -> dict[int, dict[str, Any]]:
    acc: dict[int, dict[str, Any]] = {}
    for s in samples:
        a = acc.setdefault(s.gpu, {"n": 0, "sum": {}, "cnt": {}, "max": {}, "events": {},
                                   "events_known": 0, "power": 0, "thermal": 0})
        a["n"] += 1
        for k, v in s.values.items():
            a["sum"][k] = a["sum"].get(k, 0.0) + v
            a["cnt"][k] = a["cnt"].get(k, 0) + 1
            a["max"][k] = max(a["max"].get(k, v), v)
        if s.clock_events is not None:
            a["events_known"] += 1
            for r in s.clock_events:
                a["events"][r] = a["events"].get(r, 0) + 1
            # hw_slowdown alone is ambiguous (power brake or thermal); it is listed per reason
            a["power"] += bool(POWER_REASONS.intersection(s.clock_events))
            a["thermal"] += bool(THERMAL_REASONS.intersection(s.clock_events))
    out: dict[int, dict[str, Any]] = {}
    for gpu, a in acc.items():
        known = a["events_known"]
        out[gpu] = {
            "n": a["n"], "mean": {k: a["sum"][k] / a["cnt"][k] for k in a["sum"]},
            "max": a["max"], "events_known": known,
            "events_pct": {r: round(100.0 * c / known, 1) for r, c in sorted(a["events"].items())},
            "power_pct": round(100.0 * a["power"] / known, 1) if known else None,
            "thermal_pct": round(100.0 * a["thermal"] / known, 1) if known else None}
    return out
