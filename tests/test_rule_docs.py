"""The rule table of docs/recommendations.md is the registry's (tools/rule_docs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tb_gpuprof.analysis.rules import RULES

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "rule_docs.py"
DOC = REPO / "docs" / "recommendations.md"


def _check(doc_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the tool's --check on a copy of the repository's docs holding ``doc_text``."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "recommendations.md").write_text(doc_text, encoding="utf-8")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "rule_docs.py").write_text(TOOL.read_text(encoding="utf-8"))
    tool = str(tmp_path / "tools" / "rule_docs.py")
    return subprocess.run([sys.executable, tool, "--check"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)


def test_the_docs_table_is_the_registry(tmp_path: Path) -> None:
    done = _check(DOC.read_text(encoding="utf-8"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    text = DOC.read_text(encoding="utf-8")
    for rule in RULES:  # every registered rule has its row, with its own fires-when text
        assert f"| `{rule.id}` | {rule.doc.reads} | " in text


def test_a_hand_edit_of_the_table_is_stale(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8").replace("| `tf32` |", "| `tf32_renamed` |", 1)
    done = _check(text, tmp_path)
    assert done.returncode == 1 and "stale" in done.stdout


def test_every_rule_owns_a_fix_and_a_verification_answer() -> None:
    for rule in RULES:
        assert rule.fix, rule.id
        # verification either switches the fix in the loop or says why it cannot
        assert (rule.switch is None) != (rule.not_verifiable is None), rule.id
