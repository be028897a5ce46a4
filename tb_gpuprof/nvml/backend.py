"""NVML behind a small interface, so the sampler, topology and dmon run the same on a real GPU,
on a recorded replay (CI has no GPU) and under fault injection (tests).

A backend names devices by UUID (``GPU-…`` or ``MIG-…``) and answers:
``init`` / ``shutdown``, ``devices()`` (static :class:`DeviceInfo`), ``read(uuid, fields)`` (raw
answers per :data:`fields.RAW_FIELDS`, a :class:`FieldError` in place of a failed one; raises
:class:`GpuLostError`), ``gpm_supported``, ``gpm_read`` and the topology queries.
Uses NVIDIA's ``nvidia-ml-py`` binding (import name ``pynvml``), imported only inside ``init``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import GpuProfError

# GPM counters are sampled in pairs; NVML needs them at least 100 ms apart for stable rates.
GPM_MIN_INTERVAL_S = 0.1

# NVML return codes that will not change on a retry: the field is dropped for good.
PERMANENT_CODES = frozenset({"NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_PERMISSION",
                             "INVALID_ARGUMENT", "NOT_FOUND"})


class NvmlUnavailableError(GpuProfError):
    """NVML cannot be used here: no driver, no library, no GPU, or no permission."""


class GpuLostError(Exception):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST); internal, never leaves the sampler."""


@dataclass(frozen=True, slots=True)
class FieldError:
    """An NVML call that failed; ``code`` is the NVML_ERROR_* suffix, e.g. "NOT_SUPPORTED"."""

    code: str

    @property
    def permanent(self) -> bool:
        return self.code in PERMANENT_CODES

    def to_json(self) -> dict[str, str]:
        return {"error": self.code}


