"""XPlane reader on the real JAX/H200 fixture, on TF-written profiles, on synthetic edge cases,
and on bad input. Expected values come from an independent walk of the protobuf written here,
from facts about the recording (fixtures/README.md) and the hardware, never from reader output."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tb_gpuprof.errors import EmptyProfileError, TraceReadError, UnknownFormatError
from tb_gpuprof.model import KERNEL, MEMCPY, MEMSET, STEP, USER
from tb_gpuprof.readers import load_profile
from tb_gpuprof.readers.xplane import parse_kernel_details, read_xplane
from tests import xplane_builder as xb

REPO = Path(__file__).resolve().parents[1]
# Copies of the shared H200 fixtures live in tests/data (tests/data/h200/README.md).
FIXTURE = Path(os.environ.get("TB_GPUPROF_FIXTURES", REPO / "tests" / "data")) / (
    "jax_conv_h200.xplane.pb")
# jax.profiler on the H200, StepTraceAnnotation("train", step_num=5..8): tests/data/h200/README.md
JAX_STEPS = REPO / "tests" / "data" / "jax_steps_h200.xplane.pb"
needs_fixture = pytest.mark.skipif(not FIXTURE.exists(), reason=f"fixture {FIXTURE} not present")


# -- an independent, deliberately simple protobuf walk (recursive, dict-of-lists) ---------------
def _uvarint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _msg(buf: bytes) -> dict[int, list]:
    out: dict[int, list] = {}
    i = 0
    while i < len(buf):
        k, i = _uvarint(buf, i)
        wire = k & 7
        if wire == 0:
            v, i = _uvarint(buf, i)
        elif wire == 2:
            n, i = _uvarint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        else:
            v, i = buf[i:i + 4], i + 4
        out.setdefault(k >> 3, []).append(v)
    return out


def _walk_planes(data: bytes) -> list[dict]:
    """Per plane: name, stat names, and per line (name, [event: (name, {stat: value})])."""
    planes = []
    for raw in _msg(data).get(1, []):
        p = _msg(raw)
        stat_names = {}
        for entry in p.get(5, []):
            md = _msg(_msg(entry)[2][0])
            stat_names[md[1][0]] = md.get(2, [b""])[0].decode()
        event_names = {}
        for entry in p.get(4, []):
            md = _msg(_msg(entry)[2][0])
            event_names[md[1][0]] = md.get(2, [b""])[0].decode()

        def stats(ev: dict, names=stat_names) -> dict:
            out = {}
            for s in ev.get(4, []):
                st = _msg(s)
                name = names.get(st[1][0], "")
                if 7 in st:
                    out[name] = names[st[7][0]]
                elif 5 in st:
                    out[name] = st[5][0].decode()
                else:
                    out[name] = next((st[f][0] for f in (3, 4) if f in st), None)
            return out

        lines = []
        for raw_line in p.get(3, []):
            ln = _msg(raw_line)
            events = [_msg(e) for e in ln.get(4, [])]
            lines.append((ln.get(2, [b""])[0].decode(),
                          [(event_names[e[1][0]], stats(e)) for e in events]))
        planes.append({"name": p.get(2, [b""])[0].decode(), "lines": lines,
                       "stats": stats({4: p.get(6, [])})})
    return planes


@pytest.fixture(scope="module")
def jax_profile():
    return read_xplane(FIXTURE)


@pytest.fixture(scope="module")
def jax_walk():
    return _walk_planes(FIXTURE.read_bytes())


# -- real GPU profiles: the fixture, plus any recorded ones named in TB_GPUPROF_EXTRA_XPLANES --
REAL_GPU_XPLANES = [FIXTURE, JAX_STEPS] + [Path(p) for p in os.environ.get(
    "TB_GPUPROF_EXTRA_XPLANES", "").split(os.pathsep) if p]


@pytest.mark.parametrize("path", REAL_GPU_XPLANES, ids=lambda p: p.name)
def test_real_gpu_profile_matches_independent_walk(path):
    if not path.exists():
        pytest.skip(f"{path} not present")
    walk = _walk_planes(path.read_bytes())
    profile = read_xplane(path)
    expected: dict[tuple[int, int], int] = {}
    for plane in walk:
        m = re.match(r"/device:GPU:(\d+)$", plane["name"])
        for line_name, events in plane["lines"] if m else []:
            s = re.match(r"Stream #(\d+)", line_name)
            if s:
                expected[(int(m[1]), int(s[1]))] = len([
                    1 for _n, st in events
                    if not any(k.lower().startswith(("memalloc", "memfree", "memoryresidency"))
                               for k in st)])
    assert expected, "the walk found no GPU stream lines"
    got: dict[tuple[int, int], int] = {}
    for a in profile.gpu:
        got[(a.device, a.stream)] = got.get((a.device, a.stream), 0) + 1
    assert got == expected
    assert {d.id for d in profile.devices} >= {dev for dev, _s in expected}
    # host and device share one clock: a launch (runtime call, same correlation id) comes
    # before its kernel, and each stream starts work in launch order (ends may overlap:
    # Hopper's programmatic dependent launch lets the next kernel start early)
    launches = {r.correlation: r for r in profile.runtime if r.correlation is not None}
    linked = [a for a in profile.gpu if a.correlation in launches]
    assert len(linked) >= 0.9 * len(profile.gpu)
    for a in linked:
        assert launches[a.correlation].start_us <= a.start_us
    for key in expected:
        on_stream = [a.correlation for a in profile.gpu
                     if (a.device, a.stream) == key and a.correlation in launches]
        assert on_stream == sorted(on_stream, key=lambda c: launches[c].start_us)


# -- the real JAX fixture -------------------------------------------------------------------------
@needs_fixture
def test_fixture_kinds_and_launch_parameters(jax_profile, jax_walk):
    gpu_events = [ev for p in jax_walk if p["name"].startswith("/device:GPU:")
                  for name, evs in p["lines"] if name.startswith("Stream #") for ev in evs]
    with_details = [st["kernel_details"] for _n, st in gpu_events if "kernel_details" in st]
    memsets = [st for _n, st in gpu_events if "Memset_details" in st]
    kernels = [a for a in jax_profile.gpu if a.kind == KERNEL]
    assert len(kernels) == len(with_details)
    assert len([a for a in jax_profile.gpu if a.kind == MEMSET]) == len(memsets)
    for a, details in zip(kernels, with_details, strict=True):  # both in stream time order
        grid = tuple(int(x) for x in re.search(r"grid:(\d+),(\d+),(\d+)", details).groups())
        block = tuple(int(x) for x in re.search(r"block:(\d+),(\d+),(\d+)", details).groups())
        assert (a.grid, a.block) == (grid, block)
        assert 1 <= block[0] * block[1] * block[2] <= 1024  # CUDA's limit per block
        assert 1 <= a.registers <= 255
        assert 0 < a.occupancy <= 100
    for a in jax_profile.gpu:
        if a.kind == MEMSET:
            want = re.search(r"num_bytes:(\d+)", memsets[0]["Memset_details"])[1]
            assert a.bytes == int(want)


@needs_fixture
def test_fixture_fp32_and_bf16_convs_and_their_ops(jax_profile):
    # README: 3 repetitions each of a jitted fp32 and bf16 NHWC conv + relu + small matmul
    convs = [a for a in jax_profile.kernels if "fprop" in a.name]
    bf16 = [a for a in convs if "bf16" in a.name]
    fp32 = [a for a in convs if "f32f32" in a.name]
    assert len(bf16) == 3 and len(fp32) == 3
    assert all("nhwc" in a.name for a in convs)
    assert all("conv" in (a.op_type or "") for a in convs), [a.op_type for a in convs]
    gemms = [a for a in jax_profile.kernels if a.name.startswith("gemm_fusion_dot")]
    assert len(gemms) == 6
    assert all("dot" in (a.op_type or "") and a.op for a in gemms)


@needs_fixture
def test_fixture_times_inside_the_profile_window(jax_profile, jax_walk):
    assert all(a.correlation is not None for a in jax_profile.gpu)
    env = next(p for p in jax_walk if p["name"] == "Task Environment")["stats"]
    window_us = (env["profile_stop_time"] - env["profile_start_time"]) / 1e3
    for seq in (jax_profile.gpu, jax_profile.runtime, jax_profile.annotations):
        assert all(0 <= e.start_us and e.start_us + e.dur_us <= window_us for e in seq)


@needs_fixture
def test_fixture_device_and_metadata(jax_profile, jax_walk):
    (dev,) = jax_profile.devices
    assert "H200" in dev.name
    assert (dev.compute_major, dev.compute_minor) == (9, 0)  # Hopper
    assert dev.num_sms == 132  # H200 SXM
    assert 130 * 2**30 < dev.total_memory < 150 * 2**30
    md = jax_profile.metadata
    hostnames = [h.decode() for h in _msg(FIXTURE.read_bytes()).get(4, [])]
    assert md["hostnames"] == hostnames
    assert (md["framework"], md["framework_version"]) == ("jax", "0.11.2")  # README
    assert md["cuda_runtime"] == "13.0"  # README: CUDA 13.0


@needs_fixture
def test_fixture_steps_only_where_the_trace_marks_them(jax_profile, jax_walk):
    marked = [st for p in jax_walk if p["name"] == "/host:CPU" for _ln, evs in p["lines"]
              for _n, st in evs if "step_num" in st]
    assert len([a for a in jax_profile.annotations if a.kind == STEP]) == len(marked)
    assert any(a.kind == USER and a.name.startswith("PjitFunction") for a in
               jax_profile.annotations)
    assert not any(a.name.startswith("$") for a in jax_profile.annotations)  # python frames


@needs_fixture
def test_reading_never_imports_frameworks():
    code = textwrap.dedent(f"""
        import sys
        from tb_gpuprof.readers import load_profile
        p = load_profile({str(FIXTURE)!r})
        assert p.gpu
        bad = [m for m in ("tensorflow", "jax", "torch", "keras", "xprof") if m in sys.modules]
        from google.protobuf.internal import api_implementation
        print("LOADED", bad, api_implementation.Type())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "LOADED [] upb" in out.stdout  # protobuf's C decoder, not its pure-Python one


