"""Nsight Systems SQLite reader on exports built with the documented schema (tests/nsys_builder)."""

from __future__ import annotations

import pytest

from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.errors import EmptyProfileError
from tb_gpuprof.model import KERNEL, MEMCPY, MEMSET, STEP, USER
from tb_gpuprof.readers import load_profile
from tb_gpuprof.readers.nsys import nvtx_kind, read_nsys

from .nsys_builder import GLOBAL_TID, NVTX_MARK, NVTX_START_END, NsysExport

# Real kernel names as nsys stores them (demangledName), from cuDNN, cuBLASLt and cuBLAS.
CUDNN_FPROP = ("sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x32"
               "_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cudnn")
NVJET = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
VOLTA_SGEMM = "volta_sgemm_128x64_nn"
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")


def _training_export() -> NsysExport:
    """Three NVTX-marked iterations of conv + gemm + fill, plus copies and a sync."""
    ex = NsysExport()
    t = 1_000_000_000
    for it in range(3):
        start = t
        ex.range(t, None, "ignored mark", event_type=NVTX_MARK)
        ex.memcpy(t + 10_000, 40_000, 64 << 20, 1)
        ex.launch(t + 60_000, 300_000, CUDNN_FPROP, short="sm90_xmma_fprop_implicit_gemm",
                  grid=(132, 2, 1), block=(384, 1, 1), regs=168, static_smem=1024,
                  dyn_smem=200_000)
        ex.launch(t + 400_000, 120_000, NVJET, grid=(66, 1, 1), block=(384, 1, 1), regs=168)
        ex.launch(t + 530_000, 80_000, VOLTA_SGEMM, grid=(16, 8, 1), block=(256, 1, 1),
                  regs=128, static_smem=16_384, api="cuLaunchKernel")
        ex.launch(t + 620_000, 2_000, FILL, short="vectorized_elementwise_kernel")
        ex.memset(t + 630_000, 1_000, 4096)
        ex.api(t + 640_000, 50_000, "cudaStreamSynchronize_v3020")
        ex.range(start, t + 700_000, f"iteration {it + 1}")
        t += 1_000_000
    ex.range(1_000_000_000, t, "ProfilerStep#41", registered=True, event_type=NVTX_START_END)
    ex.range(t + 5, None, "never closed")
    return ex


@pytest.fixture()
def export(tmp_path):
    ex = _training_export()
    return ex, ex.write(tmp_path / "run.sqlite")


def test_kernels_resolve_names_and_launch_config(export):
    ex, path = export
    p = load_profile(path)
    assert p.format == "nsys"
    kernels = [a for a in p.gpu if a.kind == KERNEL]
    assert len(kernels) == len(ex.kernels)
    names = {v: k for k, v in ex.strings.items()}
    for row, k in zip(sorted(ex.kernels), kernels, strict=True):
        assert k.name == names[row[8]]  # demangledName, not the short name
        assert k.start_us == row[0] / 1000 and k.dur_us == (row[1] - row[0]) / 1000
        assert (k.device, k.stream, k.correlation) == (row[2], row[5], row[6])
        assert k.grid == tuple(row[14:17]) and k.block == tuple(row[17:20])
        assert k.registers == row[13] and k.shared_mem == row[20] + row[21]
    assert {CUDNN_FPROP, NVJET, VOLTA_SGEMM, FILL} == {k.name for k in kernels}


def test_memory_ops_runtime_and_correlation(export):
    ex, path = export
    p = read_nsys(path)
    copies = [a for a in p.gpu if a.kind == MEMCPY]
    sets = [a for a in p.gpu if a.kind == MEMSET]
    assert len(copies) == len(ex.memcpys) and len(sets) == len(ex.memsets)
    assert all(c.bytes == 64 << 20 and "HtoD" in c.name for c in copies)
    assert all(s.bytes == 4096 for s in sets)
    assert len(p.runtime) == len(ex.runtime)
    assert {r.name for r in p.runtime} == {"cudaLaunchKernel", "cuLaunchKernel",
                                           "cudaMemcpyAsync", "cudaStreamSynchronize"}
    assert all(r.tid == GLOBAL_TID & 0xFFFFFF for r in p.runtime)
    launches = {r.correlation: r for r in p.runtime}
    for act in copies + [a for a in p.gpu if a.kind == KERNEL]:
        assert launches[act.correlation].start_us < act.start_us  # launched before it ran


