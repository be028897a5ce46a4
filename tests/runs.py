"""Reading a run back the way a user would: its scalars, and `tb-gpuprof report --format json`."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

from tb_gpuprof import cli
from tb_gpuprof.store.reader import event_files, iter_events


def read_scalars(run_dir: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for path in event_files(run_dir):
        for event in iter_events(path):
            for v in event.summary.value:
                if v.WhichOneof("value") == "simple_value":
                    out.setdefault(v.tag, {})[event.step] = v.simple_value
    return out


def cli_report(path: str) -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli.main(["report", path, "--format", "json"]) == 0
    return json.loads(buf.getvalue())


def tiny_cpu_hook_run(run_dir: str, iterations: int = 7, window: tuple[int, int] = (2, 4)) -> None:
    """A small real training loop on the CPU through GpuProfiler (no GPU activity at all)."""
    import torch

    from tb_gpuprof.torch import GpuProfiler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with GpuProfiler(run_dir, iter_start=window[0], iter_stop=window[1], model=model,
                     nvml=False) as prof:
        for _ in range(iterations):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
