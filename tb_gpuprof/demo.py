"""`tb-gpuprof demo` and the PyTorch ResNet training loop behind it (and demo/pytorch_resnet.py).

The demo writes a log directory with the ResNet-50 runs recorded on an NVIDIA H200 that ship
with the package (``h200_*``), plus a live run of a small ResNet on this machine (``live_cpu``
or ``live_cuda``, when torch is installed), then serves it with TensorBoard on localhost.

torch is imported only inside the training functions: ``import tb_gpuprof.demo`` stays
framework-free, and the demo works without torch (sample runs only).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import GpuProfError

SAMPLES_DIR = Path(__file__).resolve().parent / "samples" / "h200"
SAMPLE_PREFIX = "h200_"
TENSORBOARD_START_TIMEOUT_S = 120.0
# Set to 1 for the smallest live run (tests; very slow machines).
TINY_ENV = "TB_GPUPROF_DEMO_TINY"
_TB_URL_RE = re.compile(r"TensorBoard \S+ at (http://\S+?)/? \(")

# -- training -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """One training run; the fields are demo/pytorch_resnet.py's flags."""

    model: str = "resnet18"  # resnet18 | resnet34 | resnet50
    width: int = 64  # channels of the first stage (torchvision: 64)
    batch_size: int = 16
    image_size: int = 64
    num_classes: int = 10
    iterations: int = 30
    iter_start: int = 10
    iter_stop: int = 13
    tf32: bool | None = None  # None: leave PyTorch's defaults
    amp: bool = False
    amp_dtype: str = "float16"  # float16 | bfloat16 (CPU autocast always uses bfloat16)
    channels_last: bool = False
    compile: bool = False
    data: str | None = None  # an image folder (torchvision ImageFolder); None: synthetic
    workers: int = 2
    device: str = "cpu"
    lr: float = 0.01


def default_config(device: str) -> TrainConfig:
    """ResNet-50 at 224 px, batch 256 on a GPU (the seed's setting); a half-width ResNet-18 at
    64 px, batch 16 on a CPU (seconds per iteration, not minutes)."""
    if device == "cuda":
        return TrainConfig(model="resnet50", batch_size=256, image_size=224, num_classes=1000,
                           iterations=26, iter_start=20, iter_stop=24, device=device)
    return TrainConfig(model="resnet18", width=32, device=device)


def tiny_config(device: str) -> TrainConfig:
    return replace(default_config("cpu"), width=8, batch_size=4, image_size=32, iterations=5,
                   iter_start=2, iter_stop=4, device=device)


def detect_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


_STAGES = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet34": ("basic", (3, 4, 6, 3)),
           "resnet50": ("bottleneck", (3, 4, 6, 3))}


@functools.cache
def _resnet_classes() -> tuple[type, type]:
    """The blocks of torchvision's ResNet (v1.5), defined once torch is imported."""
    import torch.nn as nn

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(inplace=True), nn.Conv2d(width, width, 3, 1, 1, bias=False),
                nn.BatchNorm2d(width))
            self.down = _downsample(nn, cin, width, stride)

        def forward(self, x: Any) -> Any:
            return (self.body(x) + (x if self.down is None else self.down(x))).relu_()

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(inplace=True), nn.Conv2d(width, cout, 1, bias=False),
                nn.BatchNorm2d(cout))
            self.down = _downsample(nn, cin, cout, stride)

        def forward(self, x: Any) -> Any:
            return (self.body(x) + (x if self.down is None else self.down(x))).relu_()

    return Basic, Bottleneck


def _downsample(nn: Any, cin: int, cout: int, stride: int) -> Any:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


def build_resnet(name: str, num_classes: int, width: int = 64) -> Any:
    """torchvision's model when it is installed and the width is standard, else the same
    architecture built here (no torchvision needed)."""
    import torch.nn as nn

    if name not in _STAGES:
        raise GpuProfError(f"unknown model {name!r}: choose one of {', '.join(_STAGES)}")
    if width == 64 and importlib.util.find_spec("torchvision") is not None:
        import torchvision

        return getattr(torchvision.models, name)(num_classes=num_classes)
    kind, counts = _STAGES[name]
    basic, bottleneck = _resnet_classes()
    block: Any = basic if kind == "basic" else bottleneck
    layers: list[Any] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                         nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, count in enumerate(counts):
        w = width * 2 ** stage
        for i in range(count):
            layers.append(block(cin, w, 2 if i == 0 and stage > 0 else 1))
            cin = w * block.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def set_tf32(torch: Any, on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


def _batches(cfg: TrainConfig, torch: Any) -> tuple[Any, int]:
    """(endless iterator of (x, y) on the device, number of classes)."""
    if cfg.data is None:
        # One fixed batch on the device: the GPU never waits for data (as in the seed).
        x = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, device=cfg.device)
        y = torch.randint(0, cfg.num_classes, (cfg.batch_size,), device=cfg.device)
        return _repeat((x, y)), cfg.num_classes
    if not os.path.isdir(cfg.data):
        raise GpuProfError(f"{cfg.data}: not a directory (--data wants an image folder with one "
                           "sub-folder per class)")
    if importlib.util.find_spec("torchvision") is None:
        raise GpuProfError("--data needs torchvision (pip install torchvision) to read an image "
                           "folder; without --data the demo uses synthetic images")
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.RandomResizedCrop(cfg.image_size),
                             transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                             transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    try:
        ds = datasets.ImageFolder(cfg.data, transform=tf)
    except (FileNotFoundError, RuntimeError) as e:
        raise GpuProfError(f"{cfg.data}: not a usable image folder: {e}") from None
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, shuffle=True,
                                         drop_last=True, num_workers=cfg.workers,
                                         pin_memory=cfg.device == "cuda",
                                         persistent_workers=cfg.workers > 0)
    if len(loader) == 0:
        raise GpuProfError(f"{cfg.data}: fewer images than one batch of {cfg.batch_size}")
    return _cycle(loader, cfg.device), len(ds.classes)


