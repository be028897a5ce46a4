"""One measurement condition per fresh process, for the gpu/ studies: the script runs itself
with ``--cond NAME`` and prints one JSON line; this runs it and reads that line back."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def run_condition(script: str, cond: str, args: list[str], timeout: float) -> dict[str, Any]:
    """The condition's JSON result, or ``{"cond": cond, "error": ...}`` (a crash, a timeout,
    no JSON line): one failed condition never stops the others."""
    cmd = [sys.executable, script, "--cond", cond, *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"cond": cond, "error": f"timed out after {timeout:.0f} s"}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"cond": cond, "error": f"rc={p.returncode}: {p.stderr[-300:]}"}
    try:
        out = json.loads(lines[-1])
    except ValueError:
        return {"cond": cond, "error": f"no JSON result: {lines[-1][-300:]}"}
    return out if isinstance(out, dict) else {"cond": cond, "error": "not a JSON object"}
