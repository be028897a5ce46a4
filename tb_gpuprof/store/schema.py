"""How tb_gpuprof data sits in TensorBoard event files: blob encoding, size bound (tag and
file names: layout.py).

Reports and other JSON objects are stored as one-element blob sequences (a string tensor of
shape [1]) with ``plugin_name`` "gpuprof" and ``data_class`` BLOB_SEQUENCE, which both the
Rust data server and the Python loader (``--load_fast=false``) keep. Each report window gets
its own tag (``gpuprof/report/<step>``), so a tag holds one sample and reservoir sampling
never drops a window, whatever ``--samples_per_plugin`` says. See docs/storage.md.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from .. import REPORT_SCHEMA_VERSION
from ..errors import SchemaVersionError, StoredDataError

ENCODING = "json+zlib"
STORAGE_VERSION = 1  # of the blob layout below, independent of the report schema

# Size bound of one stored report. The compressed blob stays far below TensorBoard's gRPC
# message limit (256 MiB) and the uncompressed JSON bounds what the plugin keeps in memory
# per cached report. A report over either bound keeps its largest kernels only.
MAX_COMPRESSED_BYTES = 4 * 1024 * 1024
MAX_JSON_BYTES = 48 * 1024 * 1024


def plugin_content(kind: str, schema_version: int | None = None) -> bytes:
    """``SummaryMetadata.plugin_data.content``: lets a reader check versions without the blob."""
    meta: dict[str, Any] = {"storage_version": STORAGE_VERSION, "kind": kind, "encoding": ENCODING}
    if schema_version is not None:
        meta["schema_version"] = schema_version
    return json.dumps(meta, separators=(",", ":")).encode()


def parse_plugin_content(content: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(content.decode() or "{}")
    except (UnicodeDecodeError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _compress(obj: Any) -> tuple[bytes, int]:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return zlib.compress(raw, 6), len(raw)


def encode_json(obj: Any) -> bytes:
    """Any JSON-able object (topology, ...) as a compressed blob; no size bound beyond the max."""
    blob, raw_len = _compress(obj)
    if len(blob) > MAX_COMPRESSED_BYTES or raw_len > MAX_JSON_BYTES:
        raise ValueError(f"gpuprof blob too large: {raw_len} bytes of JSON")
    return blob


def encode_report(report: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """Compress ``report``, cutting its kernel list (largest first kept) to fit the size bound.

    Returns the blob and the report it holds (``report`` itself when nothing was cut).
    """
    if not isinstance(report, dict) or not isinstance(report.get("schema_version"), int):
        raise ValueError("not a tb_gpuprof report: needs an integer 'schema_version'")
    blob, raw_len = _compress(report)
    if len(blob) <= MAX_COMPRESSED_BYTES and raw_len <= MAX_JSON_BYTES:
        return blob, report
    kernels = list(report.get("kernels") or [])
    total = report.get("kernels_total") or len(kernels)

    def cut(n: int) -> dict[str, Any]:
        warning = (f"kernel list cut to the {n} largest of {total} to fit the stored report "
                   f"size bound ({MAX_COMPRESSED_BYTES // (1024 * 1024)} MiB compressed)")
        return {**report, "kernels": kernels[:n], "kernels_total": total,
                "warnings": [*(report.get("warnings") or []), warning]}

    # Binary search for the longest kernel prefix that fits; the rest of the report is small.
    lo, hi, best = 0, len(kernels), None
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = cut(mid)
        blob, raw_len = _compress(candidate)
        if len(blob) <= MAX_COMPRESSED_BYTES and raw_len <= MAX_JSON_BYTES:
            best, lo = (blob, candidate), mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise ValueError("report too large to store even without its kernel list")
    return best


def decode_json(blob: bytes, where: str) -> Any:
    """Inverse of the encoders; ``where`` names the run/step in error messages."""
    try:
        d = zlib.decompressobj()
        raw = d.decompress(blob, MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise StoredDataError(f"{where}: stored report exceeds {MAX_JSON_BYTES} bytes")
        if not d.eof:
            raise StoredDataError(f"{where}: stored report is truncated")
        return json.loads(raw)
    except zlib.error as e:
        raise StoredDataError(f"{where}: stored report is corrupt ({e})") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise StoredDataError(f"{where}: stored report is not valid JSON ({e})") from None


def check_content(meta: dict[str, Any], where: str) -> None:
    """Refuse blobs written by a newer tb_gpuprof before decoding them."""
    storage = meta.get("storage_version", STORAGE_VERSION)
    if isinstance(storage, int) and storage > STORAGE_VERSION:
        raise SchemaVersionError(f"{where}: stored with gpuprof storage version {storage}; this "
                                 f"tb_gpuprof reads up to {STORAGE_VERSION}; upgrade tb_gpuprof")
    if meta.get("encoding", ENCODING) != ENCODING:
        raise StoredDataError(f"{where}: unknown blob encoding {meta.get('encoding')!r}")
    check_schema_version(meta.get("schema_version"), where, required=False)


def check_schema_version(version: Any, where: str, *, required: bool = True) -> None:
    if version is None and not required:
        return
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StoredDataError(f"{where}: report has no valid schema_version ({version!r})")
    if version > REPORT_SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where}: report schema_version {version} is newer than this tb_gpuprof reads "
            f"({REPORT_SCHEMA_VERSION}); upgrade tb_gpuprof")


def decode_report(blob: bytes, content: bytes, where: str) -> dict[str, Any]:
    """Decode and version-check one stored report."""
    check_content(parse_plugin_content(content), where)
    report = decode_json(blob, where)
    if not isinstance(report, dict):
        raise StoredDataError(f"{where}: stored report is not a JSON object")
    check_schema_version(report.get("schema_version"), where)
    return report