@dataclass(slots=True)
class DeviceInfo:
    """Static facts about one GPU or MIG device, as NVML names it."""

    index: int  # NVML index of the physical GPU (PCI bus order)
    uuid: str
    name: str
    pci_bus_id: str | None = None
    memory_total: int | None = None  # bytes
    mig_parent_uuid: str | None = None  # set for a MIG device
    mig_index: int | None = None
    gpu_instance_id: int | None = None
    gpm_supported: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DeviceInfo:
        return cls(**{k: obj[k] for k in cls.__slots__ if k in obj})


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """The real thing: ctypes calls into libnvidia-ml through nvidia-ml-py."""

    name = "nvml"

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[str, Any] = {}
        self._infos: dict[str, DeviceInfo] = {}
        self._gpm: dict[str, dict[str, Any]] = {}
        self._codes: dict[int, str] = {}
        self.pid = os.getpid()

    # ---- life cycle ----
    def init(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailableError(
                "NVML unavailable: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailableError(f"NVML unavailable: {_init_reason(e)}") from None
        except OSError as e:  # a broken libnvidia-ml.so
            raise NvmlUnavailableError(f"NVML unavailable: cannot load libnvidia-ml: {e}") from None
        self._nv = pynvml
        self._codes = {getattr(pynvml, n): n[len("NVML_ERROR_"):]
                       for n in dir(pynvml) if n.startswith("NVML_ERROR_")}
        try:
            self._enumerate()
        except pynvml.NVMLError as e:
            self.shutdown()
            raise NvmlUnavailableError(f"NVML unavailable: listing GPUs failed: {e}") from None
        if not self._infos:
            self.shutdown()
            raise NvmlUnavailableError("NVML unavailable: the driver reports no GPU")

    def shutdown(self) -> None:
        if self._nv is None:
            return
        for state in self._gpm.values():
            for sample in (state.get("base"), state.get("spare")):
                if sample is not None:
                    try:
                        self._nv.nvmlGpmSampleFree(sample)
                    except self._nv.NVMLError:
                        pass
        self._gpm.clear()
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass
        self._nv = None

    def system_info(self) -> dict[str, Any]:
        nv = self._nv
        out: dict[str, Any] = {}
        for key, fn in (("driver_version", "nvmlSystemGetDriverVersion"),
                        ("nvml_version", "nvmlSystemGetNVMLVersion")):
            try:
                out[key] = _text(getattr(nv, fn)())
            except (nv.NVMLError, AttributeError):
                out[key] = None
        try:  # e.g. 13000 -> "13.0"
            v = int(nv.nvmlSystemGetCudaDriverVersion())
            out["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
        except (nv.NVMLError, AttributeError):
            out["cuda_driver"] = None
        return out

    def _enumerate(self) -> None:
        nv = self._nv
        for index in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(index)
            info = DeviceInfo(index=index, uuid=_text(nv.nvmlDeviceGetUUID(h)),
                              name=_text(nv.nvmlDeviceGetName(h)))
            try:
                info.pci_bus_id = _text(nv.nvmlDeviceGetPciInfo(h).busId)
            except nv.NVMLError:
                pass
            try:
                info.memory_total = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            except nv.NVMLError:
                pass
            try:
                info.gpm_supported = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            except (nv.NVMLError, AttributeError):
                info.gpm_supported = False
            self._handles[info.uuid] = h
            self._infos[info.uuid] = info
            self._enumerate_mig(h, info)

    def _enumerate_mig(self, parent: Any, pinfo: DeviceInfo) -> None:
        nv = self._nv
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(parent)
            if current != nv.NVML_DEVICE_MIG_ENABLE:
                return
            count = nv.nvmlDeviceGetMaxMigDeviceCount(parent)
        except nv.NVMLError:
            return
        for i in range(count):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
            except nv.NVMLError:
                continue  # empty slot
            info = DeviceInfo(index=pinfo.index, uuid=_text(nv.nvmlDeviceGetUUID(mh)),
                              name=pinfo.name + " MIG", pci_bus_id=pinfo.pci_bus_id,
                              mig_parent_uuid=pinfo.uuid, mig_index=i,
                              gpm_supported=pinfo.gpm_supported)
            try:
                info.gpu_instance_id = int(nv.nvmlDeviceGetGpuInstanceId(mh))
                info.memory_total = int(nv.nvmlDeviceGetMemoryInfo(mh).total)
            except nv.NVMLError:
                pass
            self._handles[info.uuid] = mh
            self._infos[info.uuid] = info

    def devices(self) -> list[DeviceInfo]:
        return list(self._infos.values())

    # ---- sampling ----
    def _code(self, exc: Exception) -> str:
        code = getattr(exc, "value", None)
        return self._codes.get(code, "UNKNOWN") if isinstance(code, int) else "UNKNOWN"

    def read(self, uuid: str, fields: tuple[str, ...] | list[str]) -> dict[str, Any]:
        """One tick of raw answers; raises GpuLostError when the GPU is gone."""
        nv = self._nv
        info = self._infos[uuid]
        own = self._handles[uuid]
        # MIG handles answer only memory/process queries; board-wide ones come from the parent.
        parent = self._handles[info.mig_parent_uuid] if info.mig_parent_uuid else own
        out: dict[str, Any] = {}
        for field in fields:
            handle = own if field in ("memory_info", "processes") else parent
            try:
                out[field] = self._call(field, handle)
            except nv.NVMLError as e:
                code = self._code(e)
                if code == "GPU_IS_LOST":
                    raise GpuLostError(uuid) from None
                out[field] = FieldError(code)
            except AttributeError:  # an older nvidia-ml-py without this function
                out[field] = FieldError("FUNCTION_NOT_FOUND")
        return out

    def _call(self, field: str, h: Any) -> Any:
        nv = self._nv
        if field == "utilization":
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return {"gpu": int(u.gpu), "memory": int(u.memory)}
        if field == "encoder_utilization":
            return list(nv.nvmlDeviceGetEncoderUtilization(h))
        if field == "decoder_utilization":
            return list(nv.nvmlDeviceGetDecoderUtilization(h))
        if field == "power_usage":
            return int(nv.nvmlDeviceGetPowerUsage(h))
        if field == "power_limit":
            return int(nv.nvmlDeviceGetEnforcedPowerLimit(h))
        if field == "temperature_gpu":
            return int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        if field == "temperature_memory":
            fv = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_MEMORY_TEMP])[0]
            if fv.nvmlReturn != nv.NVML_SUCCESS:
                raise nv.NVMLError(fv.nvmlReturn)
            return _field_value(nv, fv)
        if field == "clock_sm":
            return int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        if field == "clock_mem":
            return int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        if field == "memory_info":
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return {"used": int(m.used), "total": int(m.total)}
        if field == "pcie_tx":
            return int(nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))
        if field == "pcie_rx":
            return int(nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))
        if field == "clock_event_reasons":
            return int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        if field == "processes":
            # usedGpuMemory is None when NVML cannot tell (e.g. a container without host PIDs)
            return [[int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)]
                    for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
        raise ValueError(f"unknown NVML field {field!r}")

    def gpm_supported(self, uuid: str) -> bool:
        return self._infos[uuid].gpm_supported

    def gpm_read(self, uuid: str, metric_ids: list[int]) -> dict[int, Any] | None:
        """GPM metrics between the previous sample and now; None until ≥100 ms have passed.

        Raises GpuLostError; a failing call yields ``{id: FieldError}`` for every id.
        """
        nv = self._nv
        info = self._infos[uuid]
        try:
            state = self._gpm.get(uuid)
            if state is None:
                # Stored only once complete: a first sample that fails (NVMLError) leaves no
                # half-made state behind for the next call to trip over.
                state = {"base": nv.nvmlGpmSampleAlloc(), "spare": nv.nvmlGpmSampleAlloc()}
                self._gpm_take(info, state["base"])
                state["t"] = time.monotonic()
                self._gpm[uuid] = state
                return None
            now = time.monotonic()
            if now - state["t"] < GPM_MIN_INTERVAL_S:
                return None
            self._gpm_take(info, state["spare"])
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(metric_ids)
            mg.sample1 = state["base"]
            mg.sample2 = state["spare"]
            for i, metric_id in enumerate(metric_ids):
                mg.metrics[i].metricId = metric_id
            nv.nvmlGpmMetricsGet(mg)
            state["base"], state["spare"], state["t"] = state["spare"], state["base"], now
        except nv.NVMLError as e:
            code = self._code(e)
            if code == "GPU_IS_LOST":
                raise GpuLostError(uuid) from None
            return {metric_id: FieldError(code) for metric_id in metric_ids}
        except AttributeError:  # an nvidia-ml-py without GPM
            return {metric_id: FieldError("FUNCTION_NOT_FOUND") for metric_id in metric_ids}
        out: dict[int, Any] = {}
        for i, metric_id in enumerate(metric_ids):
            m = mg.metrics[i]
            out[metric_id] = (float(m.value) if m.nvmlReturn == nv.NVML_SUCCESS
                              else FieldError(self._codes.get(m.nvmlReturn, "UNKNOWN")))
        return out

    def _gpm_take(self, info: DeviceInfo, sample: Any) -> None:
        nv = self._nv
        if info.mig_parent_uuid and info.gpu_instance_id is not None:
            nv.nvmlGpmMigSampleGet(self._handles[info.mig_parent_uuid], info.gpu_instance_id,
                                   sample)
        else:
            nv.nvmlGpmSampleGet(self._handles[info.uuid], sample)

    # ---- topology ----
    def topology_level(self, uuid_a: str, uuid_b: str) -> int | None:
        """NVML_TOPOLOGY_* (0 same board, 10 PIX, 20 PXB, 30 PHB, 40 NODE, 50 SYS)."""
        nv = self._nv
        try:
            return int(nv.nvmlDeviceGetTopologyCommonAncestor(self._handles[uuid_a],
                                                              self._handles[uuid_b]))
        except nv.NVMLError:
            return None

    def nvlinks(self, uuid: str) -> list[dict[str, Any]]:
        """Active NVLinks: [{"link": i, "remote_bus_id": str, "remote_type": "gpu|switch|..."}]."""
        nv = self._nv
        h = self._handles[uuid]
        types = {0: "gpu", 1: "ibmnpu", 2: "switch"}
        links: list[dict[str, Any]] = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if not nv.nvmlDeviceGetNvLinkState(h, link):
                    continue
            except nv.NVMLError:
                continue  # link absent or NVLink unsupported
            entry: dict[str, Any] = {"link": link, "remote_bus_id": None, "remote_type": None}
            try:
                entry["remote_bus_id"] = _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except nv.NVMLError:
                pass
            try:
                entry["remote_type"] = types.get(nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link))
            except (nv.NVMLError, AttributeError):
                pass
            links.append(entry)
        return links

    def p2p_nvlink(self, uuid_a: str, uuid_b: str) -> bool | None:
        """Whether NVML reports NVLink P2P between two GPUs (covers NVSwitch systems)."""
        nv = self._nv
        try:
            status = nv.nvmlDeviceGetP2PStatus(self._handles[uuid_a], self._handles[uuid_b],
                                               nv.NVML_P2P_CAPS_INDEX_NVLINK)
        except nv.NVMLError:
            return None
        return status == nv.NVML_P2P_STATUS_OK

    def cpu_affinity(self, uuid: str) -> list[int] | None:
        nv = self._nv
        words = max(1, ((os.cpu_count() or 64) + 63) // 64)
        try:
            masks = nv.nvmlDeviceGetCpuAffinity(self._handles[uuid], words)
        except nv.NVMLError:
            return None
        return [w * 64 + b for w, mask in enumerate(masks) for b in range(64) if mask >> b & 1]

    def numa_node(self, uuid: str) -> int | None:
        nv = self._nv
        try:
            node = int(nv.nvmlDeviceGetNumaNodeId(self._handles[uuid]))
            return node if node >= 0 else None
        except (nv.NVMLError, AttributeError):
            pass
        bus = self._infos[uuid].pci_bus_id
        if not bus:
            return None
        # sysfs spells the domain with 4 hex digits, NVML with 8
        path = f"/sys/bus/pci/devices/{bus.lower()[-12:]}/numa_node"
        try:
            with open(path) as f:
                node = int(f.read().strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None


def _field_value(nv: Any, fv: Any) -> float | int:
    kinds = {nv.NVML_VALUE_TYPE_DOUBLE: "dVal", nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
             nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
             nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
             nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
             nv.NVML_VALUE_TYPE_SIGNED_INT: "siVal"}
    return getattr(fv.value, kinds.get(fv.valueType, "uiVal"))


def _init_reason(exc: Exception) -> str:
    """One line that tells a user why NVML would not start."""
    text = str(exc)
    name = type(exc).__name__
    if "LibraryNotFound" in name:
        return "libnvidia-ml.so not found (no NVIDIA driver installed, or not visible here)"
    if "DriverNotLoaded" in name:
        return "the NVIDIA driver is not loaded"
    if "NoPermission" in name:
        return "no permission to access the GPU (check /dev/nvidia* permissions)"
    if "LibRmVersionMismatch" in name:
        return "NVML library and kernel driver versions differ (reboot or reinstall the driver)"
    return f"nvmlInit failed: {text}"
