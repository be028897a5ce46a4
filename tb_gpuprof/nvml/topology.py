"""GPU interconnect topology like ``nvidia-smi topo -m``, recorded once per run.

Every physical GPU of the host is listed (the ``gpu_placement`` advice needs the ones the job
does not use too); ``job`` marks the ones this process uses. Matrix cells, as nvidia-smi:
``X`` self, ``NV<n>`` n NVLinks (direct, or through NVSwitch when NVML reports NVLink P2P),
``PIX`` one PCIe switch, ``PXB`` several PCIe switches, ``PHB`` a PCIe host bridge,
``NODE`` PCIe + the interconnect between host bridges in one NUMA node, ``SYS`` across the
CPU socket interconnect (QPI/UPI/SMP).
"""

from __future__ import annotations

import os
from itertools import combinations
from typing import Any

from .backend import DeviceInfo
from .devices import select_devices
from .protocol import NvmlApi

# NVML_TOPOLOGY_* level -> nvidia-smi's label (INTERNAL: two GPUs on one board, behind one switch)
LEVEL_LABELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
LEGEND = {
    "X": "self",
    "SYS": "PCIe + the SMP interconnect between NUMA nodes (e.g. QPI/UPI)",
    "NODE": "PCIe + the interconnect between PCIe host bridges within a NUMA node",
    "PHB": "PCIe + a PCIe host bridge (typically the CPU)",
    "PXB": "multiple PCIe bridges (without traversing the PCIe host bridge)",
    "PIX": "at most a single PCIe bridge",
    "NV#": "a bonded set of # NVLinks",
}


def _bus(bus_id: str | None) -> str | None:
    """'00000000:18:00.0' and '0000:18:00.0' -> '0:18:00.0' so NVML's spellings compare."""
    if not bus_id:
        return None
    parts = bus_id.lower().split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16)}:{parts[1]}:{parts[2]}"
        except ValueError:
            pass
    return bus_id.lower()


def cpu_ranges(cpus: list[int] | None) -> str | None:
    """[0, 1, 2, 3, 8] -> '0-3,8' (nvidia-smi's CPU Affinity column)."""
    if not cpus:
        return None
    cpus = sorted(set(cpus))
    parts: list[str] = []
    start = prev = cpus[0]
    for c in cpus[1:]:
        if c != prev + 1:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = c
        prev = c
    parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)


def _link_label(backend: NvmlApi, a: DeviceInfo, b: DeviceInfo,
                links: dict[str, list[dict[str, Any]]]) -> tuple[str, int]:
    """(matrix label, NVLink count) between two physical GPUs."""
    mine = links.get(a.uuid, [])
    target = _bus(b.pci_bus_id)
    direct = sum(1 for link in mine if target and _bus(link.get("remote_bus_id")) == target)
    if direct:
        return f"NV{direct}", direct
    switched = sum(1 for link in mine if link.get("remote_type") == "switch")
    if switched and backend.p2p_nvlink(a.uuid, b.uuid):
        return f"NV{switched}", switched
    level = backend.topology_level(a.uuid, b.uuid)
    if level is None:
        return "SYS", 0
    return LEVEL_LABELS.get(level, f"L{level}"), 0


def topology_from_backend(backend: NvmlApi, job_uuids: list[str] | None = None) -> dict[str, Any]:
    """The topology dict from an initialized backend (see :func:`topology`)."""
    infos = backend.devices()
    physical = sorted((i for i in infos if i.mig_parent_uuid is None), key=lambda i: i.index)
    by_uuid = {i.uuid: i for i in infos}
    # a MIG device's interconnect is its parent's
    job = {by_uuid[u].mig_parent_uuid or u for u in (job_uuids or []) if u in by_uuid}
    links = {g.uuid: backend.nvlinks(g.uuid) for g in physical}
    n = len(physical)
    matrix = [["X"] * n for _ in range(n)]
    nvlink_counts = [[0] * n for _ in range(n)]
    for i, j in combinations(range(n), 2):
        # links are symmetric; ask from both ends since one side may not report its remote
        ab = _link_label(backend, physical[i], physical[j], links)
        ba = _link_label(backend, physical[j], physical[i], links)
        label, count = max(ab, ba, key=lambda lc: lc[1])
        matrix[i][j] = matrix[j][i] = label
        nvlink_counts[i][j] = nvlink_counts[j][i] = count
    gpus = [{"nvml_index": g.index, "uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id,
             "cpu_affinity": cpu_ranges(backend.cpu_affinity(g.uuid)),
             "numa_node": backend.numa_node(g.uuid), "nvlinks_active": len(links[g.uuid]),
             "job": g.uuid in job} for g in physical]
    return {"labels": [f"GPU{g.index}" for g in physical], "matrix": matrix,
            "nvlink_counts": nvlink_counts, "gpus": gpus,
            "job_nvml_indices": [g.index for g in physical if g.uuid in job],
            "legend": LEGEND}


def topology(devices: list[int] | None = None, *, backend: NvmlApi | None = None,
             cuda_visible_devices: str | None = None) -> dict[str, Any]:
    """Interconnect matrix, CPU affinity and NUMA node of the host's GPUs.

    ``devices``: CUDA ordinals the job uses (default: all visible). Raises
    NvmlUnavailableError (one line) when NVML cannot be used.
    """
    if backend is None:
        from .backend import NvmlBackend

        backend = NvmlBackend()
    visible = (cuda_visible_devices if cuda_visible_devices is not None
               else os.environ.get("CUDA_VISIBLE_DEVICES"))
    backend.init()
    try:
        chosen = select_devices(backend.devices(), visible, devices)
        return topology_from_backend(backend, [info.uuid for _, info in chosen])
    finally:
        backend.shutdown()


def format_matrix(topo: dict[str, Any]) -> str:
    """Text like ``nvidia-smi topo -m`` (matrix, CPU affinity, NUMA affinity, legend)."""
    labels = topo["labels"]
    head = ["", *labels, "CPU Affinity", "NUMA Affinity"]
    rows = [head]
    for label, row, g in zip(labels, topo["matrix"], topo["gpus"], strict=True):
        rows.append([label, *row, g["cpu_affinity"] or "N/A",
                     "N/A" if g["numa_node"] is None else str(g["numa_node"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["\t".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.append("")
    lines.append("Legend:")
    lines.extend(f"  {k:<4} = {v}" for k, v in topo["legend"].items())
    return "\n".join(lines) + "\n"