def _repeat(item: Any) -> Any:
    while True:
        yield item


def _cycle(loader: Any, device: str) -> Any:
    while True:
        for x, y in loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def train(cfg: TrainConfig, logdir: str | os.PathLike[str]) -> dict[str, Any]:
    """Train ``cfg.iterations`` iterations under a GpuProfiler whose window is
    [iter_start, iter_stop); returns what happened (iteration times, the window's report)."""
    import torch
    import torch.nn.functional as F

    from .torch import GpuProfiler

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise GpuProfError("--device cuda, but torch sees no CUDA GPU")
    if cfg.tf32 is not None:
        set_tf32(torch, cfg.tf32)
    torch.backends.cudnn.benchmark = cfg.device == "cuda"
    batches, num_classes = _batches(cfg, torch)
    model = build_resnet(cfg.model, num_classes, cfg.width).to(cfg.device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    amp_dtype = getattr(torch, cfg.amp_dtype) if cfg.device == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(cfg.device, enabled=cfg.amp and amp_dtype == torch.float16)
    step_model = torch.compile(model) if cfg.compile else model
    times_ms: list[float] = []
    with GpuProfiler(logdir, iter_start=cfg.iter_start, iter_stop=cfg.iter_stop,
                     model=step_model) as prof:
        t_last = time.perf_counter()
        for x, y in prof.wrap(itertools.islice(batches, cfg.iterations)):
            if cfg.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(cfg.device, dtype=amp_dtype, enabled=cfg.amp):
                loss = F.cross_entropy(step_model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            prof.step()
            now = time.perf_counter()
            times_ms.append((now - t_last) * 1e3)
            t_last = now
    return {"iterations": len(times_ms), "iteration_ms": times_ms, "report": prof.report,
            "logdir": os.fspath(logdir)}


def summarize(result: dict[str, Any]) -> str:
    """One line: median iteration time and what the report recommends."""
    times = sorted(result["iteration_ms"][1:] or result["iteration_ms"])
    median = times[len(times) // 2] if times else float("nan")
    report = result.get("report") or {}
    recs = [r["id"] for r in report.get("recommendations") or []]
    verdict = (f"recommends {', '.join(recs)}" if recs else "no recommendations") if report \
        else "no report (see the warnings above)"
    return (f"{result['iterations']} iterations, median {median:.1f} ms "
            f"(hook's wall clock, includes the profiled window); report: {verdict}")


# -- the demo -------------------------------------------------------------------------------


def _prepare_logdir(logdir: str) -> None:
    try:
        os.makedirs(logdir, exist_ok=True)
    except OSError as e:
        raise GpuProfError(f"cannot create the log directory {logdir}: "
                           f"{e.strerror or e}; pick another with --logdir") from None
    if not os.access(logdir, os.W_OK | os.X_OK):
        raise GpuProfError(f"the log directory {logdir} is not writable; pick another with "
                           "--logdir")


def _file_sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def sample_runs() -> list[Path]:
    """The run directories shipped in tb_gpuprof/samples/h200."""
    if not SAMPLES_DIR.is_dir():
        return []
    return sorted(p for p in SAMPLES_DIR.iterdir() if p.is_dir())


def copy_samples(logdir: str) -> list[str]:
    """Copy the shipped runs to LOGDIR/h200_<name>; a run already there unchanged is left
    alone (TensorBoard may be reading it), a changed or partial one is replaced."""
    names = []
    for src in sample_runs():
        dst = Path(logdir) / f"{SAMPLE_PREFIX}{src.name}"
        names.append(dst.name)
        if dst.is_dir() and _file_sizes(dst) == _file_sizes(src):
            continue
        try:
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(src, dst)
        except OSError as e:
            raise GpuProfError(f"cannot copy the sample run to {dst}: {e.strerror or e}") from None
    return names


def live_run(logdir: str) -> str | None:
    """Train a small ResNet on this machine into LOGDIR/live_<device>; returns the run name,
    or None (after saying why in one line) when torch is missing."""
    if importlib.util.find_spec("torch") is None:
        print("live run skipped: torch is not installed (pip install torch, then run "
              "tb-gpuprof demo again)")
        return None
    device = detect_device()
    cfg = tiny_config(device) if os.environ.get(TINY_ENV) == "1" else default_config(device)
    name = f"live_{device}"
    run_dir = os.path.join(logdir, name)
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time, not two mixed
    print(f"live run {name}: {cfg.model} (width {cfg.width}), batch {cfg.batch_size}, "
          f"{cfg.image_size} px, synthetic data, {cfg.iterations} iterations, profiled window "
          f"[{cfg.iter_start}, {cfg.iter_stop}) ...", flush=True)
    result = train(cfg, run_dir)
    print(f"live run {name}: {summarize(result)}")
    return name


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("localhost", port))
        except OSError:
            raise GpuProfError(f"port {port} is already in use (another TensorBoard?); pick "
                               "another with --port") from None


class _TensorBoard:
    """`tensorboard --logdir LOGDIR --port PORT --host localhost` as a child process; its output
    is held back until it serves (then passed through), so a failure shows its last lines."""

    def __init__(self, logdir: str, port: int) -> None:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
        # Its own process group: stop() then reaches TensorBoard and the data server it
        # starts, and a Ctrl-C in the terminal reaches only the demo, which stops them.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port),
             "--host", "localhost"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            env=env, start_new_session=True)
        self.port = port
        self.url: str | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self._ready = threading.Event()
        threading.Thread(target=self._pump, name="tensorboard-output", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self._ready.is_set():
                sys.stderr.write(line)
                continue
            self.tail.append(line.rstrip())
            m = _TB_URL_RE.search(line)
            if m:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float) -> str:
        if not self._ready.wait(timeout):
            self.stop()
            raise GpuProfError(f"TensorBoard did not start within {timeout:.0f} s")
        if self.url is None:
            self.proc.wait(timeout=10)
            out = "\n".join(self.tail)
            if "already in use" in out or "could not bind" in out:
                raise GpuProfError(f"port {self.port} is already in use; pick another with "
                                   "--port")
            last = next((t for t in reversed(self.tail) if t.strip()), "no output")
            raise GpuProfError(f"TensorBoard exited with status {self.proc.returncode}: {last}")
        return self.url

    def stop(self) -> None:
        """SIGTERM to TensorBoard's process group (not SIGINT: a demo started from a script
        with ``&`` has SIGINT ignored, and TensorBoard inherits that), SIGKILL if it lingers."""
        pgid = self.proc.pid  # start_new_session: the group's id is TensorBoard's pid
        for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 15.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break  # the whole group is gone
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(pgid):
                break
        if self.proc.poll() is None:
            self.proc.wait(timeout=15)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Any:
    """SIGTERM raises KeyboardInterrupt, so it stops the demo the way Ctrl-C does, also where
    SIGINT is ignored (a script's ``&``: that stays as it is); the handler is put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve(logdir: str, port: int) -> int:
    """Run TensorBoard until Ctrl-C (or SIGTERM); stop it on the way out."""
    if importlib.util.find_spec("tensorboard") is None:
        raise GpuProfError("tensorboard is not installed (pip install tensorboard)")
    tb = _TensorBoard(logdir, port)
    try:
        url = tb.wait_ready(TENSORBOARD_START_TIMEOUT_S)
        print(f"TensorBoard is serving {logdir}: open {url}/#gpuprof  (Ctrl-C to stop)",
              flush=True)
        code = tb.proc.wait()
        print(f"TensorBoard exited with status {code}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping TensorBoard", flush=True)
        return 0
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            tb.stop()


def run_demo(logdir: str, port: int = 6006, start_tensorboard: bool = True,
             live: bool = True) -> int:
    """`tb-gpuprof demo`: sample runs + a live run into ``logdir``, then TensorBoard.
    SIGTERM stops it at any point as Ctrl-C does (the CLI exits 130 during the live run, 0
    once TensorBoard serves)."""
    with _sigterm_as_interrupt():
        return _run_demo(logdir, port, start_tensorboard, live)


def _run_demo(logdir: str, port: int, start_tensorboard: bool, live: bool) -> int:
    if start_tensorboard and not 0 < port < 65536:
        raise GpuProfError(f"--port must be between 1 and 65535, got {port}")
    _prepare_logdir(logdir)
    if start_tensorboard:
        _check_port_free(port)  # before minutes of training, not after
    samples = copy_samples(logdir)
    if samples:
        print(f"sample runs (ResNet-50, batch 256, recorded on an NVIDIA H200): "
              f"{', '.join(samples)}")
    else:
        print("no sample runs found in the package (tb_gpuprof/samples/h200 is missing)")
    if live:
        live_run(logdir)
    print(f"runs are in {logdir}; e.g. tb-gpuprof report "
          f"{os.path.join(logdir, samples[0] if samples else '<run>')}", flush=True)
    if not start_tensorboard:
        print(f"view them: tensorboard --logdir {logdir}")
        return 0
    return serve(logdir, port)


__all__ = ["TrainConfig", "build_resnet", "copy_samples", "default_config", "run_demo", "train"]
