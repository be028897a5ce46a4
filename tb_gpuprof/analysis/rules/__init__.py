"""Every recommendation rule, in one registry, with declared precedence.

A rule reads :class:`RuleInput` (the report so far, and the host's GPU topology when the
caller has one) and returns a recommendation (build.py's ``recommendation``) or None. Rules
come from the trace (trace.py), distributed training (distributed.py) and NVML telemetry and
topology (nvml.py). ``supersedes`` names rules whose recommendation is dropped when this one
fires: a bigger batch (NVML's batch_size) is no advice while the input pipeline stalls.

Adding a rule: write the function next to its kind, add one ``Rule`` line to :data:`RULES`,
document it in docs/recommendations.md (docs/design.md, "How to add").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import distributed, nvml, trace
from .build import SEVERITY_ORDER, by_saving, recommendation

Rec = dict[str, Any]


@dataclass(frozen=True)
class RuleInput:
    report: dict[str, Any]
    topology: dict[str, Any] | None = None  # tb_gpuprof.nvml.topology's dict


@dataclass(frozen=True)
class Rule:
    name: str  # unique; the recommendation's id unless two rules give the same advice
    check: Callable[[RuleInput], Rec | None]
    supersedes: tuple[str, ...] = ()
    # advice read from the trace's GPU work: silent on a trace with no GPU activity at all
    # (a CPU-only run)
    needs_gpu: bool = True


def _on_report(fn: Callable[[dict[str, Any]], Rec | None]) -> Callable[[RuleInput], Rec | None]:
    return lambda inp: fn(inp.report)


def _on_telemetry(fn: Callable[[dict[str, Any] | None], Rec | None]
                  ) -> Callable[[RuleInput], Rec | None]:
    return lambda inp: fn(inp.report.get("telemetry")) if inp.report.get("telemetry") else None


# Order is the tie-break among equal savings and severities (the registry's order is kept).
RULES: tuple[Rule, ...] = (
    *(Rule(fn.__name__.removeprefix("rule_"), _on_report(fn),
           ("nvml_batch_size",) if fn in (trace.rule_batch_size, trace.rule_input_pipeline)
           else ())
      for fn in trace.TRACE_RULES),
    Rule("communication", _on_report(distributed.rule_communication), needs_gpu=False),
    Rule("distributed_backend", _on_report(distributed.rule_distributed_backend),
         needs_gpu=False),
    # NVML's rules judge the GPUs' own telemetry and topology, not the trace: a trace
    # without GPU activity (CUDA activity not recorded) does not silence them
    Rule("throttling", _on_telemetry(nvml.throttling_advice), needs_gpu=False),
    Rule("nvml_batch_size", _on_telemetry(nvml.batch_size_advice), needs_gpu=False),
    Rule("gpu_placement", lambda inp: nvml.gpu_placement_advice(inp.topology),
         needs_gpu=False),
)


def has_gpu_activity(report: dict[str, Any]) -> bool:
    """Whether the window holds any GPU work (kernels, copies, memsets)."""
    return bool(report.get("kernels")) or bool(report.get("gpu_time_us"))


def recommend(report: dict[str, Any], topology: dict[str, Any] | None = None,
              rules: tuple[Rule, ...] = RULES) -> list[Rec]:
    """The recommendations that fire and are not superseded, largest saving first."""
    inp = RuleInput(report, topology)
    gpu = has_gpu_activity(report)
    fired = [(rule, rec) for rule in rules
             if (gpu or not rule.needs_gpu) and (rec := rule.check(inp)) is not None]
    dropped = {name for rule, _ in fired for name in rule.supersedes}
    return by_saving([rec for rule, rec in fired if rule.name not in dropped])


__all__ = ["RULES", "SEVERITY_ORDER", "Rule", "RuleInput", "by_saving", "has_gpu_activity",
           "recommend", "recommendation"]
