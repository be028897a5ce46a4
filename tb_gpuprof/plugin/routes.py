"""HTTP routes of the gpuprof plugin (docs/plugin-routes.md), as werkzeug WSGI apps.

Every error is JSON ``{"error": "one line"}``: 400 bad parameter, 404 unknown run/step/tag,
422 a stored report that cannot be read. Nothing a request sends is used as a file path
without being resolved and checked to stay inside the log directory (or the static folder).
"""

from __future__ import annotations

import json
import logging
import mimetypes
import os
from collections.abc import Callable
from typing import Any

from tensorboard import errors as tb_errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from werkzeug import Response, wrappers
from werkzeug.wsgi import wrap_file

from ..errors import GpuProfError
from ..store import layout
from . import views
from .data import HttpError, PluginData
from .fallback import FALLBACK_MODULE

logger = logging.getLogger("tb_gpuprof")

STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "static")
MAX_COMPARE_RUNS = 20
JSON = "application/json"

Handler = Callable[[PluginData, wrappers.Request, Any, str], Any]


def _json(request: wrappers.Request, body: Any, code: int = 200) -> Response:
    if not isinstance(body, bytes):
        body = json.dumps(body, separators=(",", ":")).encode()
    return http_util.Respond(request, body, JSON, code=code)


def _error(request: wrappers.Request, code: int, message: str) -> Response:
    return _json(request, {"error": message}, code)


def _required(request: wrappers.Request, name: str) -> str:
    value = request.args.get(name)
    if not value:
        raise views.BadParam(f"missing parameter {name!r}")
    return value


def _wrap(plugin: PluginData, handler: Handler) -> Callable:
    @wrappers.Request.application
    def app(request: wrappers.Request) -> Response:
        ctx = plugin_util.context(request.environ)
        eid = plugin_util.experiment_id(request.environ)
        try:
            result = handler(plugin, request, ctx, eid)
        except views.BadParam as e:
            return _error(request, 400, str(e))
        except HttpError as e:
            return _error(request, e.code, e.message)
        except tb_errors.NotFoundError as e:
            return _error(request, 404, str(e))
        except GpuProfError as e:
            return _error(request, 422, str(e))
        if isinstance(result, Response):
            return result
        return _json(request, result)

    return app


