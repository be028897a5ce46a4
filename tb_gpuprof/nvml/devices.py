"""Which NVML devices this process uses: CUDA_VISIBLE_DEVICES mapped onto NVML's device list.

CUDA accepts, comma-separated: integer indices, ``GPU-<uuid>`` (any unique prefix), ``MIG-<uuid>``
and the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``; it stops at the first entry it cannot resolve.
Integer indices are NVML's (PCI bus) order, which is CUDA's when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
and, on the usual single-model nodes, also under CUDA's default fastest-first order.
The position in the resulting list is the CUDA ordinal (``cuda:<i>``), the ``gpu<i>`` of the tags.
"""

from __future__ import annotations

from .backend import DeviceInfo, NvmlUnavailableError


def _match_uuid(token: str, infos: list[DeviceInfo]) -> DeviceInfo | None:
    if token.startswith("MIG-GPU-"):  # MIG-GPU-<uuid>/<gi>/<ci> (CUDA 11.0-11.x drivers)
        parts = token[len("MIG-"):].split("/")
        if len(parts) >= 2 and parts[1].isdigit():
            for info in infos:
                if (info.mig_parent_uuid == parts[0]
                        and info.gpu_instance_id == int(parts[1])):
                    return info
        return None
    hits = [i for i in infos if i.uuid.lower().startswith(token.lower())]
    return hits[0] if len(hits) == 1 else None


def visible_devices(infos: list[DeviceInfo], cuda_visible: str | None) -> list[DeviceInfo]:
    """The devices CUDA would expose, in CUDA ordinal order."""
    physical = sorted((i for i in infos if i.mig_parent_uuid is None), key=lambda i: i.index)
    if cuda_visible is None:
        return physical
    out: list[DeviceInfo] = []
    for raw in cuda_visible.split(","):
        token = raw.strip()
        if token.lstrip("-").isdigit():
            index = int(token)
            found = next((i for i in physical if i.index == index), None)
        elif token.startswith(("GPU-", "MIG-")):
            found = _match_uuid(token, infos)
        else:
            found = None
        if found is None or found in out:
            break  # CUDA ignores this entry and every one after it
        out.append(found)
    return out


def select_devices(infos: list[DeviceInfo], cuda_visible: str | None,
                   wanted: list[int] | None) -> list[tuple[int, DeviceInfo]]:
    """(CUDA ordinal, device) pairs to sample; ``wanted`` picks CUDA ordinals.

    Raises NvmlUnavailableError with one line when nothing (or a missing ordinal) is asked for.
    """
    visible = visible_devices(infos, cuda_visible)
    if not visible:
        where = f"CUDA_VISIBLE_DEVICES={cuda_visible!r}" if cuda_visible is not None else "NVML"
        raise NvmlUnavailableError(f"no GPU visible to this process ({where})")
    if wanted is None:
        return list(enumerate(visible))
    missing = [w for w in wanted if not 0 <= w < len(visible)]
    if missing:
        raise NvmlUnavailableError(
            f"GPU {missing[0]} requested but this process sees {len(visible)} GPU(s)")
    return [(w, visible[w]) for w in dict.fromkeys(wanted)]
