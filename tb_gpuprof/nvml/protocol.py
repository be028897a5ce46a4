"""What the sampler, topology and dmon need from an NVML backend, as a ``typing.Protocol``.

Three backends implement it: :class:`~tb_gpuprof.nvml.backend.NvmlBackend` (libnvidia-ml
through nvidia-ml-py), ``tests.nvml_replay.ReplayBackend`` (a recorded H200 file)
and ``tests.nvml_replay.FaultBackend`` (injects failures into another). mypy
checks each against it wherever one is passed; tests/test_nvml_protocol.py checks them at run
time. A new metric is a new field name answered by ``read`` (nvml/fields.py), not a new
method here.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .backend import DeviceInfo


@runtime_checkable
class NvmlApi(Protocol):
    name: str  # "nvml", "replay", ...: names the source in warnings and recordings
    pid: int  # the process whose per-process figures (running processes' memory) count

    # -- life cycle: init raises NvmlUnavailableError (one line) when NVML cannot be used
    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def system_info(self) -> dict[str, Any]: ...
    def devices(self) -> list[DeviceInfo]: ...

    # -- sampling: raw field values by name (nvml/fields.py RAW_FIELDS); a field that cannot
    # be read answers a backend.FieldError; a lost GPU raises backend.GpuLostError
    def read(self, uuid: str, fields: tuple[str, ...] | list[str]) -> dict[str, Any]: ...
    def gpm_supported(self, uuid: str) -> bool: ...
    def gpm_read(self, uuid: str, metric_ids: list[int]) -> dict[int, Any] | None: ...

    # -- topology (nvidia-smi topo -m)
    def topology_level(self, uuid_a: str, uuid_b: str, /) -> int | None: ...
    def nvlinks(self, uuid: str) -> list[dict[str, Any]]: ...
    def p2p_nvlink(self, uuid_a: str, uuid_b: str, /) -> bool | None: ...
    def cpu_affinity(self, uuid: str) -> list[int] | None: ...
    def numa_node(self, uuid: str) -> int | None: ...


__all__ = ["NvmlApi"]