@needs_fixture
def test_mutated_fixture_never_hangs_or_crashes(tmp_path):
    data = FIXTURE.read_bytes()
    rng = random.Random(42)
    ok = failed = 0
    for i in range(60):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] = rng.getrandbits(8)
        f = tmp_path / f"m{i}.xplane.pb"
        f.write_bytes(bytes(buf))
        try:
            read_xplane(f)
            ok += 1
        except TraceReadError as e:
            assert str(f) in str(e) and "\n" not in str(e)
            failed += 1
    assert ok + failed == 60


# -- bad input ------------------------------------------------------------------------------------
def _expect_error(path: Path, cls: type[TraceReadError] = TraceReadError) -> str:
    for reader in (read_xplane, load_profile):
        with pytest.raises(cls) as info:
            reader(path)
        msg = str(info.value)
        assert str(path) in msg and "\n" not in msg
    return msg


def test_empty_file(tmp_path):
    f = tmp_path / "empty.xplane.pb"
    f.write_bytes(b"")
    assert "empty" in _expect_error(f)


def test_missing_file(tmp_path):
    assert "no such file" in _expect_error(tmp_path / "nope.xplane.pb")


@pytest.mark.parametrize("seed", range(5))
def test_garbage_bytes(tmp_path, seed):
    rng = random.Random(seed)
    f = tmp_path / "garbage.xplane.pb"
    f.write_bytes(b"\x0a" + bytes(rng.getrandbits(8) for _ in range(4096)))
    _expect_error(f)


