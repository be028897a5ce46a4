"""Plugin routes through TensorBoard's own WSGI app over real event files.

The data provider is TensorBoard's Python loader exactly as `--load_fast=false` builds it
(LocalDataIngester with default sample sizes); tests/test_plugin_e2e.py runs the Rust one.
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest

from tests.conftest import WINDOW_COUNT, WINDOW_RUN, run_cli, wsgi_client

PREFIX = "/data/plugin/gpuprof"


@pytest.fixture(scope="module")
def client(gpuprof_logdir):
    return wsgi_client(gpuprof_logdir.path)


def get(client, route, **params):
    url = f"{PREFIX}{route}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    response = client.get(url)
    return response.status_code, response


def get_json(client, route, **params):
    status, response = get(client, route, **params)
    assert response.mimetype == "application/json", (route, response.mimetype)
    return status, json.loads(response.get_data())


def runs_by_name(client):
    status, body = get_json(client, "/runs")
    assert status == 200
    return {r["run"]: r for r in body["runs"]}


def test_plugin_is_listed_and_enabled(client):
    listing = json.loads(client.get("/data/plugins_listing").get_data())
    entry = listing["gpuprof"]
    assert entry["enabled"] is True
    assert entry["tab_name"] == "GPU Prof"
    assert entry["loading_mechanism"] == {"type": "IFRAME",
                                          "module_path": f"{PREFIX}/index.js"}


def test_runs_lists_every_gpuprof_run_with_its_state(client, gpuprof_logdir):
    runs = runs_by_name(client)
    assert list(runs) == sorted(runs)
    assert set(runs) == {"kineto", "xplane", WINDOW_RUN, "future", "corrupt", "truncated",
                         "scalars_only", "telemetry", "linked"}
    steps = {run: [r["step"] for r in runs[run]["reports"]] for run in runs}
    for (run, step) in gpuprof_logdir.expected:
        assert step in steps[run], (run, step)
    assert steps[WINDOW_RUN] == [i * 10 for i in range(WINDOW_COUNT)]
    assert steps["truncated"] == [1]
    assert runs["kineto"]["has_trace"] and runs["xplane"]["has_trace"]
    assert not runs[WINDOW_RUN]["has_trace"]
    assert runs["kineto"]["scalar_tags"] == ["gpuprof/iteration_time_ms"]
    assert runs["scalars_only"]["reports"] == [] and runs["scalars_only"]["error"] is None
    assert runs["telemetry"]["has_telemetry"] and not runs["kineto"]["has_telemetry"]
    assert "schema_version 99" in runs["future"]["error"]
    assert "corrupt" in runs["corrupt"]["error"]
    for good in ("kineto", "xplane", WINDOW_RUN, "truncated", "linked"):
        assert runs[good]["error"] is None


def test_every_report_window_is_reachable(client, gpuprof_logdir):
    for (run, step), expected in gpuprof_logdir.expected.items():
        status, body = get_json(client, "/report", run=run, step=step)
        assert status == 200, (run, step, body)
        assert body == expected, (run, step)
    status, latest = get_json(client, "/report", run=WINDOW_RUN)
    assert latest == gpuprof_logdir.expected[(WINDOW_RUN, (WINDOW_COUNT - 1) * 10)]


@pytest.mark.parametrize(("params", "code", "needle"), [
    ({}, 400, "missing parameter 'run'"),
    ({"run": "nope"}, 404, "no run named 'nope'"),
    ({"run": "scalars_only"}, 404, "has no gpuprof report"),
    ({"run": "kineto", "step": "x"}, 400, "step must be an integer"),
    ({"run": WINDOW_RUN, "step": "5"}, 404, "no report at step 5"),
    ({"run": "future"}, 422, "schema_version 99 is newer"),
    ({"run": "corrupt"}, 422, "corrupt"),
    ({"run": "../kineto"}, 404, "no run named"),
])
def test_report_errors(client, params, code, needle):
    status, body = get_json(client, "/report", **params)
    assert status == code
    assert needle in body["error"] and "\n" not in body["error"]


def test_kernels_sort_filter_and_page(client, gpuprof_logdir):
    report = gpuprof_logdir.latest("kineto")
    kernels = report["kernels"]
    status, page = get_json(client, "/kernels", run="kineto", limit=5, offset=2)
    assert status == 200
    assert page["total"] == len(kernels)
    assert page["kernels"] == kernels[2:7]  # default: total_us descending, as stored

    _, asc = get_json(client, "/kernels", run="kineto", sort="count", order="asc", limit=1000)
    counts = [k["count"] for k in asc["kernels"]]
    assert counts == sorted(counts) and len(counts) == len(kernels)

    _, tc = get_json(client, "/kernels", run="kineto", tc="true", limit=1000)
    assert tc["total"] == sum(1 for k in kernels if k["uses_tensor_cores"]) > 0
    assert all(k["uses_tensor_cores"] for k in tc["kernels"])

    category = kernels[0]["category"]
    _, cat = get_json(client, "/kernels", run="kineto", category=category, limit=1000)
    assert cat["total"] == sum(1 for k in kernels if k["category"] == category)

    # q matches name, demangled name, ops and source, case-insensitively.
    needle = "ELEMENTWISE_KERNEL<"
    _, found = get_json(client, "/kernels", run="kineto", q=needle, limit=1000)
    expected = [k["name"] for k in kernels
                if any(needle.lower() in (s or "").lower()
                       for s in [k["name"], k.get("demangled"), k.get("source"),
                                 *(k.get("ops") or [])])]
    assert [k["name"] for k in found["kernels"]] == expected and expected


@pytest.mark.parametrize(("params", "needle"), [
    ({"sort": "no_such_field"}, "sort must be a kernel field"),
    ({"order": "sideways"}, "order must be asc or desc"),
    ({"limit": "1001"}, "limit must be between 1 and 1000"),
    ({"offset": "-1"}, "offset must be at least 0"),
    ({"tc": "maybe"}, "tc must be true or false"),
])
def test_kernels_bad_params(client, params, needle):
    status, body = get_json(client, "/kernels", run="kineto", **params)
    assert status == 400 and needle in body["error"]


def test_scalars(client):
    status, body = get_json(client, "/scalars", run=WINDOW_RUN, tag="gpuprof/iteration_time_ms")
    assert status == 200
    assert [p[0] for p in body["points"]] == [i * 10 for i in range(WINDOW_COUNT)]
    status, body = get_json(client, "/scalars", run=WINDOW_RUN, tag="gpuprof/nope")
    assert status == 404 and "no scalar" in body["error"]


def test_compare(client, gpuprof_logdir):
    status, body = get_json(client, "/compare", runs="kineto,xplane")
    assert status == 200
    kin, xla = gpuprof_logdir.latest("kineto"), gpuprof_logdir.latest("xplane")
    assert [r["run"] for r in body["runs"]] == ["kineto", "xplane"]
    assert body["runs"][0]["iterations"]["mean_ms"] == kin["iterations"]["mean_ms"]
    assert body["runs"][1]["top_kernels"] == xla["kernels"][:10]
    names_k = {k["name"] for k in kin["kernels"]}
    names_x = {k["name"] for k in xla["kernels"]}
    statuses = {k["name"]: k["status"] for k in body["kernels"]}
    for name, st in statuses.items():
        if name not in names_k:
            assert st == "appeared"
        elif name not in names_x:
            assert st == "vanished"
    assert set(statuses) == names_k | names_x

    same = get_json(client, "/compare", runs="truncated,linked,xplane")[1]
    # Three runs holding the same profile's report: nothing moved.
    assert {k["status"] for k in same["kernels"]} == {"same"}
    assert get_json(client, "/compare", runs="kineto,kineto")[0] == 400
    assert get_json(client, "/compare", runs="kineto,nope")[0] == 404
    assert get_json(client, "/compare", runs="kineto,future")[0] == 422


def test_telemetry(client):
    status, body = get_json(client, "/telemetry", run="telemetry")
    assert status == 200
    assert set(body["series"]) == {"gpu0/sm_util_pct", "gpu0/power_w", "gpu1/power_w"}
    assert [p[2] for p in body["series"]["gpu0/power_w"]] == [600.0 + s for s in range(20)]
    assert body["topology"] == {"gpus": [{"index": 0, "name": "NVIDIA H200"}]}
    status, body = get_json(client, "/telemetry", run="kineto")
    assert status == 200 and body["series"] == {} and body["topology"] is None


def test_trace_download_and_containment(client, kineto_trace, gpuprof_logdir):
    status, response = get(client, "/trace", run="kineto")
    assert status == 200
    assert response.get_data() == kineto_trace.read_bytes()
    assert response.headers["Content-Disposition"] == \
        f'attachment; filename="{kineto_trace.name}"'
    status, response = get(client, "/trace", run="kineto", step=3)
    assert status == 200
    for params in ({"run": "kineto", "step": "4"}, {"run": WINDOW_RUN},
                   {"run": "linked"}, {"run": "../linked"}, {"run": "/etc"},
                   {"run": "kineto/../../.."}):
        status, response = get(client, "/trace", **params)
        assert status == 404, params
        assert gpuprof_logdir.outside_file.read_bytes() not in response.get_data()
    assert get(client, "/trace", run="kineto", step="../1")[0] == 400


def test_static_files_stay_in_the_static_folder(client):
    status, response = get(client, "/index.js")
    assert status == 200 and response.mimetype == "text/javascript"
    body = response.get_data(as_text=True)
    assert "export" in body and "render" in body
    for path in ("/../../../etc/passwd", "/static/../plugin.py", "/%2e%2e/plugin.py",
                 "/static/.hidden", "/nope.js"):
        assert client.get(PREFIX + path).status_code == 404, path


def test_kernels_sort_puts_missing_values_last(client, gpuprof_logdir):
    kernels = gpuprof_logdir.latest("kineto")["kernels"]
    # A numeric field the real report leaves null for some kernels (e.g. flops, occupancy).
    field = next(f for f in kernels[0]
                 if any(k.get(f) is None for k in kernels)
                 and any(isinstance(k.get(f), (int, float)) and not isinstance(k.get(f), bool)
                         for k in kernels))
    for order in ("asc", "desc"):
        _, body = get_json(client, "/kernels", run="kineto", sort=field, order=order, limit=1000)
        values = [k.get(field) for k in body["kernels"]]
        present = [v for v in values if v is not None]
        assert values == present + [None] * (len(values) - len(present))
        assert present == sorted(present, reverse=order == "desc")


def test_timeline_route_merges_to_the_width_and_details_an_event(client):
    status, body = get_json(client, "/timeline", run="kineto", width=300)
    assert status == 200, body
    bars = body["bars"]
    assert sum(bars["count"]) == body["events"] > 0
    per_lane: dict[tuple[int, int], int] = {}
    for row, lane in zip(bars["row"], bars["lane"], strict=True):
        per_lane[(row, lane)] = per_lane.get((row, lane), 0) + 1
    assert max(per_lane.values()) <= 301
    end = body["span_us"] / 50
    status, zoomed = get_json(client, "/timeline", run="kineto", width=2000, start_us=0,
                              end_us=end)
    assert status == 200 and zoomed["end_us"] == end
    single = next(i for i in zoomed["bars"]["id"] if i >= 0)
    status, detail = get_json(client, "/timeline", run="kineto", event=single)
    assert status == 200 and detail["event"]["id"] == single
    for params, needle in (({"width": 0}, "width"), ({"width": 10, "start_us": 5, "end_us": 1},
                                                      "greater"),
                           ({"width": 10, "start_us": "x"}, "number"),
                           ({"event": 10**9}, "no event")):
        status, body = get_json(client, "/timeline", run="kineto", **params)
        assert status == 400 and needle in body["error"], (params, body)
    status, body = get_json(client, "/timeline", run=WINDOW_RUN, width=10)
    assert status == 404 and "raw trace" in body["error"]


def test_timeline_route_gives_python_rows_for_a_with_stack_trace(client, kineto_trace):
    """The fixture was recorded with with_stack=True: each thread's python_function events
    (those overlapping the window of host and GPU events) come back as a Python row."""
    import gzip

    with gzip.open(kineto_trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    host_gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in (
        "cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset")]
    t0 = min(e["ts"] for e in host_gpu)
    t1 = max(e["ts"] + e["dur"] for e in host_gpu)
    per_thread: dict[int, int] = {}
    for e in events:
        if e.get("cat") == "python_function" and e["ts"] <= t1 and e["ts"] + e["dur"] >= t0:
            per_thread[e["tid"]] = per_thread.get(e["tid"], 0) + 1
    assert per_thread
    status, body = get_json(client, "/timeline", run="kineto", width=500)
    assert status == 200, body
    python = {int(r["label"].split()[-1]): r for r in body["rows"] if r["kind"] == "python"}
    assert {t: r["events"] for t, r in python.items()} == per_thread
    cat = body["categories"].index("python")
    bars = body["bars"]
    drawn = sum(n for n, c in zip(bars["count"], bars["cat"], strict=True) if c == cat)
    assert drawn == sum(per_thread.values())
    single = next(i for i, c in zip(bars["id"], bars["cat"], strict=True) if c == cat and i >= 0)
    status, detail = get_json(client, "/timeline", run="kineto", event=single)
    assert status == 200 and detail["event"]["category"] == "python"
    assert detail["event"]["tid"] in per_thread


@pytest.fixture(scope="module")
def memory_client(tmp_path_factory):
    """A log directory holding one imported trace with allocator events (ResNet-50 AMP on the
    H200, about 40k events: its report keeps at most 2000 points of them)."""
    logdir = tmp_path_factory.mktemp("memory_logdir")
    trace = Path(__file__).parent / "data" / "h200_ladders" / "resnet50_amp.json.gz"
    run_cli("import", str(trace), "--logdir", str(logdir), "--run", "mem")
    return wsgi_client(logdir)


def test_memory_route_downsamples_a_zoomed_range_again_from_the_raw_trace(memory_client):
    status, report = get_json(memory_client, "/report", run="mem")
    assert status == 200
    (dev,) = [d for d in report["memory"]["devices"] if d["device"].startswith("cuda")]
    whole = dev["series"]
    assert whole["downsampled_from"] > len(whole["t_ms"])  # the report's series is coarse
    peak_ms = dev["peak"]["t_ms"]
    lo, hi = max(peak_ms - 1.0, 0.0), peak_ms + 1.0
    status, body = get_json(memory_client, "/memory", run="mem", device=dev["device"],
                            start_ms=lo, end_ms=hi)
    assert status == 200
    zoom = body["series"]
    in_report = sum(lo <= t <= hi for t in whole["t_ms"])
    assert len(zoom["t_ms"]) > in_report  # finer than the report's points in that range
    assert zoom["downsampled_from"] >= len(zoom["t_ms"])
    assert all(lo <= t <= hi for t in zoom["t_ms"])
    assert zoom["t_ms"] == sorted(zoom["t_ms"])
    # the same clock as the report's series: the peak is in the range, at the same time
    at = zoom["allocated_bytes"].index(max(zoom["allocated_bytes"]))
    assert zoom["allocated_bytes"][at] == dev["peak"]["allocated_bytes"]
    assert zoom["t_ms"][at] == pytest.approx(peak_ms, abs=1e-3)
    # the whole window asked again keeps each slice's extremes, as the report did
    status, again = get_json(memory_client, "/memory", run="mem", device=dev["device"],
                             start_ms=0, end_ms=whole["t_ms"][-1])
    assert max(again["series"]["allocated_bytes"]) == dev["peak"]["allocated_bytes"]


@pytest.mark.parametrize("params,code", [
    ({"device": "cuda:0", "start_ms": 5, "end_ms": 1}, 400),
    ({"device": "cuda:0", "start_ms": "x", "end_ms": 1}, 400),
    ({"device": "cuda:0", "start_ms": 0}, 400),
    ({"device": "cuda:7", "start_ms": 0, "end_ms": 1}, 404),
    ({"device": "<script>", "start_ms": 0, "end_ms": 1}, 404),
])
def test_memory_route_errors(memory_client, params, code):
    status, body = get_json(memory_client, "/memory", run="mem", **params)
    assert status == code and "\n" not in body["error"]
