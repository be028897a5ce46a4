"""CUDA_VISIBLE_DEVICES -> NVML devices, and topology over a fake multi-GPU host."""

from __future__ import annotations

import pytest

from tb_gpuprof.nvml import NvmlSampler, NvmlUnavailableError, topology
from tb_gpuprof.nvml.backend import DeviceInfo
from tb_gpuprof.nvml.devices import select_devices, visible_devices
from tb_gpuprof.nvml.topology import cpu_ranges, format_matrix
from tests.nvml_fake import FakeGpu, FakeNvml

INFOS = [
    DeviceInfo(index=0, uuid="GPU-0a1b2c3d-0000", name="H200", pci_bus_id="00000000:18:00.0"),
    DeviceInfo(index=1, uuid="GPU-0a1bffff-1111", name="H200", pci_bus_id="00000000:2A:00.0"),
    DeviceInfo(index=2, uuid="GPU-9e8d7c6b-2222", name="H200", pci_bus_id="00000000:3A:00.0"),
    DeviceInfo(index=2, uuid="MIG-5555aaaa-0001", name="H200 MIG",
               mig_parent_uuid="GPU-9e8d7c6b-2222", mig_index=0, gpu_instance_id=7),
]


def uuids(cvd: str | None) -> list[str]:
    return [i.uuid for i in visible_devices(INFOS, cvd)]


def test_unset_means_every_physical_gpu_in_nvml_order() -> None:
    assert uuids(None) == [INFOS[0].uuid, INFOS[1].uuid, INFOS[2].uuid]


def test_indices_reorder_and_the_list_position_is_the_cuda_ordinal() -> None:
    assert uuids("2,0") == [INFOS[2].uuid, INFOS[0].uuid]
    chosen = select_devices(INFOS, "2,0", [1])
    assert [(gpu, info.index) for gpu, info in chosen] == [(1, 0)]


def test_uuid_prefixes_must_be_unique() -> None:
    assert uuids("GPU-9e8d") == [INFOS[2].uuid]
    assert uuids("GPU-0a1bf,GPU-0a1b2") == [INFOS[1].uuid, INFOS[0].uuid]
    assert uuids("GPU-0a1b") == []  # ambiguous: CUDA rejects it


def test_mig_uuids_both_spellings() -> None:
    assert uuids("MIG-5555aaaa-0001") == [INFOS[3].uuid]
    assert uuids("MIG-GPU-9e8d7c6b-2222/7/0") == [INFOS[3].uuid]
    assert uuids("MIG-GPU-9e8d7c6b-2222/3/0") == []


def test_cuda_stops_at_the_first_bad_entry() -> None:
    assert uuids("1,7,0") == [INFOS[1].uuid]
    assert uuids("0,-1,2") == [INFOS[0].uuid]
    assert uuids("0,0") == [INFOS[0].uuid]
    assert uuids("") == []
    assert uuids("0, 2") == [INFOS[0].uuid, INFOS[2].uuid]


def test_nothing_visible_or_missing_ordinal_raise_one_line() -> None:
    with pytest.raises(NvmlUnavailableError, match="CUDA_VISIBLE_DEVICES='-1'"):
        select_devices(INFOS, "-1", None)
    with pytest.raises(NvmlUnavailableError, match="GPU 2 requested but this process sees 2"):
        select_devices(INFOS, "0,1", [0, 2])


def test_cpu_ranges() -> None:
    assert cpu_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert cpu_ranges([5]) == "5"
    assert cpu_ranges([]) is None


@pytest.fixture
def four_gpu_host(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """GPU0<->GPU1 and GPU2<->GPU3 joined by 4 NVLinks each; other pairs over the SMP link."""
    bus = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0", "00000000:AB:00.0"]
    peers = {0: 1, 1: 0, 2: 3, 3: 2}
    gpus = [FakeGpu(f"GPU-{i}{i}{i}{i}", bus[i], nvlink_peers=[bus[peers[i]]] * 4)
            for i in range(4)]
    nvml = FakeNvml(gpus)
    nvml.install(monkeypatch)
    return nvml


def test_topology_matrix_like_nvidia_smi(four_gpu_host) -> None:
    topo = topology(cuda_visible_devices="1,2")
    assert topo["labels"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo["matrix"][0] == ["X", "NV4", "SYS", "SYS"]
    assert topo["matrix"][3] == ["SYS", "SYS", "NV4", "X"]
    assert all(topo["matrix"][i][j] == topo["matrix"][j][i] for i in range(4) for j in range(4))
    assert topo["job_nvml_indices"] == [1, 2]
    assert [g["job"] for g in topo["gpus"]] == [False, True, True, False]
    assert topo["gpus"][0]["cpu_affinity"] == "0-3"
    text = format_matrix(topo)
    assert text.splitlines()[1].split()[:5] == ["GPU0", "X", "NV4", "SYS", "SYS"]
    assert "NV#" in text


def test_topology_job_subset_by_ordinal(four_gpu_host) -> None:
    assert topology([0], cuda_visible_devices="3,2")["job_nvml_indices"] == [3]


def test_sampler_reports_only_the_visible_gpus(four_gpu_host) -> None:
    sampler = NvmlSampler(cuda_visible_devices="3,1", gpm=False)
    assert sampler.open()
    assert [(gpu, info.index) for gpu, info in sampler.devices] == [(0, 3), (1, 1)]
    scalars = sampler.scalars(sampler.sample_once())
    assert {k.split("/")[0] for k in scalars} == {"gpu0", "gpu1"}
    sampler.stop()