def test_text_file_named_like_xplane(tmp_path):
    f = tmp_path / "notes.xplane.pb"
    f.write_text("this is not a profile\n" * 20)
    _expect_error(f)


@needs_fixture
@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999, -1, 37])
def test_truncated_fixture(tmp_path, keep):
    data = FIXTURE.read_bytes()
    # cut strictly inside a plane: a cut on a plane boundary would be a valid, smaller XSpace
    boundaries, i = {0}, 0
    while i < len(data):
        _k, i = _uvarint(data, i)
        n, i = _uvarint(data, i)
        i += n
        boundaries.add(i)
    cut = len(data) + keep if isinstance(keep, int) and keep < 0 else (
        keep if isinstance(keep, int) else int(len(data) * keep))
    while cut in boundaries:
        cut -= 1
    f = tmp_path / "cut.xplane.pb"
    f.write_bytes(data[:cut])
    assert "truncated" in _expect_error(f)


def test_valid_protobuf_that_is_not_an_xspace(tmp_path):
    descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
    cases = {
        "varint_field1": xb.f_varint(1, 150),
        "field_descriptor": descriptor_pb2.FieldDescriptorProto(number=5, type=9)
        .SerializeToString(),
        "file_descriptor": descriptor_pb2.FileDescriptorProto(name="model.proto", package="m")
        .SerializeToString(),
    }
    for name, data in cases.items():
        f = tmp_path / f"{name}.xplane.pb"
        f.write_bytes(data)
        assert "not an XPlane" in _expect_error(f, UnknownFormatError)


