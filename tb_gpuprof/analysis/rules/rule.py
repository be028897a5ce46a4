"""The one object a recommendation is: :class:`Rule`.

A rule owns everything about its fix, so that adding one touches its rule file and its test:

- ``detect``: when it fires, on the report so far (and the host's GPU topology);
- ``fix``: the change per framework (``pytorch``, ``keras``, ``jax``; ``system`` for NVML's);
- ``applied_flags``: the flags a capture hook records that say the fix is in place
  (``compare`` reads them; detection stays silent on them);
- ``retiming``: its one estimator, the fix applied to a replay of the window
  (analysis/savings.py re-times it); a rule without one keeps the saving its detection gives
  (communication, the straggler, NVML's) or gives none;
- ``switch``: the in-loop switch verification uses (``"module:Class"`` of a capture-side
  class, resolved there, so the analysis never imports a framework), or
  ``not_verifiable``: why the fix cannot be switched inside a running loop;
- ``doc``: its row of docs/recommendations.md's rule table (generated: tools/rule_docs.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..whatif import Fix, Replay

Rec = dict[str, Any]


@dataclass(frozen=True)
class RuleInput:
    report: dict[str, Any]
    topology: dict[str, Any] | None = None  # tb_gpuprof.nvml.topology's dict


@dataclass(frozen=True)
class RuleDoc:
    """One row of the generated rule table."""
    fires: str
    silent: str  # already in place, or below the thresholds
    estimate: str  # what the re-timing changes, or the rule's own estimate
    bound: str = "–"  # the most the fix can remove per iteration (``removable_ms``)
    reads: str = "the trace"  # what the detection reads


# The fix for each speed-up variant (0 typical, 1 low, 2 high: whatif.SPEEDUPS), built from the
# recommendation (its evidence tunes the fix) or from None: the plain fix, as another rule's
# prerequisite.
FixBuilder = Callable[[int], Fix]


@dataclass(frozen=True)
class Retiming:
    """A rule's estimator: its fix applied to the replay of the window."""
    fix: Callable[[Rec | None, Replay], FixBuilder]
    what: Callable[[Rec], str]  # what the replay changes, for ``estimate_basis``
    # counted after this rule's fix when that rule fires too (and ``after_when`` holds): the
    # saving is what it adds after that one, and it is listed right after it
    after: str | None = None
    after_when: Callable[[Rec], bool] | None = None
    # ... and ``after`` is listed first whenever host syncs are the largest share of the
    # iteration (a compiled graph still waits at every sync)
    after_when_syncs_bound: bool = False

    def counted_after(self, rec: Rec, fired: set[str]) -> str | None:
        """The rule this estimate is counted after, when it fired."""
        if self.after is None or self.after not in fired:
            return None
        if self.after_when is not None and not self.after_when(rec):
            return None
        return self.after


@dataclass(frozen=True)
class Rule:
    id: str  # the recommendation's id
    detect: Callable[[RuleInput], Rec | None]
    doc: RuleDoc
    fix: Mapping[str, str]  # framework -> code; detection may specialise it to the run
    retiming: Retiming | None = None
    applied_flags: tuple[str, ...] = ()
    switch: str | None = None  # "module:Class" of the in-loop switch (capture/switches.py)
    not_verifiable: str | None = None  # why the fix cannot be switched in a running loop
    supersedes: tuple[str, ...] = ()  # rules whose recommendation is dropped when this fires
    # advice read from the trace's GPU work: silent on a trace with no GPU activity at all
    # (a CPU-only run)
    needs_gpu: bool = True
    # across all ranks of a window (analysis/distributed.cross_rank_summary): the summary and
    # every rank's report
    across_ranks: Callable[[dict[str, Any], list[dict[str, Any]]], Rec | None] | None = None


def on_report(fn: Callable[[dict[str, Any]], Rec | None]) -> Callable[[RuleInput], Rec | None]:
    """A detection that reads the report only."""
    return lambda inp: fn(inp.report)


def never(inp: RuleInput) -> None:
    """The detection of a rule that fires only across ranks."""
    return None
