"""Every kind of bad trace file: one line naming the file and the problem, never a traceback."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tb_gpuprof.errors import TraceReadError, UnknownFormatError
from tb_gpuprof.readers import load_profile

from .nsys_builder import NsysExport


def _truncated_json(src: Path, d: Path) -> Path:
    text = gzip.decompress(src.read_bytes())
    (d / "truncated.json").write_bytes(text[: len(text) // 2])
    return d / "truncated.json"


def _one_line(src: Path) -> bytes:
    """The fixture as json.dump writes it: the whole trace on one line."""
    return json.dumps(json.loads(gzip.decompress(src.read_bytes()))).encode()


def _truncated_one_line(src: Path, d: Path) -> Path:
    text = _one_line(src)
    (d / "truncated_line.json").write_bytes(text[: len(text) * 2 // 3])
    return d / "truncated_line.json"


def _truncated_one_line_gzip(src: Path, d: Path) -> Path:
    text = _one_line(src)
    (d / "truncated_line.json.gz").write_bytes(gzip.compress(text[: len(text) // 3]))
    return d / "truncated_line.json.gz"


def _garbage_inside_one_line(src: Path, d: Path) -> Path:
    text = bytearray(_one_line(src))
    middle = len(text) // 2
    text[middle:middle + 64] = bytes(range(1, 65))  # binary noise in the event list
    (d / "noisy_line.json").write_bytes(bytes(text))
    return d / "noisy_line.json"


def _truncated_gzip(src: Path, d: Path) -> Path:
    data = src.read_bytes()
    (d / "truncated.json.gz").write_bytes(data[: len(data) // 2])
    return d / "truncated.json.gz"


def _corrupt_gzip(src: Path, d: Path) -> Path:
    data = bytearray(src.read_bytes())
    data[100:4000] = bytes(3900)  # zeroed deflate blocks
    (d / "corrupt.pt.trace.json.gz").write_bytes(bytes(data))
    return d / "corrupt.pt.trace.json.gz"


def _json_file(text: str, name: str):
    def make(_src: Path, d: Path) -> Path:
        (d / name).write_text(text)
        return d / name
    return make


def _bytes_file(data: bytes, name: str):
    def make(_src: Path, d: Path) -> Path:
        (d / name).write_bytes(data)
        return d / name
    return make


def _sqlite_not_nsys(_src: Path, d: Path) -> Path:
    con = sqlite3.connect(d / "notes.sqlite")
    con.execute("CREATE TABLE notes (id INTEGER, text TEXT)")
    con.execute("INSERT INTO notes VALUES (1, 'hello')")
    con.commit()
    con.close()
    return d / "notes.sqlite"


def _truncated_sqlite(_src: Path, d: Path) -> Path:
    ex = NsysExport()
    for i in range(2000):
        ex.launch(1_000_000 + i * 10_000, 5_000, f"kernel_{i}")
    path = Path(ex.write(d / "full.sqlite"))
    (d / "cut.sqlite").write_bytes(path.read_bytes()[:12_000])
    return d / "cut.sqlite"


CASES = {
    "truncated json": (_truncated_json, "truncated"),
    "truncated gzip": (_truncated_gzip, "truncated"),
    "truncated one-line json": (_truncated_one_line, "truncated"),
    "truncated one-line json in gzip": (_truncated_one_line_gzip, "truncated"),
    "garbage inside one-line json": (_garbage_inside_one_line, "JSON"),
    "corrupt gzip": (_corrupt_gzip, "gzip"),
    "garbage": (_bytes_file(bytes(range(7, 256)) * 40, "garbage.json"), "not a Kineto"),
    "garbage starting like json": (_bytes_file(b"{\x00\x01 what is this", "g.json"), "JSON"),
    "empty file": (_bytes_file(b"", "empty.json"), "empty"),
    "empty gzip": (_bytes_file(gzip.compress(b""), "empty.json.gz"), "empty"),
    "json not a trace": (_json_file('{"model": "resnet", "epochs": 3}', "cfg.json"),
                         "traceEvents"),
    "json list of numbers": (_json_file("[1, 2, 3]", "nums.json"), "not a Kineto trace"),
    "missing file": (lambda _s, d: d / "nope.pt.trace.json", "no such file"),
    "directory": (lambda _s, d: d, "directory"),
    "sqlite that is not an nsys export": (_sqlite_not_nsys, "not an Nsight Systems export"),
    "non-sqlite named .sqlite": (_bytes_file(b"hello, not a database\n" * 10, "run.sqlite"),
                                 "not an SQLite file"),
    "truncated sqlite": (_truncated_sqlite, "SQLite"),
    "nsys-rep not exported": (_bytes_file(b"\x00NSYS" + bytes(200), "run.nsys-rep"),
                              "nsys export"),
}


@pytest.fixture(params=sorted(CASES))
def bad_file(request, kineto_trace, tmp_path):
    make, expected = CASES[request.param]
    return make(kineto_trace, tmp_path), expected


def test_reader_raises_one_line_naming_file_and_problem(bad_file):
    path, expected = bad_file
    with pytest.raises(TraceReadError) as info:
        load_profile(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert expected in message


def test_unknown_format_is_its_own_type(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"MZ\x90\x00" * 100)
    with pytest.raises(UnknownFormatError):
        load_profile(path)


def test_cli_report_exits_2_with_one_stderr_line(bad_file):
    path, expected = bad_file
    proc = subprocess.run([sys.executable, "-m", "tb_gpuprof", "report", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert str(path) in lines[0]
    if not path.is_dir():  # the CLI reads a directory as a log directory, with its own message
        assert expected in lines[0]
    assert proc.stdout == ""