def test_xspace_without_activity_is_empty(tmp_path):
    host = xb.PlaneBuilder("/host:CPU")
    host.line(1, "python", 0, [])
    f = tmp_path / "quiet.xplane.pb"
    f.write_bytes(xb.xspace([host]))
    _expect_error(f, EmptyProfileError)


# -- synthetic edge cases --------------------------------------------------------------------------
def _write(tmp_path: Path, planes: list[xb.PlaneBuilder], name="synthetic.xplane.pb") -> Path:
    f = tmp_path / name
    f.write_bytes(xb.xspace(planes))
    return f


def test_tf_style_gpu_plane(tmp_path):
    gpu = xb.PlaneBuilder("/device:GPU:1", id=2)
    gpu.add_plane_stat("gpu_device_name", "NVIDIA A100-SXM4-80GB")
    gpu.add_plane_stat("compute_cap_major", 8)
    gpu.add_plane_stat("compute_cap_minor", 0)
    gpu.add_plane_stat("core_count", 108)
    gpu.add_plane_stat("memory_size", 80 * 2**30, unsigned=True)
    conv = gpu.event("sm80_xmma_fprop_implicit_gemm_tf32f32", 2_000_000, 500_000, [
        gpu.stat("correlation_id", 41),
        gpu.stat("kernel_details", "regs:128 static_shared:1024 dynamic_shared:48128 "
                 "grid:54,2,1 block:256,1,1 occ_pct:25", as_ref=True),
        gpu.stat("tf_op", "model/conv2d/Conv2D:Conv2D", as_ref=True),
    ])
    copy = gpu.event("MemcpyH2D", 0, 1_000_000, [
        gpu.stat("correlation_id", 40),
        gpu.stat("memcpy_details", "kind_src:pageable kind_dst:device size:4096 dest:1 async:0"),
    ])
    # launch parameters as separate stats, no op stats: the "XLA Ops" line names it
    fused = gpu.event("loop_add_fusion", 3_000_000, 200_000, [
        gpu.stat("correlation_id", 42), gpu.stat("grid_x", 12), gpu.stat("block_x", 128),
        gpu.stat("registers_per_thread", 32), gpu.stat("negative_probe", -5),
    ], canonical=False)
    matmul = gpu.event("ampere_sgemm_64x64_nn", 3_300_000, 100_000, [
        gpu.stat("tf_op", "train_step::model/dense/MatMul:MatMul", as_ref=True)])
    gpu.line(7, "Stream #7(Compute)", 1_000, [copy, conv, fused, matmul], events_first=True)
    gpu.line(1000, "XLA Ops", 1_000, [gpu.event("add.3", 2_900_000, 400_000)])
    gpu.line(1001, "XLA Modules", 1_000, [gpu.event("jit_step", 0, 4_000_000)])
    gpu.line(1002, "Steps", 1_000, [gpu.event("17", 0, 4_000_000)])
    p = read_xplane(_write(tmp_path, [gpu]))
    assert [(a.kind, a.device, a.stream) for a in p.gpu] == [(MEMCPY, 1, 7), (KERNEL, 1, 7),
                                                            (KERNEL, 1, 7), (KERNEL, 1, 7)]
    cp, cv, fu, mm = p.gpu
    assert (mm.op, mm.op_type, mm.correlation) == ("model/dense/MatMul", "MatMul", None)
    assert cp.bytes == 4096 and cp.correlation == 40
    assert (cv.start_us, cv.dur_us) == (1 + 2.0, 0.5)  # 1000 ns line base + 2 us offset
    assert (cv.grid, cv.block, cv.registers, cv.shared_mem, cv.occupancy) == (
        (54, 2, 1), (256, 1, 1), 128, 1024 + 48128, 25.0)
    assert (cv.op, cv.op_type) == ("model/conv2d/Conv2D", "Conv2D")
    assert cv.blocks_per_sm == pytest.approx(108 / 108)
    assert (fu.grid, fu.block, fu.registers) == ((12, 1, 1), (128, 1, 1), 32)
    assert (fu.op, fu.op_type) == ("add.3", "add")
    (dev,) = p.devices
    assert (dev.id, dev.name, dev.compute_major, dev.num_sms, dev.total_memory) == (
        1, "NVIDIA A100-SXM4-80GB", 8, 108, 80 * 2**30)
    steps = [a for a in p.annotations if a.kind == STEP]
    assert [(a.step, a.on_gpu) for a in steps] == [(17, True)]  # no host steps: GPU's count
    assert "XLA Modules" in p.metadata["skipped_gpu_lines"]


