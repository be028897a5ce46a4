"""A stand-in for libnvidia-ml: patches nvidia-ml-py's functions so NvmlBackend's real code
paths (argument passing, struct handling, error mapping) run on a machine without a GPU.

Only the transport is fake; error classes, constants and ctypes structs are nvidia-ml-py's own.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str
    name: str = "NVIDIA H200"
    not_supported: set[str] = field(default_factory=set)  # pynvml function names
    lost: bool = False
    gpm: bool = True
    util: int = 50
    gpm_counter: float = 0.0
    nvlink_peers: list[str] = field(default_factory=list)  # remote bus ids, one per link


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: list[str] = []

    def install(self, monkeypatch: Any) -> None:
        fns = {name: getattr(self, name) for name in dir(self) if name.startswith("nvml")}
        for name, fn in fns.items():
            monkeypatch.setattr(pynvml, name, fn)

    def _gpu(self, h: Any, fn: str) -> FakeGpu:
        self.calls.append(fn)
        gpu = self.gpus[h]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.not_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "999.1"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.999"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].bus_id)

    def nvmlDeviceGetMigMode(self, h: int) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        return SimpleNamespace(isSupportedDevice=int(self.gpus[h].gpm))

    def nvmlDeviceGetMemoryInfo(self, h: int, version: Any = None) -> Any:
        self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=40 * 2**30, total=140 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        gpu = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=gpu.util, memory=20)

    def nvmlDeviceGetEncoderUtilization(self, h: int) -> list[int]:
        self._gpu(h, "nvmlDeviceGetEncoderUtilization")
        return [0, 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: int) -> list[int]:
        self._gpu(h, "nvmlDeviceGetDecoderUtilization")
        return [0, 167000]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetPowerUsage")
        return 350_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit")
        return 700_000

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._gpu(h, "nvmlDeviceGetTemperature")
        return 45

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> Any:
        self._gpu(h, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for i, fid in enumerate(ids):
            values[i].fieldId = fid
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            values[i].value.uiVal = 52
        return values

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        self._gpu(h, "nvmlDeviceGetClockInfo")
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return 2048

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons")
        return 0x4 | 0x20

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=4242, usedGpuMemory=3 * 2**30),
                SimpleNamespace(pid=99, usedGpuMemory=None)]

    def nvmlGpmSampleAlloc(self) -> Any:
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        pass

    def nvmlGpmSampleGet(self, h: int, sample: Any) -> Any:
        gpu = self._gpu(h, "nvmlGpmSampleGet")
        gpu.gpm_counter += 1
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self.calls.append("nvmlGpmMetricsGet")
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in (60, 61):  # no NVLink on this fake board
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                m.nvmlReturn = pynvml.NVML_SUCCESS
                m.value = ctypes.c_double(10.0 + m.metricId).value
        return mg

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return pynvml.NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= len(self.gpus[h].nvlink_peers):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].nvlink_peers[link])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return 0

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetCpuAffinity(self, h: int, words: int) -> list[int]:
        return [0xF] + [0] * (words - 1)

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        return 0
