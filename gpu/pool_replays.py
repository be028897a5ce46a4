"""Pool the analysis replays of several hook_alternation.py records (issue 13).

One process gives 8-16 replay pairs (an *on* block while the window's analysis runs again,
the *off* block beside it); the launch-bound loop's pairs spread 0.86-1.28x, so one process
cannot place the median within a few percent. This pools every pair of the records given,
per hook, workload and child thread setting (``child_thread_limits``), and reports the
median and mean on/off ratio with 90% bootstrap intervals: over all pairs, and over the pairs
whose two blocks began in the same host state (their pure-Python probes within STEADY_SPREAD
of each other, the rule of the always-on pairs).

    python3 gpu/pool_replays.py benchmarks/records/h200_2026-12-02_ninth/*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hook_alternation import STEADY_SPREAD, summary


def replay_pairs(record: dict[str, Any]) -> list[tuple[float, bool]]:
    """(on / off, both probes in one host state) of each replay pair of one record; its
    ``replay_blocks`` rows are [on, iterations, ms per iteration, probe ms]."""
    blocks = record.get("replay_blocks") or []
    out = []
    for a, b in zip(blocks[0::2], blocks[1::2], strict=False):
        if bool(a[0]) == bool(b[0]):
            continue
        on, off = (a, b) if a[0] else (b, a)
        steady = max(on[3], off[3]) <= STEADY_SPREAD * min(on[3], off[3])
        out.append((on[2] / off[2], steady))
    return out


def pooled(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Group name -> pooled figures."""
    groups: dict[str, list[tuple[float, bool]]] = {}
    for rec in records:
        name = f"{rec['hook']} {rec['workload']}" + (
            "" if rec.get("child_thread_limits", True) else " (child BLAS threads)")
        groups.setdefault(name, []).extend(replay_pairs(rec))
    return {name: {"all": summary([r for r, _ in pairs]),
                   "same_state": summary([r for r, steady in pairs if steady])}
            for name, pairs in sorted(groups.items()) if pairs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+")
    records = []
    for path in ap.parse_args().records:
        try:
            with open(path) as f:
                records.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"pool_replays: cannot read {path}: {e}", file=sys.stderr)
            return 2
    print(json.dumps(pooled(records), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
