"""readers/__init__.py's registry: every registered format round-trips on real files, and a
format added to READERS is sniffed, read and analysed without touching anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from tb_gpuprof import readers
from tb_gpuprof.analysis.report import build_report
from tb_gpuprof.errors import UnknownFormatError
from tb_gpuprof.model import STEP, Annotation, GpuActivity, Profile

DATA = Path(__file__).parent / "data"
REAL = sorted([*DATA.rglob("*.json.gz"), *DATA.rglob("*.xplane.pb")])


def test_the_registry_names_each_format_once():
    formats = [r.format for r in readers.READERS]
    assert len(formats) == len(set(formats)) and {"kineto", "xplane", "nsys"} <= set(formats)
    assert readers.reader_for("nsys").format == "nsys"
    with pytest.raises(KeyError):
        readers.reader_for("nope")


@pytest.mark.parametrize("path", REAL[:: max(1, len(REAL) // 6)], ids=lambda p: p.name)
def test_sniffed_format_is_the_format_its_reader_returns(path):
    fmt = readers.sniff_format(str(path))
    assert readers.reader_for(fmt).load(str(path)).format == fmt


def test_nsys_export_is_sniffed_and_read(tmp_path):
    from tests.nsys_builder import NsysExport  # an SQLite export in nsys' documented schema

    ex = NsysExport()
    ex.launch(1_000_000, 300_000, "volta_sgemm_128x64_nn")
    path = ex.write(tmp_path / "run.sqlite")
    assert readers.sniff_format(str(path)) == "nsys"
    assert readers.load_profile(path).format == "nsys"


MAGIC = b"#steps-csv\n"


def _read_steps_csv(path: str) -> Profile:
    """A tiny made-up format: "step,start_us,dur_us,kernel" per line."""
    prof = Profile(path, "steps-csv")
    for line in Path(path).read_text().splitlines()[1:]:
        step, start, dur, kernel = line.split(",")
        prof.annotations.append(Annotation(f"step {step}", float(start), float(dur), kind=STEP,
                                           step=int(step)))
        prof.gpu.append(GpuActivity("kernel", kernel, float(start) + 1.0, float(dur) / 2))
    return prof


def test_a_registered_reader_needs_no_other_change(tmp_path, monkeypatch):
    path = tmp_path / "run.txt"
    path.write_bytes(MAGIC + b"".join(f"{i},{i * 100},90,volta_sgemm_128x64_nn\n".encode()
                                      for i in range(4)))
    with pytest.raises(UnknownFormatError):
        readers.load_profile(path)
    monkeypatch.setattr(readers, "READERS", [*readers.READERS, readers.Reader(
        "steps-csv", lambda head, name: head.startswith(MAGIC), _read_steps_csv)])
    prof = readers.load_profile(path)
    assert prof.format == "steps-csv" and len(prof.gpu) == 4
    rep = build_report(prof)
    assert rep["source"]["format"] == "steps-csv"
    assert rep["iterations"]["count"] == 4 and rep["kernels"][0]["count"] == 4