def _runs(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    # The tag names the dashboard reads: the server owns them (store/layout.py).
    return {"runs": plugin.runs(ctx, eid), "tags": layout.DASHBOARD_TAGS}


def _ref(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str, run: str):
    step = views.parse_int(request.args.get("step"), "step", None)
    rank = views.parse_int(request.args.get("rank"), "rank", None)
    return plugin.find_report(ctx, eid, run, step, rank)


def _report(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    run = _required(request, "run")
    body = plugin.load_report(ctx, eid, _ref(plugin, request, ctx, eid, run)).gzip_json()
    # Precompressed once per report; http_util unzips for a client that does not take gzip.
    return http_util.Respond(request, body, JSON, content_encoding="gzip")


def _kernels(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    run = _required(request, "run")
    params = {k: request.args.get(k) for k in
              ("sort", "order", "q", "category", "tc", "precision", "offset", "limit")}
    ref = _ref(plugin, request, ctx, eid, run)
    answer = views.filter_kernels(plugin.load_report(ctx, eid, ref).kernel_index(), params)
    return {"run": run, "step": ref.step, **answer}


def _scalars(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    run, tag = _required(request, "run"), _required(request, "tag")
    points = plugin.read_scalars(ctx, eid, run, [tag]).get(tag)
    if points is None:
        raise HttpError(404, f"run {run!r} has no scalar {tag!r}")
    return {"run": run, "tag": tag, "points": points}


def _compare(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    runs = [r for r in _required(request, "runs").split(",") if r]
    if not runs:
        raise views.BadParam("runs must name at least one run")
    if len(runs) > MAX_COMPARE_RUNS:
        raise views.BadParam(f"at most {MAX_COMPARE_RUNS} runs can be compared")
    if len(set(runs)) != len(runs):
        raise views.BadParam("runs lists a run twice")
    entries = []
    for run in runs:
        ref = plugin.find_report(ctx, eid, run, None, None)
        entries.append((run, ref.step, plugin.load_report(ctx, eid, ref).report))
    return views.compare_reports(entries)


def _telemetry(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    run = _required(request, "run")
    plugin.known_run(ctx, eid, run)
    tags = [t for t in plugin.scalar_tags(ctx, eid, run).get(run, [])
            if layout.is_telemetry_scalar(t)]
    series = {}
    if tags:
        for tag, points in plugin.read_scalars(ctx, eid, run, tags).items():
            series[layout.scalar_name(tag)] = points
    topology = None
    if layout.TOPOLOGY_TAG in plugin.blob_series(ctx, eid, run).get(run, {}):
        topology = plugin.latest_json(ctx, eid, run, layout.TOPOLOGY_TAG)
    return {"run": run, "series": series, "topology": topology}


def _distributed(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    run = _required(request, "run")
    step = views.parse_int(request.args.get("step"), "step", None)
    base, refs = plugin.rank_reports(ctx, eid, run, step)
    reports = [plugin.load_report(ctx, eid, ref).report for ref in refs]
    from ..analysis.distributed import cross_rank_summary

    summary = cross_rank_summary(reports)
    runs = {ref.rank: ref.run for ref in refs}
    for row in summary["ranks"]:
        row["run"] = runs.get(row["rank"])
    return {"run": base, "step": refs[0].step, **summary}


def _trace(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    run = _required(request, "run")
    step = views.parse_int(request.args.get("step"), "step", None)
    rank = views.parse_int(request.args.get("rank"), "rank", None)
    plugin.known_run(ctx, eid, run)
    path = plugin.trace_file(run, step, rank)
    name = os.path.basename(path).encode("ascii", "replace").decode().replace('"', "_")
    f = open(path, "rb")  # the response closes it
    response = Response(wrap_file(request.environ, f), mimetype="application/octet-stream",
                        direct_passthrough=True)
    response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    response.headers["Content-Length"] = str(os.fstat(f.fileno()).st_size)
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _parse_float(value: str | None, name: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        x = float(value)
    except ValueError:
        raise views.BadParam(f"{name} must be a number, got {value!r}") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise views.BadParam(f"{name} must be a finite number, got {value!r}")
    return x


def _timeline(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    from .timeline import MAX_WIDTH, TimelineError

    run = _required(request, "run")
    ref = _ref(plugin, request, ctx, eid, run)
    report = plugin.load_report(ctx, eid, ref).report
    path = plugin.trace_file(run, ref.step, views.parse_int(request.args.get("rank"), "rank", None))
    index = plugin.timeline(path, report, ref.wall_time)
    try:
        event = views.parse_int(request.args.get("event"), "event", None)
        if event is not None:
            return {"run": run, "step": ref.step, "event": index.event(event)}
        width = views.parse_int(_required(request, "width"), "width", None, lo=1, hi=MAX_WIDTH)
        window = index.window(_parse_float(request.args.get("start_us"), "start_us"),
                              _parse_float(request.args.get("end_us"), "end_us"), width or 1)
    except TimelineError as e:
        raise views.BadParam(str(e)) from None
    return {"run": run, "step": ref.step, **window}


def _memory(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    """A device's allocator series over a range of the window, from the raw trace."""
    from ..analysis.memory import memory_range

    run = _required(request, "run")
    device = _required(request, "device")
    start = _parse_float(_required(request, "start_ms"), "start_ms")
    end = _parse_float(_required(request, "end_ms"), "end_ms")
    assert start is not None and end is not None  # required: never empty
    if end <= start:
        raise views.BadParam(f"end_ms must be above start_ms, got {start} and {end}")
    ref = _ref(plugin, request, ctx, eid, run)
    report = plugin.load_report(ctx, eid, ref).report
    t0 = (report.get("memory") or {}).get("t0_us")
    if t0 is None:
        raise HttpError(404, f"run {run!r} step {ref.step} has no memory section")
    path = plugin.trace_file(run, ref.step, views.parse_int(request.args.get("rank"), "rank", None))
    series = memory_range(plugin.timeline(path, report, ref.wall_time).memory, device, t0,
                          start, end)
    if series is None:
        raise HttpError(404, f"the trace holds no allocator events for device {device!r}")
    return {"run": run, "step": ref.step, "device": device, "start_ms": start, "end_ms": end,
            "series": series}


def _oom(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    """The run's out-of-memory reports (tb_gpuprof/analysis/oom.py), rank 0's first."""
    run = _required(request, "run")
    return {"run": run, "reports": plugin.oom_reports(run)}


def _static_file(rel: str) -> str | None:
    """A file under tb_gpuprof/static/ named by a request path, never anything outside it."""
    parts = [p for p in rel.split("/") if p]
    if not parts or any(p in (".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    path = layout.safe_join(STATIC_DIR, *parts)
    return path if path is not None and os.path.isfile(path) else None


def _send(request: wrappers.Request, path: str) -> Response:
    with open(path, "rb") as f:
        body = f.read()
    return _send_bytes(request, body, path)


def _send_bytes(request: wrappers.Request, body: bytes, path: str) -> Response:
    mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
    if path.endswith((".js", ".mjs")):
        mime = "text/javascript"
    return http_util.Respond(request, body, mime)


def _index_js(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    # The dashboard's module when it is built, else a minimal one that lists runs.
    path = _static_file("index.js")
    if path is not None:
        return _send(request, path)
    return _send_bytes(request, FALLBACK_MODULE.encode(), "index.js")


def _static(plugin: PluginData, request: wrappers.Request, ctx: Any, eid: str) -> Any:
    prefix = f"/data/plugin/{layout.PLUGIN_NAME}/"
    rel = request.path.split(prefix, 1)[1] if prefix in request.path else ""
    rel = rel.removeprefix("static/")
    path = _static_file(rel)
    if path is None:
        raise HttpError(404, "no such route or file")
    return _send(request, path)


ROUTES: dict[str, Handler] = {
    "/runs": _runs,
    "/report": _report,
    "/kernels": _kernels,
    "/scalars": _scalars,
    "/compare": _compare,
    "/telemetry": _telemetry,
    "/distributed": _distributed,
    "/trace": _trace,
    "/timeline": _timeline,
    "/memory": _memory,
    "/oom": _oom,
    "/index.js": _index_js,
    "/*": _static,  # other dashboard assets, e.g. /static/app.css
}


def make_apps(plugin: PluginData) -> dict[str, Callable]:
    return {route: _wrap(plugin, handler) for route, handler in ROUTES.items()}
