"""Replay of recorded NVML answers, and fault injection, for running without a GPU.

Replay file (JSON, written by ``tools/record_nvml.py`` on a real GPU)::

    {"format": "tb_gpuprof-nvml-replay", "version": 1,
     "recorded": {"host": .., "pid": 1234, "interval_s": 0.25, "system": {driver, nvml, ..}},
     "devices": [DeviceInfo.to_json(), ..],          # every GPU/MIG device NVML listed
     "topology": {"levels": {"<uuidA>|<uuidB>": 50}, "p2p_nvlink": {"<a>|<b>": true},
                  "nvlinks": {"<uuid>": [{"link": 0, "remote_bus_id": .., "remote_type": ..}]},
                  "cpu_affinity": {"<uuid>": [0, 1, ..]}, "numa_node": {"<uuid>": 0}},
     "ticks": [{"t": 0.0, "phase": "idle|load",
                "devices": {"<uuid>": {"raw": {"utilization": {"gpu": 0, "memory": 0},
                                               "temperature_memory": {"error": "NOT_SUPPORTED"},
                                               ..},
                                       "gpm": {"2": 97.1, "60": {"error": "NOT_SUPPORTED"}}
                                              | null,   # null: no GPM pair this tick
                                       "lost": false}}}]}

Every raw answer is what NVML returned, or ``{"error": "<NVML_ERROR_* suffix>"}``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from tb_gpuprof.nvml.backend import DeviceInfo, FieldError, GpuLostError, NvmlUnavailableError
from tb_gpuprof.nvml.fields import GPM_METRICS, RAW_FIELDS

REPLAY_FORMAT = "tb_gpuprof-nvml-replay"
REPLAY_VERSION = 1


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"error"}:
        return FieldError(str(value["error"]))
    return value


def _encode(value: Any) -> Any:
    return value.to_json() if isinstance(value, FieldError) else value


def _pair(a: str, b: str) -> str:
    return f"{a}|{b}"


class ReplayBackend:
    """Serves a recorded file tick by tick: each ``read`` of a device returns its next tick.

    ``gpm_read`` answers from the tick the latest ``read`` of that device returned (the sampler
    reads raw fields first). Past the last tick it repeats the last one, or wraps with ``loop``.
    """

    name = "replay"

    def __init__(self, source: str | os.PathLike | dict[str, Any], *, loop: bool = False) -> None:
        if isinstance(source, dict):
            data, where = source, "replay data"
        else:
            where = os.fspath(source)
            try:
                with open(where, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                raise NvmlUnavailableError(f"{where}: cannot read NVML replay file: {e}") from None
        if not isinstance(data, dict) or data.get("format") != REPLAY_FORMAT:
            raise NvmlUnavailableError(f"{where}: not an NVML replay file")
        if int(data.get("version", 0)) > REPLAY_VERSION:
            raise NvmlUnavailableError(f"{where}: replay version {data.get('version')} is newer "
                                       f"than this tb_gpuprof reads ({REPLAY_VERSION})")
        self.data = data
        self.loop = loop
        self.pid = int(data.get("recorded", {}).get("pid", -1))
        self._infos = [DeviceInfo.from_json(d) for d in data.get("devices", [])]
        self._ticks: list[dict[str, Any]] = list(data.get("ticks", []))
        self._cursor: Counter[str] = Counter()
        self._current: dict[str, dict[str, Any]] = {}
        self._topo = data.get("topology", {})

    def init(self) -> None:
        if not self._infos:
            raise NvmlUnavailableError("NVML unavailable: the driver reports no GPU (replay)")

    def shutdown(self) -> None:
        pass

    def system_info(self) -> dict[str, Any]:
        return dict(self.data.get("recorded", {}).get("system", {}))

    def devices(self) -> list[DeviceInfo]:
        return list(self._infos)

    @property
    def ticks(self) -> int:
        return len(self._ticks)

    def _next(self, uuid: str) -> dict[str, Any]:
        if not self._ticks:
            return {}
        k = self._cursor[uuid]
        self._cursor[uuid] += 1
        k = k % len(self._ticks) if self.loop else min(k, len(self._ticks) - 1)
        entry = self._ticks[k].get("devices", {}).get(uuid, {})
        self._current[uuid] = entry
        return entry

    def read(self, uuid: str, fields: tuple[str, ...] | list[str]) -> dict[str, Any]:
        entry = self._next(uuid)
        if entry.get("lost"):
            raise GpuLostError(uuid)
        raw = entry.get("raw", {})
        return {f: _decode(raw[f]) for f in fields if f in raw}

    def gpm_supported(self, uuid: str) -> bool:
        return any(i.uuid == uuid and i.gpm_supported for i in self._infos)

    def gpm_read(self, uuid: str, metric_ids: list[int]) -> dict[int, Any] | None:
        entry = self._current.get(uuid)
        if entry is None:
            entry = self._ticks[0].get("devices", {}).get(uuid, {}) if self._ticks else {}
        if entry.get("lost"):
            raise GpuLostError(uuid)
        gpm = entry.get("gpm")
        if gpm is None:
            return None
        return {m: _decode(gpm[str(m)]) for m in metric_ids if str(m) in gpm}

    def topology_level(self, a: str, b: str) -> int | None:
        levels = self._topo.get("levels", {})
        level = levels.get(_pair(a, b), levels.get(_pair(b, a)))
        return None if level is None else int(level)

    def nvlinks(self, uuid: str) -> list[dict[str, Any]]:
        return list(self._topo.get("nvlinks", {}).get(uuid, []))

    def p2p_nvlink(self, a: str, b: str) -> bool | None:
        p2p = self._topo.get("p2p_nvlink", {})
        return p2p.get(_pair(a, b), p2p.get(_pair(b, a)))

    def cpu_affinity(self, uuid: str) -> list[int] | None:
        return self._topo.get("cpu_affinity", {}).get(uuid)

    def numa_node(self, uuid: str) -> int | None:
        return self._topo.get("numa_node", {}).get(uuid)


class FaultBackend:
    """Wraps a backend and injects NVML failures; records which fields were asked for.

    init_error: nvmlInit fails with this reason. unsupported: field names (raw fields or GPM ids)
    answering NOT_SUPPORTED. lost_after: {uuid: n} -> GPU_IS_LOST from the (n+1)-th read on.
    gpm_unsupported: the device reports no GPM support.
    """

    def __init__(self, inner: Any, *, init_error: str | None = None,
                 unsupported: set[str | int] | None = None,
                 lost_after: dict[str, int] | None = None,
                 gpm_unsupported: bool = False) -> None:
        self.inner = inner
        self.init_error = init_error
        self.unsupported = set(unsupported or ())
        self.lost_after = dict(lost_after or {})
        self.gpm_unsupported = gpm_unsupported
        self.requests: Counter[tuple[str, str | int]] = Counter()
        self.reads: Counter[str] = Counter()
        self.name = f"faults({inner.name})"
        self.pid = inner.pid

    def __getattr__(self, name: str) -> Any:  # topology and the rest pass through
        return getattr(self.inner, name)

    def init(self) -> None:
        if self.init_error is not None:
            raise NvmlUnavailableError(f"NVML unavailable: {self.init_error}")
        self.inner.init()

    def read(self, uuid: str, fields: tuple[str, ...] | list[str]) -> dict[str, Any]:
        self.reads[uuid] += 1
        if uuid in self.lost_after and self.reads[uuid] > self.lost_after[uuid]:
            raise GpuLostError(uuid)
        for f in fields:
            self.requests[(uuid, f)] += 1
        out = self.inner.read(uuid, fields)
        for f in fields:
            if f in self.unsupported:
                out[f] = FieldError("NOT_SUPPORTED")
        return out

    def gpm_supported(self, uuid: str) -> bool:
        return not self.gpm_unsupported and self.inner.gpm_supported(uuid)

    def gpm_read(self, uuid: str, metric_ids: list[int]) -> dict[int, Any] | None:
        if uuid in self.lost_after and self.reads[uuid] > self.lost_after[uuid]:
            raise GpuLostError(uuid)
        for m in metric_ids:
            self.requests[(uuid, m)] += 1
        res = self.inner.gpm_read(uuid, metric_ids)
        if res is None:
            return None
        return {m: FieldError("NOT_SUPPORTED") if m in self.unsupported else v
                for m, v in res.items()}


# ---- recording (used by tools/record_nvml.py on a real GPU) ----

def record_tick(backend: Any, uuids: list[str], t: float, phase: str,
                gpm: bool = True) -> dict[str, Any]:
    """Everything NVML answers for these devices right now, in the replay file's tick form."""
    devices: dict[str, Any] = {}
    for uuid in uuids:
        try:
            raw = backend.read(uuid, RAW_FIELDS)
            answer = None
            if gpm and backend.gpm_supported(uuid):
                answer = backend.gpm_read(uuid, list(GPM_METRICS))
            devices[uuid] = {
                "raw": {k: _encode(v) for k, v in raw.items()},
                "gpm": None if answer is None else {str(k): _encode(v) for k, v in answer.items()},
                "lost": False}
        except GpuLostError:
            devices[uuid] = {"raw": {}, "gpm": None, "lost": True}
    return {"t": round(t, 4), "phase": phase, "devices": devices}


def record_topology(backend: Any, uuids: list[str]) -> dict[str, Any]:
    levels: dict[str, int | None] = {}
    p2p: dict[str, bool | None] = {}
    for i, a in enumerate(uuids):
        for b in uuids[i + 1:]:
            levels[_pair(a, b)] = backend.topology_level(a, b)
            p2p[_pair(a, b)] = backend.p2p_nvlink(a, b)
    return {"levels": levels, "p2p_nvlink": p2p,
            "nvlinks": {u: backend.nvlinks(u) for u in uuids},
            "cpu_affinity": {u: backend.cpu_affinity(u) for u in uuids},
            "numa_node": {u: backend.numa_node(u) for u in uuids}}
