"""The rules' old home: everything now lives in tb_gpuprof/analysis/rules/ (re-exported)."""

from __future__ import annotations

from .rules import RULES, SEVERITY_ORDER, recommend
from .rules.trace import *  # noqa: F403
from .rules.trace import TRACE_RULES

__all__ = ["RULES", "SEVERITY_ORDER", "TRACE_RULES", "recommend"]