def test_host_plane_steps_ops_runtime(tmp_path):
    host = xb.PlaneBuilder("/host:CPU", id=1)
    events = [
        host.event("ProfilerStep#3", 0, 10_000_000),
        host.event("Profiled batch 5", 10_000_000, 10_000_000),
        host.event("train", 20_000_000, 10_000_000, [host.stat("step_num", 7),
                                                     host.stat("_r", 1)]),
        host.event("train_function", 21_000_000, 8_000_000),  # explicit markers exist: USER
        host.event("EagerExecute", 21_500_000, 100_000),
        host.event("sequential/dense/MatMul:MatMul", 22_000_000, 1_000_000),
        host.event("cudaLaunchKernel", 22_100_000, 5_000, [host.stat("correlation_id", 9)]),
        host.event("$train.py:12 step", 22_000_000, 3_000_000),
        host.event("MemoryAllocation", 22_200_000, 0),
    ]
    host.line(77, "python", 0, events)
    cupti = xb.PlaneBuilder("/host:CUPTI", id=3)
    cupti.line(78, "cupti thread", 0, [cupti.event("cuMemcpyHtoDAsync_v2", 5_000_000, 7_000,
                                                   [cupti.stat("correlation_id", 11)])])
    p = read_xplane(_write(tmp_path, [host, cupti]))
    steps = [(a.name, a.step) for a in p.annotations if a.kind == STEP]
    assert steps == [("ProfilerStep#3", 3), ("Profiled batch 5", 5), ("train", 7)]
    assert [(o.name, o.tid) for o in p.cpu_ops] == [("sequential/dense/MatMul:MatMul", 77)]
    assert [(r.name, r.correlation) for r in p.runtime] == [("cuMemcpyHtoDAsync_v2", 11),
                                                            ("cudaLaunchKernel", 9)]
    names = {a.name for a in p.annotations}
    assert "train_function" in names and "MemoryAllocation" not in names
    assert not any(n.startswith("$") for n in names)
    assert p.gpu == [] and p.metadata["framework"] == "tensorflow"


