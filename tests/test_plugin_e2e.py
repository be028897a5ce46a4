"""A real `tensorboard --logdir DIR --port 0` over runs from `tb-gpuprof import` of the real
fixtures plus damaged runs, in both loading modes: the default Rust data server and
`--load_fast=false` (TensorBoard's Python loader)."""

from __future__ import annotations

import json
import shutil
import urllib.parse

import pytest

from tb_gpuprof.store import layout
from tb_gpuprof.store.writer import EventWriter
from tests.conftest import WINDOW_COUNT, WINDOW_RUN, get_json, http_get, run_cli, wait_until

pytestmark = pytest.mark.slow

MODES = {"rust": (), "python": ("--load_fast=false",)}


@pytest.fixture(scope="module", params=list(MODES))
def server(request, gpuprof_logdir, tensorboard_factory, tmp_path_factory):
    # A private copy: the live-run test adds a run while TensorBoard watches.
    logdir = tmp_path_factory.mktemp(f"e2e_{request.param}") / "logs"
    shutil.copytree(gpuprof_logdir.path, logdir, symlinks=True)
    tb = tensorboard_factory(logdir, "--reload_interval=1", *MODES[request.param])
    expected_runs = {run for run, _ in gpuprof_logdir.expected} | {"future", "corrupt",
                                                                   "scalars_only", "telemetry"}

    def loaded():
        status, body = get_json(f"{tb.base_url}/data/plugin/gpuprof/runs")
        if status != 200:
            return None
        runs = {r["run"]: r for r in body["runs"]}
        complete = (expected_runs <= set(runs)
                    and len(runs[WINDOW_RUN]["reports"]) == WINDOW_COUNT)
        return runs if complete else None

    wait_until(loaded, timeout=120, what=f"tensorboard ({request.param}) to load the runs")
    tb.mode = request.param
    tb.logdir = logdir
    yield tb
    tb.stop()


def url(tb, route, **params):
    query = "?" + urllib.parse.urlencode(params) if params else ""
    return f"{tb.base_url}/data/plugin/gpuprof{route}{query}"


def test_loading_mode_is_the_one_asked_for(server):
    fast = "experimental fast data loading" in server.log()
    assert fast == (server.mode == "rust")


def test_plugins_listing_shows_gpuprof_enabled(server):
    status, listing = get_json(f"{server.base_url}/data/plugins_listing")
    assert status == 200
    assert listing["gpuprof"]["enabled"] is True
    assert listing["gpuprof"]["tab_name"] == "GPU Prof"


@pytest.mark.parametrize("run", ["kineto", "xplane"])
def test_report_equals_the_cli_report(server, kineto_trace, xplane_trace, run):
    trace = {"kineto": kineto_trace, "xplane": xplane_trace}[run]
    cli = json.loads(run_cli("report", str(trace), "--format", "json").stdout)
    status, body = get_json(url(server, "/report", run=run))
    assert status == 200
    assert body == cli


def test_every_window_survives_reservoir_sampling(server, gpuprof_logdir):
    for step in range(0, WINDOW_COUNT * 10, 10):
        status, body = get_json(url(server, "/report", run=WINDOW_RUN, step=step))
        assert status == 200, step
        assert body == gpuprof_logdir.expected[(WINDOW_RUN, step)]


def test_bad_runs_fail_alone(server):
    status, body = get_json(url(server, "/runs"))
    runs = {r["run"]: r for r in body["runs"]}
    assert "schema_version 99" in runs["future"]["error"]
    assert runs["corrupt"]["error"] and runs["kineto"]["error"] is None
    assert runs["scalars_only"]["reports"] == []
    assert [r["step"] for r in runs["truncated"]["reports"]] == [1]
    assert get_json(url(server, "/report", run="future"))[0] == 422
    assert get_json(url(server, "/report", run="corrupt"))[0] == 422
    status, body = get_json(url(server, "/report", run="scalars_only"))
    assert status == 404 and "no gpuprof report" in body["error"]
    assert get_json(url(server, "/report", run="truncated"))[0] == 200
    # TensorBoard itself keeps serving.
    assert server.alive()
    status, body = get_json(f"{server.base_url}/data/runs")
    assert status == 200 and "kineto" in body


def test_kernels_scalars_telemetry_and_trace_answer(server, kineto_trace):
    status, page = get_json(url(server, "/kernels", run="kineto", limit=3, q="nvjet"))
    assert status == 200 and 0 < len(page["kernels"]) <= 3
    assert all("nvjet" in k["name"] for k in page["kernels"])
    status, body = get_json(url(server, "/scalars", run="kineto", tag=layout.ITERATION_TIME_TAG))
    assert status == 200 and len(body["points"]) > 0
    status, body = get_json(url(server, "/telemetry", run="telemetry"))
    assert status == 200 and "gpu0/power_w" in body["series"]
    status, headers, data = http_get(url(server, "/trace", run="kineto"))
    assert status == 200 and data == kineto_trace.read_bytes()
    assert headers["Content-Disposition"].startswith("attachment")
    status, _, data = http_get(url(server, "/trace", run="linked"))
    assert status == 404
    status, _, body = http_get(url(server, "/index.js"))
    assert status == 200 and b"render" in body


def test_a_live_run_appears_without_restart(server, real_reports):
    writer = EventWriter(server.logdir / "live")  # left open, as in a training job
    writer.add_scalar(layout.ITERATION_TIME_TAG, 40.0, 0)
    writer.add_report(real_reports["xplane"], step=1)

    def live_report():
        status, body = get_json(url(server, "/report", run="live"))
        return body if status == 200 else None

    body = wait_until(live_report, timeout=60, what="the live run's report")
    assert body == json.loads(json.dumps(real_reports["xplane"]))
    writer.close()
