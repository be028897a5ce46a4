"""Pool the analysis replays of several hook_alternation.py records (issue 13).

One process gives 8-16 replay pairs (an *on* block while the window's analysis runs again,
the *off* block beside it); the launch-bound loop's pairs spread 0.86-1.28x, so one process
cannot place the median within a few percent. This pools every pair of the records given,
per hook, workload and child thread setting (``child_thread_limits``), and reports the
median and mean on/off ratio with 90% bootstrap intervals: over all pairs, and over the pairs
whose two blocks began in the same host state (their pure-Python probes within STEADY_SPREAD
of each other, the rule of the always-on pairs). ``--phase before`` / ``--phase after`` pool
the always-on pairs and the pairs after the window the same way.

    python3 gpu/pool_replays.py benchmarks/records/h200_2026-12-02_ninth/*.json
    python3 gpu/pool_replays.py --phase before benchmarks/records/h200_2026-12-03_*/*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hook_alternation import STEADY_SPREAD, mixed_pairs, summary


def replay_pairs(record: dict[str, Any]) -> list[tuple[float, bool]]:
    """(on / off, both probes in one host state) of each replay pair of one record; its
    ``replay_blocks`` rows are [on, iterations, ms per iteration, probe ms]."""
    return [(on[2] / off[2], max(on[3], off[3]) <= STEADY_SPREAD * min(on[3], off[3]))
            for _, on, off in mixed_pairs(record.get("replay_blocks") or [], lambda r: r[0])]


def phase_pairs(record: dict[str, Any], phase: str) -> list[tuple[float, bool]]:
    """(hooked / bare, both probes in one host state) of each pair of blocks of one phase
    (``before``: always-on, ``after``: after the window); ``blocks`` rows are [hooked, ms,
    probe, analysis, cpu ms, wait ms, probe after the pair]. Records older than the last
    column hold one probe per pair, so every pair of theirs counts as steady."""
    out = []
    for first, hooked, bare in mixed_pairs((record.get("blocks") or {}).get(phase) or [],
                                           lambda r: r[0]):
        probes = (first[2], first[6] if len(first) > 6 else first[2])
        out.append((hooked[1] / bare[1], max(probes) <= STEADY_SPREAD * min(probes)))
    return out


def pooled(records: list[dict[str, Any]], phase: str = "replays"
           ) -> dict[str, dict[str, Any]]:
    """Group name -> pooled figures of the analysis replays, or of a phase's pairs."""
    groups: dict[str, list[tuple[float, bool]]] = {}
    for rec in records:
        name = " ".join([rec["hook"], rec["workload"]] + [
            part for part, present in ((f"b{rec.get('batch')}", rec.get("batch")),
                                       (f"off={rec.get('off')}", rec.get("off")),
                                       ("(null)", rec.get("null")),
                                       ("(child BLAS threads)",
                                        not rec.get("child_thread_limits", True)))
            if present])
        pairs = replay_pairs(rec) if phase == "replays" else phase_pairs(rec, phase)
        groups.setdefault(name, []).extend(pairs)
    return {name: {"all": summary([r for r, _ in pairs]),
                   "same_state": summary([r for r, steady in pairs if steady])}
            for name, pairs in sorted(groups.items()) if pairs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--phase", choices=("replays", "before", "after"), default="replays",
                    help="pool the analysis replays (default), the always-on pairs "
                         "(before) or the pairs after the window")
    args = ap.parse_args()
    records = []
    for path in args.records:
        try:
            with open(path) as f:
                records.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"pool_replays: cannot read {path}: {e}", file=sys.stderr)
            return 2
        if not isinstance(records[-1], dict) or not {"hook", "workload"} <= records[-1].keys():
            print(f"pool_replays: {path} is not a hook_alternation.py record (no hook or "
                  "workload)", file=sys.stderr)
            return 2
    print(json.dumps(pooled(records, args.phase), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