def test_nvtx_ranges_become_annotations_with_steps(export):
    ex, path = export
    p = read_nsys(path)
    closed = [r for r in ex.nvtx if r[1] is not None and r[2] != NVTX_MARK]
    assert len(p.annotations) == len(closed)
    iterations = [a for a in p.annotations if a.name.startswith("iteration")]
    assert [a.step for a in iterations] == [1, 2, 3]
    assert all(a.kind == USER and a.dur_us == 700.0 for a in iterations)
    (step,) = [a for a in p.annotations if a.kind == STEP]
    assert (step.name, step.step) == ("ProfilerStep#41", 41)  # registered string via textId


def test_devices_and_metadata(export):
    _, path = export
    p = read_nsys(path)
    (dev,) = p.devices
    assert (dev.id, dev.name, dev.compute_major, dev.compute_minor, dev.num_sms) == (
        0, "NVIDIA H200", 9, 0, 132)  # CUDA device 0 is nsys GPU 3 (TARGET_INFO_CUDA_DEVICE)
    assert p.metadata["nsys_version"] == "2024.6.2.225"


@pytest.mark.parametrize("tables", [
    {"CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"},
    {"CUPTI_ACTIVITY_KIND_KERNEL"},  # no StringIds: names are placeholders, nothing crashes
    {"NVTX_EVENTS"},
    {"CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds", "TARGET_INFO_GPU"},
    {"CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"},
])
def test_each_table_is_optional(tables, tmp_path):
    ex = _training_export()
    p = read_nsys(ex.write(tmp_path / "part.sqlite", tables=tables))
    assert (len(p.kernels) > 0) == ("CUPTI_ACTIVITY_KIND_KERNEL" in tables)
    assert (len(p.runtime) > 0) == ("CUPTI_ACTIVITY_KIND_RUNTIME" in tables)
    assert (len(p.annotations) > 0) == ("NVTX_EVENTS" in tables)
    assert (len(p.devices) > 0) == ("TARGET_INFO_GPU" in tables)
    if "StringIds" not in tables:
        assert all(k.name.startswith("<kernel ") for k in p.kernels)


def test_export_without_activity_is_empty(tmp_path):
    path = NsysExport().write(tmp_path / "idle.sqlite")
    with pytest.raises(EmptyProfileError, match="nsys profile"):
        load_profile(path)


@pytest.mark.parametrize("name,step", [
    ("iteration 12", 12), ("train_step_7", 7), ("Batch#3", 3), ("iter=4", 4),
    ("ProfilerStep#9", 9), ("aten::conv2d, seq = 12", None), ("substep 3", None),
    ("epoch 2", None), ("forward", None),
])
def test_nvtx_iteration_numbers(name, step):
    assert nvtx_kind(name)[1] == step


def _loop_export(iterations: int) -> NsysExport:
    ex = NsysExport()
    t = 1_000_000
    for i in range(iterations):
        ex.range(t, t + 900_000, f"iteration {i}")
        ex.memcpy(t + 10_000, 20_000, 4 << 20, 1)
        for k in range(6):
            ex.launch(t + 40_000 + k * 120_000, 100_000, VOLTA_SGEMM, grid=(16, 8, 1),
                      block=(256, 1, 1), regs=128)
        t += 1_000_000
    return ex


def test_a_large_export_is_read_in_a_window_of_whole_iterations(tmp_path):
    path = _loop_export(40).write(tmp_path / "loop.sqlite")
    whole = read_nsys(path, max_rows=None)
    rows = len(whole.gpu) + len(whole.runtime) + len(whole.annotations)
    assert "read_window" not in whole.metadata and len(whole.annotations) == 40
    part = read_nsys(path, max_rows=rows // 4)
    window = part.metadata["read_window"]
    assert window["rows_in_export"] == rows and window["max_rows"] == rows // 4
    end = window["end_us"]
    # about a quarter of the iterations, each one whole: its range and all its work
    assert 5 <= len(part.annotations) <= 11
    assert all(a.start_us + a.dur_us <= end for a in part.annotations)
    assert all(g.start_us < end for g in part.gpu) and all(r.start_us < end
                                                           for r in part.runtime)
    last = max(a.start_us + a.dur_us for a in part.annotations)
    assert [g for g in whole.gpu if g.start_us < last] == [g for g in part.gpu
                                                            if g.start_us < last]
    assert len(part.gpu) == 7 * len(part.annotations)  # no iteration cut in the middle
    rep = build_report(part)
    assert rep["iterations"]["count"] == len(part.annotations)
    assert any("bounded memory" in w and "max_rows=None" in w for w in rep["warnings"])
    assert not any("bounded memory" in w for w in build_report(whole)["warnings"])
