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
