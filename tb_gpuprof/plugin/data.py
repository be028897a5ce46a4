"""What the gpuprof plugin's routes read: runs, reports, scalars, blobs, raw traces.

Everything TensorBoard holds is read through ``context.data_provider``; raw traces (which it
does not hold) are listed from the log directory, through ``store.layout.safe_join``. With
the default Rust data server ``context.multiplexer`` is None, so everything goes through
the data provider (the same code serves ``--load_fast=false``). Decoded reports are cached per
(run, tag, step, wall time), so paging /kernels does not re-fetch and re-decode the blob.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tensorboard import errors as tb_errors
from tensorboard.data import provider
from tensorboard.plugins import base_plugin

from ..errors import GpuProfError
from ..pipeline import current_report
from ..store import layout, reader, schema
from ..store.reader import stored_identity
from .views import KernelIndex

SCALARS_PLUGIN = "scalars"
SCALAR_POINTS = 5000
DEFAULT_BLOB_SAMPLES = 100
REPORT_CACHE_SIZE = 16
TIMELINE_CACHE_SIZE = 2  # indexes of a 1M-event window take a few hundred MB each


class HttpError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class ReportRef:
    run: str
    tag: str
    step: int
    rank: int
    wall_time: float
    content: bytes


class CachedReport:
    """A decoded report plus what routes derive from it, each computed once on first use:
    its gzipped JSON (/report) and its kernel index (/kernels)."""

    __slots__ = ("_gzip", "_index", "_lock", "report")

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report
        self._gzip: bytes | None = None
        self._index: KernelIndex | None = None
        self._lock = threading.Lock()

    def gzip_json(self) -> bytes:
        with self._lock:
            if self._gzip is None:
                raw = json.dumps(self.report, separators=(",", ":")).encode()
                # Level 3 and mtime 0, as TensorBoard's own responses.
                self._gzip = gzip.compress(raw, compresslevel=3, mtime=0)
            return self._gzip

    def kernel_index(self) -> KernelIndex:
        with self._lock:
            if self._index is None:
                self._index = KernelIndex(self.report.get("kernels") or [])
            return self._index


class PluginData:
    """Everything the routes read: runs, reports (decoded and cached), scalars, blobs, raw
    traces and their timelines. Reads through ``context.data_provider``, except raw traces,
    which TensorBoard does not hold: those are listed from the log directory on disk."""

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._provider = context.data_provider
        if self._provider is None:
            raise RuntimeError("TensorBoard gave no data provider")
        self._logdir = context.logdir or ""
        self._hints = dict(context.sampling_hints or {})
        self._lock = threading.Lock()
        self._reports: OrderedDict[tuple, CachedReport] = OrderedDict()
        self._errors: dict[tuple, str | None] = {}  # decode outcome per stored report
        self._timelines: OrderedDict[tuple, Any] = OrderedDict()
        self._timeline_lock = threading.Lock()  # one trace parsed at a time

    # -- listing ------------------------------------------------------------------------------

    def scalar_tags(self, ctx: Any, eid: str, run: str | None = None) -> dict[str, list[str]]:
        """run -> sorted gpuprof/* scalar tags."""
        filt = provider.RunTagFilter(runs=[run]) if run is not None else None
        listing = self._provider.list_scalars(ctx, experiment_id=eid, plugin_name=SCALARS_PLUGIN,
                                              run_tag_filter=filt)
        out = {}
        for r, tags in listing.items():
            mine = sorted(t for t in tags if layout.is_gpuprof_tag(t))
            if mine:
                out[r] = mine
        return out

    def blob_series(self, ctx: Any, eid: str, run: str | None = None) -> dict[str, dict[str, Any]]:
        filt = provider.RunTagFilter(runs=[run]) if run is not None else None
        return self._provider.list_blob_sequences(ctx, experiment_id=eid,
                                                  plugin_name=layout.PLUGIN_NAME,
                                                  run_tag_filter=filt)

    @staticmethod
    def report_refs(run: str, series: dict[str, Any]) -> list[ReportRef]:
        refs = []
        for tag, ts in series.items():
            parsed = layout.parse_report_tag(tag)
            if parsed is not None:
                refs.append(ReportRef(run, tag, parsed[0], parsed[1], ts.max_wall_time,
                                      ts.plugin_content))
        refs.sort(key=lambda r: (r.step, r.rank))
        return refs

    def runs(self, ctx: Any, eid: str) -> list[dict[str, Any]]:
        scalars = self.scalar_tags(ctx, eid)
        blobs = self.blob_series(ctx, eid)
        out = []
        for run in sorted(set(scalars) | set(blobs)):
            series = blobs.get(run, {})
            refs = self.report_refs(run, series)
            tags = scalars.get(run, [])
            error, gpu_work = None, None
            if refs:
                latest = max(refs, key=lambda r: (r.step, -r.rank))
                error = self.report_error(ctx, eid, latest)
                if error is None:
                    stored = self.load_report(ctx, eid, latest, current=False).report
                    gpu_work = (stored.get("gpu_time_us") or 0) > 0
            out.append({
                "run": run,
                "reports": [{"step": r.step, "wall_time": r.wall_time, "rank": r.rank}
                            for r in refs],
                "scalar_tags": tags,
                "has_trace": self.trace_root(run) is not None,
                "has_telemetry": (any(layout.is_telemetry_scalar(t) for t in tags)
                                  or layout.TOPOLOGY_TAG in series),
                "error": error,
                # whether the latest report saw GPU work (None: no readable report); the
                # dashboard opens on the most recent run that has some
                "gpu_work": gpu_work,
                "wall_time": max((r.wall_time for r in refs), default=None),
            })
        return out

    def known_run(self, ctx: Any, eid: str, run: str) -> None:
        runs = {r.run_name for r in self._provider.list_runs(ctx, experiment_id=eid)}
        if run not in runs:
            raise HttpError(404, f"no run named {run!r}")

    # -- reports ------------------------------------------------------------------------------

    def find_report(self, ctx: Any, eid: str, run: str, step: int | None,
                    rank: int | None) -> ReportRef:
        refs = self.report_refs(run, self.blob_series(ctx, eid, run).get(run, {}))
        if not refs:
            self.known_run(ctx, eid, run)
            raise HttpError(404, f"run {run!r} has no gpuprof report (only scalars or other data)")
        if step is None:
            step = max(r.step for r in refs)
        at_step = [r for r in refs if r.step == step and (rank is None or r.rank == rank)]
        if not at_step:
            steps = ", ".join(str(s) for s in sorted({r.step for r in refs}))
            which = f"step {step}" + (f" rank {rank}" if rank is not None else "")
            raise HttpError(404, f"run {run!r} has no report at {which} (steps: {steps})")
        return min(at_step, key=lambda r: r.rank)

    def rank_reports(self, ctx: Any, eid: str, run: str,
                     step: int | None) -> tuple[str, list[ReportRef]]:
        """(base run, one report per rank at ``step``) of a multi-process run.

        Rank 0 writes into the run, rank r > 0 into the sub-run ``<run>/rank<r>``; reports of
        several ranks in one run (tags ``gpuprof/report/<step>/rank<r>``) count too. ``run``
        may name the base run or any rank's sub-run. Default step: the latest one of rank 0.
        """
        blobs = self.blob_series(ctx, eid)
        parent = layout.parse_rank_run_name(run)
        base = parent[0] if parent and parent[0] in blobs else run
        if base not in blobs:
            self.known_run(ctx, eid, run)
            raise HttpError(404, f"run {run!r} has no gpuprof report (only scalars or other data)")
        refs = list(self.report_refs(base, blobs[base]))
        for name, series in blobs.items():
            sub = layout.parse_rank_run_name(name)
            if sub and sub[0] == base:
                # a report stored without a rank tag in rank r's sub-run is rank r's
                refs.extend(ref if ref.rank else dataclasses.replace(ref, rank=sub[1])
                            for ref in self.report_refs(name, series))
        if not refs:
            raise HttpError(404, f"run {base!r} has no gpuprof report (only scalars or other data)")
        if step is None:
            step = max(r.step for r in refs if r.rank == min(x.rank for x in refs))
        by_rank: dict[int, ReportRef] = {}
        for ref in refs:  # the latest write of each rank's window wins
            if ref.step == step and (ref.rank not in by_rank
                                     or ref.wall_time > by_rank[ref.rank].wall_time):
                by_rank[ref.rank] = ref
        if not by_rank:
            steps = ", ".join(str(s) for s in sorted({r.step for r in refs}))
            raise HttpError(404, f"run {base!r} has no report at step {step} (steps: {steps})")
        return base, [by_rank[r] for r in sorted(by_rank)]

    def load_report(self, ctx: Any, eid: str, ref: ReportRef, *,
                    current: bool = True) -> CachedReport:
        """Report of ``ref``; HttpError 422 when it cannot be read. ``current``: as the
        installed analysis makes it (pipeline.current_report: a report an older analysis
        stored is rebuilt from the run's raw trace and cached beside the run), else as
        stored (enough to list runs)."""
        key = (eid, ref.run, ref.tag, ref.step, ref.wall_time, current)
        with self._lock:
            cached = self._reports.get(key)
            if cached is not None:
                self._reports.move_to_end(key)
                return cached
            known_error = self._errors.get(key[:-1])
        if known_error is not None:
            raise HttpError(422, known_error)
        where = f"run {ref.run!r} step {ref.step}"
        try:
            schema.check_content(schema.parse_plugin_content(ref.content), where)
            blob = self._fetch_blob(ctx, eid, ref)
            report = schema.decode_report(blob, ref.content, where)
            run_dir = self._run_dir(ref.run) if current else None
            if run_dir is not None:
                report = current_report(run_dir, report, ref.step, ref.rank,
                                        stored_identity(ref.wall_time, blob))
            cached = CachedReport(report)
        except GpuProfError as e:
            with self._lock:
                self._errors[key[:-1]] = str(e)
            raise HttpError(422, str(e)) from None
        with self._lock:
            self._errors[key[:-1]] = None
            self._reports[key] = cached
            while len(self._reports) > REPORT_CACHE_SIZE:
                self._reports.popitem(last=False)
        return cached

    def report_error(self, ctx: Any, eid: str, ref: ReportRef) -> str | None:
        key = (eid, ref.run, ref.tag, ref.step, ref.wall_time)
        with self._lock:
            if key in self._errors:
                return self._errors[key]
        try:
            self.load_report(ctx, eid, ref, current=False)
        except HttpError as e:
            return e.message
        return None

    def _fetch_blob(self, ctx: Any, eid: str, ref: ReportRef) -> bytes:
        data = self.read_blobs(ctx, eid, ref.run, ref.tag)
        at_step = [d for d in data if d.step == ref.step and d.values]
        if not at_step:
            raise schema.StoredDataError(f"run {ref.run!r} step {ref.step}: report data missing")
        datum = max(at_step, key=lambda d: d.wall_time)
        try:
            blob = self._provider.read_blob(ctx, blob_key=datum.values[0].blob_key)
        except tb_errors.NotFoundError:
            raise schema.StoredDataError(
                f"run {ref.run!r} step {ref.step}: report data missing") from None
        return bytes(blob)

    def read_blobs(self, ctx: Any, eid: str, run: str, tag: str) -> list[Any]:
        result = self._provider.read_blob_sequences(
            ctx, experiment_id=eid, plugin_name=layout.PLUGIN_NAME,
            downsample=self._hints.get(layout.PLUGIN_NAME, DEFAULT_BLOB_SAMPLES),
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]))
        return list(result.get(run, {}).get(tag, []))

    def latest_json(self, ctx: Any, eid: str, run: str, tag: str) -> Any:
        """The latest value of a gpuprof JSON blob tag (e.g. topology), or None."""
        data = [d for d in self.read_blobs(ctx, eid, run, tag) if d.values]
        if not data:
            return None
        datum = max(data, key=lambda d: (d.step, d.wall_time))
        blob = self._provider.read_blob(ctx, blob_key=datum.values[0].blob_key)
        try:
            return schema.decode_json(bytes(blob), f"run {run!r} tag {tag}")
        except GpuProfError as e:
            raise HttpError(422, str(e)) from None

    # -- scalars ------------------------------------------------------------------------------

    def read_scalars(self, ctx: Any, eid: str, run: str, tags: list[str]) -> dict[str, list]:
        result = self._provider.read_scalars(
            ctx, experiment_id=eid, plugin_name=SCALARS_PLUGIN, downsample=SCALAR_POINTS,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=tags))
        return {tag: [[d.step, d.wall_time, d.value] for d in data]
                for tag, data in result.get(run, {}).items()}

    # -- raw traces ---------------------------------------------------------------------------

    def _run_dir(self, run: str) -> str | None:
        """The run's directory inside the log directory, or None if it would leave it."""
        if not self._logdir:
            return None
        return layout.safe_join(self._logdir, *run.split("/"))

    def oom_reports(self, run: str) -> list[dict[str, Any]]:
        """The run's out-of-memory reports (store/reader.oom_reports_in), as written; none
        where the run would leave the log directory. An unreadable file is left out."""
        run_dir = self._run_dir(run)
        if run_dir is None or not os.path.isdir(run_dir):
            return []
        out = []
        for path in reader.oom_reports_in(run_dir):
            try:
                with open(path, encoding="utf-8") as f:
                    report = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(report, dict):
                out.append(report)
        return out

    def trace_root(self, run: str) -> str | None:
        run_dir = self._run_dir(run)
        if run_dir is None:
            return None
        root = layout.safe_join(run_dir, *layout.TRACES_SUBDIR)
        return root if root is not None and os.path.isdir(root) else None

    def trace_file(self, run: str, step: int | None, rank: int | None) -> str:
        """Path of the raw trace of a run's window; HttpError 404 when there is none."""
        root = self.trace_root(run)
        if root is None:
            raise HttpError(404, f"run {run!r} has no raw traces")
        windows = []
        for name in os.listdir(root):
            parsed = layout.parse_trace_dir_name(name)
            if parsed:
                windows.append((*parsed, name))
        if step is None and windows:
            step = max(w[0] for w in windows)
        matching = sorted(w for w in windows
                          if w[0] == step and (rank is None or w[1] == rank))
        for _, _, name in matching:
            window_dir = layout.safe_join(root, name)
            if window_dir is None or not os.path.isdir(window_dir):
                continue
            for entry in sorted(os.listdir(window_dir)):
                path = os.path.join(window_dir, entry)
                # Regular files only (no symlinks), never a copy in progress nor the context.
                if (layout.is_raw_trace_entry(entry) and not os.path.islink(path)
                        and os.path.isfile(path) and layout.safe_join(root, name, entry)):
                    return path
        raise HttpError(404, f"run {run!r} has no raw trace for step {step}")


    # -- timeline -----------------------------------------------------------------------------

    def timeline(self, path: str, report: dict[str, Any], report_key: float) -> Any:
        """The TimelineIndex of a window's raw trace, parsed once and kept for the next pans."""
        from ..readers import load_profile
        from .timeline import TimelineIndex

        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size, report_key)
        with self._timeline_lock:
            index = self._timelines.get(key)
            if index is None:
                index = TimelineIndex(load_profile(path), report)
                self._timelines[key] = index
                while len(self._timelines) > TIMELINE_CACHE_SIZE:
                    self._timelines.popitem(last=False)
            self._timelines.move_to_end(key)
            return index