def test_weak_step_functions_when_nothing_else_marks_steps(tmp_path):
    host = xb.PlaneBuilder("/host:CPU")
    host.line(1, "python", 0, [host.event("__inference_train_function_812", i * 5_000_000,
                                          4_000_000) for i in range(4)]
              + [host.event("one_step_on_iterator", 1_000_000, 1_000_000)])
    p = read_xplane(_write(tmp_path, [host]))
    steps = [a for a in p.annotations if a.kind == STEP]
    assert len(steps) == 4 and all(a.name.startswith("__inference_train") for a in steps)
    assert p.metadata["step_marker"] == "train_function"


def test_aggregated_events_and_unknown_fields_are_skipped(tmp_path):
    gpu = xb.PlaneBuilder("/device:GPU:0")
    timed = gpu.event("k", 1_000_000, 1_000_000) + xb.f_varint(99, 1)  # unknown field 99
    aggregated = xb.f_varint(1, gpu.event_id("k")) + xb.f_varint(5, 12) + xb.f_varint(3, 9)
    gpu.line(3, "Stream #3", 0, [timed, aggregated])
    f = tmp_path / "agg.xplane.pb"
    f.write_bytes(xb.xspace([gpu]) + xb.f_bytes(42, b"future field") + xb.f_fixed64(43, 1))
    p = read_xplane(f)
    assert [(a.name, a.stream, a.start_us) for a in p.gpu] == [("k", 3, 1.0)]


def test_parse_kernel_details_formats():
    assert parse_kernel_details("regs:32 static_shared:0 dynamic_shared:0 grid:1,2,3 "
                                "block:32,1,1") == ((1, 2, 3), (32, 1, 1), 32, 0, None)
    assert parse_kernel_details("") == (None, None, None, None, None)
    assert parse_kernel_details("regs:x grid:bad occ_pct:?") == (None, None, None, None, None)


# -- profiles written by TensorFlow itself (CPU) -------------------------------------------------
_TF_SCRIPT = r"""
import glob, json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import keras

out = sys.argv[1]
def model():
    m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3),
                          keras.layers.Flatten(), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse")
    return m
x = np.random.rand(32, 8, 8, 3).astype("float32")
y = np.random.rand(32, 2).astype("float32")

m = model()
m.train_on_batch(x[:8], y[:8])  # build the step function before profiling
custom = os.path.join(out, "custom")
steps = [10, 11, 12]
tf.profiler.experimental.start(custom)
for s in steps:  # the custom-loop annotation TF documents
    with tf.profiler.experimental.Trace("train", step_num=s, _r=1):
        m.train_on_batch(x[:8], y[:8])
tf.profiler.experimental.stop()

class Seen(keras.callbacks.Callback):  # which batch indices the callback profiles
    def __init__(self):
        super().__init__()
        self.n, self.batches = 0, []
    def on_train_batch_begin(self, batch, logs=None):
        self.n += 1
        if 2 <= self.n <= 3:
            self.batches.append(batch)
seen = Seen()
kdir = os.path.join(out, "keras")
model().fit(x, y, batch_size=8, epochs=1, verbose=0,
            callbacks=[seen, keras.callbacks.TensorBoard(log_dir=kdir, profile_batch=(2, 3))])
find = lambda d: glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
print(json.dumps({"custom": find(custom), "custom_steps": steps,
                  "keras": find(kdir), "keras_batches": seen.batches}))
"""


def _tensorflow_importable() -> bool:
    return importlib.util.find_spec("tensorflow") is not None


