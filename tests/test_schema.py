"""The typed report contract (tb_gpuprof/analysis/schema.py): real reports validate, drift
fails, `tb-gpuprof schema` prints the JSON Schema that the frontend types are generated from,
and docs/report-schema.md names every field.

Every report the suite builds is validated as it is built (build_report's last step, strict
because conftest.py sets TB_GPUPROF_STRICT_SCHEMA for the session and its child processes);
this file checks that the validation itself can fail, and the other readers of the schema.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from tb_gpuprof.analysis.schema import (
    STRICT_ENV,
    check_built_report,
    json_schema,
    validate_built_report,
    validate_report,
)
from tb_gpuprof.errors import ReportSchemaError

from .conftest import run_cli
from .h200 import loop_report, report

REPO = Path(__file__).resolve().parents[1]
FIRST_VERSION = REPO / "tests" / "data" / "stored_reports"
SECTIONS = {"Report", "Iterations", "Kernel", "TensorCores", "Breakdown", "Phases", "Bottleneck",
            "Telemetry", "Distributed", "Recommendation", "Throughput", "System"}


@pytest.fixture(scope="module")
def fp32() -> dict:
    return report("resnet50_fp32")


def test_the_suite_builds_reports_strictly() -> None:
    # what makes every report of the suite (and of its subprocesses) a schema test
    assert os.environ.get(STRICT_ENV) == "1"


def test_cli_prints_the_json_schema_of_every_section() -> None:
    schema = json.loads(run_cli("schema").stdout)
    assert schema["$ref"] == "#/$defs/Report"
    assert SECTIONS <= set(schema["$defs"])
    assert schema == json_schema()
    kernel = schema["$defs"]["Kernel"]
    assert kernel["additionalProperties"] is False and "total_us" in kernel["required"]


@pytest.mark.parametrize("case", ["resnet50_fp32", "resnet50_amp_cl", "mlp_compiled_small"])
def test_built_reports_validate_against_the_json_schema(case: str) -> None:
    # the same contract through the JSON Schema (what report.gen.ts is generated from), on
    # the report as the CLI and the store serialize it
    rep = json.loads(json.dumps(report(case)))
    jsonschema.validate(rep, json_schema())
    validate_built_report(rep)


def test_a_hook_run_with_unprofiled_time_validates() -> None:
    rep = loop_report("gpt2_eager")
    assert rep["iterations"]["unprofiled_median_ms"] is not None
    jsonschema.validate(json.loads(json.dumps(rep)), json_schema())


@pytest.mark.parametrize("run", ["resnet50_fp32", "resnet50_amp", "resnet50_amp_channels_last"])
def test_stored_sample_reports_from_before_later_fields_still_validate(run: str) -> None:
    # as the first version stored them (tests/data/stored_reports/README.md)
    rep = json.loads((FIRST_VERSION / f"{run}.first_version.report.json").read_text())
    validate_report(rep)
    jsonschema.validate(rep, json_schema())
    with pytest.raises(ReportSchemaError, match="lacks"):
        validate_built_report(rep)  # a report built now must have every field


def test_an_unknown_field_fails(fp32: dict) -> None:
    rep = copy.deepcopy(fp32)
    rep["kernels"][0]["warp_stalls"] = 3
    with pytest.raises(ReportSchemaError, match=r"warp_stalls.*\$\.kernels\[0\]"):
        validate_report(rep)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rep, json_schema())


def test_a_missing_or_mistyped_field_fails(fp32: dict) -> None:
    rep = copy.deepcopy(fp32)
    del rep["tensor_cores"]["tc_pct"]
    with pytest.raises(ReportSchemaError, match="tc_pct"):
        validate_report(rep)
    rep = copy.deepcopy(fp32)
    rep["iterations"]["count"] = "three"
    with pytest.raises(ReportSchemaError, match=r"\$\.iterations\.count"):
        validate_report(rep)
    rep = copy.deepcopy(fp32)
    rep["recommendations"][0]["severity"] = "urgent"
    with pytest.raises(ReportSchemaError, match="severity"):
        validate_report(rep)


def test_a_newer_schema_version_fails(fp32: dict) -> None:
    rep = copy.deepcopy(fp32)
    rep["schema_version"] += 1
    with pytest.raises(ReportSchemaError, match="schema_version"):
        validate_report(rep)


def test_a_built_report_that_drifted_warns_unless_strict(fp32: dict,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rep = copy.deepcopy(fp32)
    rep["throughput"]["mfu"] = 1.0
    with pytest.raises(ReportSchemaError):
        check_built_report(rep)
    monkeypatch.delenv(STRICT_ENV)
    check_built_report(rep)  # a user's analysis is kept, with the bug named
    assert "mfu" in rep["warnings"][-1] and "does not match the schema" in rep["warnings"][-1]


def _properties(schema: dict) -> dict[str, set[str]]:
    return {name: set(d.get("properties", {})) for name, d in schema["$defs"].items()}


def test_docs_name_every_field_of_the_schema() -> None:
    doc = (REPO / "docs" / "report-schema.md").read_text(encoding="utf-8")
    documented = set(re.findall(r'"([a-z_0-9]+)"\s*:', doc)) | set(
        re.findall(r"`([a-z_0-9]+)`", doc))
    missing = {f"{section}.{field}" for section, fields in _properties(json_schema()).items()
               for field in fields if field not in documented}
    assert not missing, f"docs/report-schema.md does not describe {sorted(missing)}"


def test_the_frontend_schema_is_the_backends() -> None:
    # frontend/report.schema.json is what report.gen.ts is generated from; CI regenerates it
    # with `tb-gpuprof schema`, so a schema change without regenerating fails here first
    committed = (REPO / "frontend" / "report.schema.json").read_text(encoding="utf-8")
    assert committed == run_cli("schema").stdout, \
        "run `python -m tb_gpuprof schema > frontend/report.schema.json && " \
        "(cd frontend && npm run build)` and commit both"


def test_the_committed_frontend_types_are_generated_from_it() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (CI runs the same check in .ci/run)")
    proc = subprocess.run([node, str(REPO / "frontend" / "gen_types.mjs"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    gen = (REPO / "frontend" / "src" / "report.gen.ts").read_text(encoding="utf-8")
    for section in SECTIONS:
        assert f"export interface {section} " in gen
