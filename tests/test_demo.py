"""`tb-gpuprof demo` and the demo training scripts, run as a user runs them (subprocesses).

The live runs use the demo's tiny setting (TB_GPUPROF_DEMO_TINY=1) and one CPU thread, so a
shared 2-core CI machine is not oversubscribed; everything else is the real code path: the
shipped H200 runs, the PyTorch hook, the store, and a real TensorBoard.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tb_gpuprof.demo import SAMPLE_PREFIX, SAMPLES_DIR, TINY_ENV, sample_runs, tiny_config
from tb_gpuprof.pipeline import is_current, rebuilt_report
from tb_gpuprof.store.reader import event_files, load_run_report, locate_run_report, stored_reports
from tests.conftest import REPO, get_json, run_cli, wait_until

pytestmark = pytest.mark.slow

FAST_ENV = {TINY_ENV: "1", "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
NO_TORCH = ("import sys; sys.modules['torch'] = None; from tb_gpuprof.cli import main; "
            "sys.exit(main(sys.argv[1:]))")


def demo(*args: str, no_torch: bool = False, timeout: float = 300
         ) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", NO_TORCH, "demo"] if no_torch else \
        [sys.executable, "-m", "tb_gpuprof", "demo"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **FAST_ENV}, cwd=REPO)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """relative path -> (size, mtime_ns) of every file under ``root``."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def report_json(path: Path) -> dict:
    return json.loads(run_cli("report", str(path), "--format", "json").stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo_logdir(tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[Path, subprocess.CompletedProcess]:
    logdir = tmp_path_factory.mktemp("demo") / "runs"
    proc = demo("--no-tensorboard", "--logdir", str(logdir))
    assert proc.returncode == 0, proc.stderr
    return logdir, proc


def test_demo_module_imports_no_framework():
    code = ("import sys, tb_gpuprof.demo; "
            "print(','.join(m for m in ('torch', 'tensorflow', 'jax', 'keras') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "", f"importing tb_gpuprof.demo pulled in: {out}"


def test_package_ships_the_h200_ladder():
    names = [p.name for p in sample_runs()]
    assert len(names) >= 4
    for run in sample_runs():
        assert event_files(str(run)), run
        assert list((run / "plugins" / "gpuprof" / "traces").rglob("*.json.gz")), run
        report = load_run_report(str(run))
        assert report["system"]["gpu_name"] == "NVIDIA H200"
    total = sum(p.stat().st_size for p in SAMPLES_DIR.rglob("*") if p.is_file())
    assert total < 6 * 1024 * 1024  # what every `pip install` carries


@pytest.mark.parametrize("run", sample_runs(), ids=lambda p: p.name)
def test_shipped_reports_are_what_the_current_analysis_makes_of_them(run):
    """A shipped sample can never go stale: its stored report is exactly what the installed
    analysis makes of its raw trace and stored context (else: python tools/rebuild_samples.py),
    so neither the demo nor the plugin ever has to refresh it."""
    located = locate_run_report(str(run))
    stored = located.decode()
    rebuilt = rebuilt_report(located.run_dir, stored, located.stored.step, located.stored.rank)
    assert is_current(stored), "run `python tools/rebuild_samples.py` and commit the samples"
    assert json.loads(json.dumps(stored)) == json.loads(json.dumps(rebuilt)), \
        "run `python tools/rebuild_samples.py` and commit the samples"


def test_demo_writes_the_sample_runs(demo_logdir):
    logdir, proc = demo_logdir
    for src in sample_runs():
        dst = logdir / f"{SAMPLE_PREFIX}{src.name}"
        assert dst.name in proc.stdout
        assert {k: v[0] for k, v in snapshot(dst).items()} == \
            {k: v[0] for k, v in snapshot(src).items()}
        # what `tb-gpuprof report` prints for the copy is the shipped run's report
        assert report_json(dst) == json.loads(json.dumps(load_run_report(str(src))))


def test_demo_live_run_is_a_real_report(demo_logdir):
    logdir, proc = demo_logdir
    cfg = tiny_config("cpu")
    live = logdir / "live_cpu"
    assert "live run live_cpu" in proc.stdout
    report = report_json(live)
    assert report["system"]["framework"] == "pytorch"
    assert report["iterations"]["count"] == cfg.iter_stop - cfg.iter_start
    assert report["iterations"]["range"] == [cfg.iter_start, cfg.iter_stop - 1]
    assert [r.step for r in stored_reports(str(live))] == [cfg.iter_stop - 1]
    text = run_cli("report", str(live)).stdout
    assert "iteration time:" in text


def test_demo_again_is_idempotent_and_repairs_a_damaged_copy(demo_logdir):
    logdir, _ = demo_logdir
    before = {p.name: snapshot(p) for p in logdir.iterdir() if p.name.startswith(SAMPLE_PREFIX)}
    damaged = logdir / f"{SAMPLE_PREFIX}{sample_runs()[0].name}"
    events = Path(event_files(str(damaged))[0])
    events.write_bytes(events.read_bytes()[:1000])  # a copy cut short, e.g. by Ctrl-C

    proc = demo("--no-tensorboard", "--logdir", str(logdir))
    assert proc.returncode == 0, proc.stderr
    after = {p.name: snapshot(p) for p in logdir.iterdir() if p.name.startswith(SAMPLE_PREFIX)}
    assert set(after) == set(before)
    for name, files in after.items():
        if name == damaged.name:
            assert {k: v[0] for k, v in files.items()} == \
                {k: v[0] for k, v in before[name].items()}
        else:
            assert files == before[name], f"{name} was copied again"
    load_run_report(str(damaged))
    # the live run is replaced, not appended to: one events file, one report
    live = logdir / "live_cpu"
    assert len(event_files(str(live))) == 1
    assert len(stored_reports(str(live))) == 1
    assert sorted(p.name for p in logdir.iterdir()) == \
        sorted([*before, "live_cpu"])


def test_demo_without_torch_still_writes_the_samples(tmp_path):
    proc = demo("--no-tensorboard", "--logdir", str(tmp_path / "runs"), no_torch=True)
    assert proc.returncode == 0, proc.stderr
    assert "torch is not installed" in proc.stdout and "pip install torch" in proc.stdout
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == sorted(f"{SAMPLE_PREFIX}{p.name}" for p in sample_runs())


def test_unwritable_logdir_is_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = demo("--no-tensorboard", "--no-live", "--logdir", str(blocker / "runs"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "log directory" in lines[0] and str(blocker) in lines[0]


def test_busy_port_is_one_line_before_any_work(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = demo("--no-live", "--logdir", str(tmp_path / "runs"), "--port", str(port))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "--port" in lines[0]
    assert not any((tmp_path / "runs").iterdir())


def test_demo_serves_tensorboard_with_the_gpuprof_tab(tmp_path):
    logdir = tmp_path / "runs"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tb_gpuprof", "demo", "--no-live",
                             "--logdir", str(logdir), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **FAST_ENV}, cwd=REPO)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        url_line = wait_until(lambda: next((ln for ln in lines if "open http" in ln), None)
                              or proc.poll() is not None, timeout=180,
                              what="the demo to print TensorBoard's URL")
        assert isinstance(url_line, str), "".join(lines)
        base = f"http://localhost:{port}"
        assert f"{base}/#gpuprof" in url_line
        status, listing = get_json(f"{base}/data/plugins_listing")
        assert status == 200 and listing["gpuprof"]["enabled"] is True

        def runs():
            status, body = get_json(f"{base}/data/plugin/gpuprof/runs")
            names = {r["run"] for r in body.get("runs", [])} if status == 200 else set()
            expected = {f"{SAMPLE_PREFIX}{p.name}" for p in sample_runs()}
            return expected <= names

        wait_until(runs, timeout=120, what="TensorBoard to load the sample runs")
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        code = proc.wait(timeout=60)
    assert code == 0, "".join(lines)

    def port_closed():
        with socket.socket() as s:
            return s.connect_ex(("localhost", port)) != 0

    wait_until(port_closed, timeout=30, what="the demo's TensorBoard to stop")


def test_pytorch_resnet_script_writes_a_run(tmp_path):
    run = tmp_path / "r18"
    proc = subprocess.run(
        [sys.executable, str(REPO / "demo" / "pytorch_resnet.py"), "--device", "cpu",
         "--width", "8", "--batch-size", "2", "--image-size", "32", "--iter-start", "1",
         "--iter-stop", "3", "--iterations", "3", "--amp", "--channels-last",
         "--logdir", str(run)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **FAST_ENV})
    assert proc.returncode == 0, proc.stderr
    report = load_run_report(str(run))
    assert report["iterations"]["count"] == 2
    flags = report["system"]["flags"]
    assert flags["channels_last"] is True and flags["autocast"] == "bfloat16"
    assert flags["compiled"] is False


def test_pytorch_resnet_script_bad_data_dir_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "demo" / "pytorch_resnet.py"), "--device", "cpu",
         "--data", str(tmp_path / "missing"), "--logdir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, env={**os.environ, **FAST_ENV})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing: not a directory" in lines[0]


def test_keras_resnet_script_writes_a_run(tmp_path):
    pytest.importorskip("keras")
    run = tmp_path / "keras"
    proc = subprocess.run(
        [sys.executable, str(REPO / "demo" / "keras_resnet.py"), "--backend", "torch",
         "--batch-size", "2", "--image-size", "32", "--iter-start", "1", "--iter-stop", "3",
         "--iterations", "3", "--amp", "--logdir", str(run)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **FAST_ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = load_run_report(str(run))
    assert report["system"]["keras_backend"] == "torch"
    assert report["system"]["flags"]["mixed_precision_policy"] == "mixed_bfloat16"
    assert report["iterations"]["count"] == 2


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":  # a zombie has exited already
                parents[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        children = {p for p, ppid in parents.items() if ppid in frontier} - found
        found |= children
        frontier = children
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_sigterm_stops_the_demo_and_its_tensorboard_with_sigint_ignored(tmp_path):
    """Started from a script with `&`, the demo (and so TensorBoard) has SIGINT ignored;
    SIGTERM must still stop both, leaving no process behind."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tb_gpuprof", "demo", "--no-live",
                             "--logdir", str(tmp_path / "runs"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **FAST_ENV}, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        wait_until(lambda: any("open http" in ln for ln in lines) or proc.poll() is not None,
                   timeout=180, what="the demo to print TensorBoard's URL")
        assert proc.poll() is None, "".join(lines)
        children = _descendants(proc.pid)
        assert children, "TensorBoard runs as the demo's child"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, "".join(lines)
    wait_until(lambda: not any(_alive(p) for p in children), timeout=30,
               what="the demo's TensorBoard processes to exit")
    assert "stopping TensorBoard" in "".join(lines)


def test_the_readme_picture_shows_the_run_the_demo_opens_on():
    """The dashboard opens on the most recent run with GPU work (frontend/src/app.tsx,
    mostRecentRun): among the samples, the one whose report was written last. The README's
    picture and caption are of that run's current report (tools/screenshot.py remakes it)."""
    latest = max(sample_runs(), key=lambda run: max(r.wall_time for r in stored_reports(str(run))))
    report = load_run_report(str(latest))
    assert report["gpu_time_us"] > 0
    caption = (REPO / "README.md").read_text(encoding="utf-8")
    top = report["recommendations"][0]
    for figure in (f"{report['iterations']['unprofiled_median_ms']:.1f} ms per un-profiled",
                   f"MFU {report['throughput']['mfu_pct']:.1f}%",
                   f"({top['id']}, re-timed to save about {top['estimated_saving_ms']:.1f} ms"):
        assert figure in caption, f"README caption lacks {figure!r}: remake the picture"