@pytest.fixture(scope="module")
def tf_profiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("tfprof")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run([sys.executable, "-c", _TF_SCRIPT, str(out)], capture_output=True,
                         text=True, timeout=540, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not _tensorflow_importable(), reason="tensorflow is not installed")
def test_tensorflow_custom_loop_profile(tf_profiles):
    """A CPU-only TF profile: no GPU activity; the Trace(step_num=) ranges become STEP
    annotations with those numbers; executed TF ops become CpuOp named ``name:Type``;
    executor/eager ranges become USER annotations."""
    (path,) = tf_profiles["custom"]
    p = read_xplane(path)
    assert p.gpu == [] and p.devices == []
    steps = [a for a in p.annotations if a.kind == STEP]
    assert [a.step for a in steps] == tf_profiles["custom_steps"]
    assert all(a.name == "train" and a.dur_us > 0 for a in steps)
    types = {o.name.rsplit(":", 1)[1] for o in p.cpu_ops}
    assert any("Conv2D" in t for t in types) and any("MatMul" in t for t in types)
    first, last = steps[0], steps[-1]  # the model's ops ran inside the profiled steps
    assert all(first.start_us <= o.start_us <= last.start_us + last.dur_us for o in p.cpu_ops
               if "Conv2D" in o.name)
    assert p.metadata["framework"] == "tensorflow"


@pytest.mark.slow
@pytest.mark.skipif(not _tensorflow_importable(), reason="tensorflow is not installed")
def test_keras_tensorboard_callback_profile(tf_profiles):
    (path,) = tf_profiles["keras"]
    p = read_xplane(path)
    steps = [a for a in p.annotations if a.kind == STEP]
    assert [a.step for a in steps] == tf_profiles["keras_batches"]
    assert all(a.name == "Profiled batch" for a in steps)
    assert p.gpu == [] and p.cpu_ops


# -- a profile written by JAX itself (CPU) --------------------------------------------------------
_JAX_SCRIPT = r"""
import glob, json, os, sys
import jax, jax.numpy as jnp
out = sys.argv[1]
x = jnp.ones((8, 16, 16, 4), jnp.float32)
w = jnp.ones((3, 3, 4, 8), jnp.float32)
f = jax.jit(lambda x, w: jax.nn.relu(jax.lax.conv_general_dilated(
    x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))))
f(x, w).block_until_ready()
steps = [5, 6, 7]
jax.profiler.start_trace(out)
for s in steps:
    with jax.profiler.StepTraceAnnotation("train", step_num=s):
        f(x, w).block_until_ready()
jax.profiler.stop_trace()
print(json.dumps({"paths": glob.glob(os.path.join(out, "**", "*.xplane.pb"), recursive=True),
                  "steps": steps, "version": jax.__version__}))
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_jax_step_trace_annotation_profile(tmp_path):
    """JAX on CPU: StepTraceAnnotation(step_num=) ranges become numbered STEP annotations."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", _JAX_SCRIPT, str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    info = json.loads(run.stdout.strip().splitlines()[-1])
    (path,) = info["paths"]
    p = read_xplane(path)
    steps = [a for a in p.annotations if a.kind == STEP]
    assert [(a.name, a.step) for a in steps] == [("train", s) for s in info["steps"]]
    assert p.gpu == []
    assert p.metadata["framework"] == "jax"
    assert p.metadata["framework_version"] == info["version"]


def test_real_gpu_step_annotations_number_the_iterations():
    from tb_gpuprof.analysis.report import build_report

    profile = read_xplane(JAX_STEPS)
    steps = sorted(a.step for a in profile.annotations if a.kind == STEP and not a.on_gpu)
    assert steps == [5, 6, 7, 8]  # what the recorder annotated (tests/data/h200/README.md)
    rep = build_report(profile)
    assert rep["iterations"]["method"] == "profiler_step"
    assert rep["iterations"]["range"] == [5, 8]
    assert any(k["uses_tensor_cores"] and k["category"] == "conv" for k in rep["kernels"])
