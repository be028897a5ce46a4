"""Builds small Nsight Systems SQLite exports for tests.

The DDL below is the documented ``nsys export --type sqlite`` schema (export schema 3.x, as in
NVIDIA's "SQLite Export Schema Reference"), trimmed to the tables a profile reader uses; column
names, order and types are the export's. Every table is optional (``tables=``) because nsys
creates tables lazily.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

SCHEMA = {
    "StringIds": """CREATE TABLE StringIds (
        id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)""",
    "TARGET_INFO_GPU": """CREATE TABLE TARGET_INFO_GPU (
        vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT,
        isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER,
        clockRate INTEGER, smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER,
        chipName TEXT, cuDevice INTEGER, ctxswDevPath TEXT, ctrlDevPath TEXT,
        revision INTEGER, nodeMask INTEGER, constantMemory INTEGER, maxIPC INTEGER,
        maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER,
        maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, threadsPerWarp INTEGER,
        asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER,
        maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER,
        maxBlockDimZ INTEGER, maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER,
        computeMajor INTEGER, computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER)""",
    "TARGET_INFO_CUDA_DEVICE": """CREATE TABLE TARGET_INFO_CUDA_DEVICE (
        gpuId INTEGER, cudaId INTEGER NOT NULL, pid INTEGER NOT NULL, uuid TEXT,
        numMultiprocessors INTEGER)""",
    "META_DATA_EXPORT": """CREATE TABLE META_DATA_EXPORT (
        name TEXT NOT NULL, value TEXT)""",
    "CUPTI_ACTIVITY_KIND_KERNEL": """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
        start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
        contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
        correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
        shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER,
        cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL,
        gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL,
        blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL,
        dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER NOT NULL,
        localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
        sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER)""",
    "CUPTI_ACTIVITY_KIND_MEMCPY": """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
        start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
        contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
        correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,
        copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER,
        srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER,
        migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER)""",
    "CUPTI_ACTIVITY_KIND_MEMSET": """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (
        start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
        contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
        correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL,
        bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER)""",
    "CUPTI_ACTIVITY_KIND_RUNTIME": """CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
        start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
        globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
        returnValue INTEGER NOT NULL, callchainId INTEGER)""",
    "NVTX_EVENTS": """CREATE TABLE NVTX_EVENTS (
        start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
        category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
        textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER,
        doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL,
        jsonTextId INTEGER, jsonText TEXT, binaryData TEXT)""",
}

NVTX_MARK, NVTX_PUSH_POP, NVTX_START_END = 34, 59, 60
PID = 4242
GLOBAL_TID = (PID << 24) | 4243  # nsys serialized GlobalId: pid above bit 24, tid below


@dataclass
class NsysExport:
    """Rows to write; names are interned into StringIds as the exporter does."""

    strings: dict[str, int] = field(default_factory=dict)
    kernels: list[tuple] = field(default_factory=list)
    memcpys: list[tuple] = field(default_factory=list)
    memsets: list[tuple] = field(default_factory=list)
    runtime: list[tuple] = field(default_factory=list)
    nvtx: list[tuple] = field(default_factory=list)
    _corr: int = 0

    def sid(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings) + 1)

    def _next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def launch(self, start_ns: int, dur_ns: int, name: str, *, short: str | None = None,
               grid=(1, 1, 1), block=(128, 1, 1), regs=32, static_smem=0, dyn_smem=0,
               stream=7, device=0, api="cudaLaunchKernel_v7000") -> int:
        """A runtime launch call and the kernel it launched (1 us later)."""
        corr = self._next_corr()
        self.runtime.append((start_ns - 5000, start_ns - 1000, 1, GLOBAL_TID, corr,
                             self.sid(api), 0, None))
        self.kernels.append((
            start_ns, start_ns + dur_ns, device, 1, None, stream, corr, PID << 24,
            self.sid(name), self.sid(short or name.split("(")[0].split()[-1]), None, 1, 0,
            regs, *grid, *block, static_smem, dyn_smem, 0, 0, corr, None, None, None))
        return corr

    def memcpy(self, start_ns: int, dur_ns: int, nbytes: int, copy_kind: int) -> None:
        corr = self._next_corr()
        self.runtime.append((start_ns - 3000, start_ns - 500, 1, GLOBAL_TID, corr,
                             self.sid("cudaMemcpyAsync_v3020"), 0, None))
        self.memcpys.append((start_ns, start_ns + dur_ns, 0, 1, None, 7, corr, PID << 24,
                             nbytes, copy_kind, None, 0, 2, 0, 1, 0, 1, None, None, None))

    def memset(self, start_ns: int, dur_ns: int, nbytes: int) -> None:
        corr = self._next_corr()
        self.memsets.append((start_ns, start_ns + dur_ns, 0, 1, None, 7, corr, PID << 24, 0,
                             nbytes, None, 2))

    def api(self, start_ns: int, dur_ns: int, name: str) -> None:
        self.runtime.append((start_ns, start_ns + dur_ns, 1, GLOBAL_TID, self._next_corr(),
                             self.sid(name), 0, None))

    def range(self, start_ns: int, end_ns: int | None, text: str, *, registered=False,
              event_type=NVTX_PUSH_POP) -> None:
        text_col, text_id = (None, self.sid(text)) if registered else (text, None)
        self.nvtx.append((start_ns, end_ns, event_type, None, None, None, text_col, GLOBAL_TID,
                          None, text_id, None, None, None, None, None, None, None, None, None,
                          None))

    def write(self, path, *, tables: set[str] | None = None, gpu_name="NVIDIA H200") -> str:
        """Write the export; ``tables`` limits which tables exist (default: all)."""
        names = set(SCHEMA) if tables is None else set(tables)
        con = sqlite3.connect(str(path))
        with con:
            for table in names:
                con.execute(SCHEMA[table])
            inserts = {
                "StringIds": [(i, s) for s, i in self.strings.items()],
                "CUPTI_ACTIVITY_KIND_KERNEL": self.kernels,
                "CUPTI_ACTIVITY_KIND_MEMCPY": self.memcpys,
                "CUPTI_ACTIVITY_KIND_MEMSET": self.memsets,
                "CUPTI_ACTIVITY_KIND_RUNTIME": self.runtime,
                "NVTX_EVENTS": self.nvtx,
                "META_DATA_EXPORT": [("EXPORT_PRODUCT_VERSION", "2024.6.2.225"),
                                     ("EXPORT_SCHEMA_VERSION", "3.16.1")],
                # nsys GPU id 3 shows up as CUDA device 0 in the profiled process
                "TARGET_INFO_GPU": [(0, 3, gpu_name, "0000:19:00.0", 1, 62914560,
                                     150109880320, 4800000000000, 1980000000, 132)
                                    + (None,) * 27 + (9, 0, 9, 0)],
                "TARGET_INFO_CUDA_DEVICE": [(3, 0, PID, "GPU-1234", 132)],
            }
            for table, rows in inserts.items():
                if table in names and rows:
                    marks = ",".join("?" * len(rows[0]))
                    con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        con.close()
        return str(path)
