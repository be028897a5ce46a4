"""Write docs/recommendations.md's rule table from the rule registry (tb_gpuprof/analysis/rules).

Every row is a :class:`~tb_gpuprof.analysis.rules.Rule`'s own doc, fix flags and in-loop
switch: adding or changing a rule changes the table here, not by hand.

    python tools/rule_docs.py          # rewrite the table in place
    python tools/rule_docs.py --check  # exit 1 when the table in the docs is stale
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tb_gpuprof.analysis.rules import RULES, Rule  # noqa: E402

DOC = os.path.join(REPO, "docs", "recommendations.md")
BEGIN = ("<!-- rule table: generated from tb_gpuprof/analysis/rules by tools/rule_docs.py; "
         "do not edit -->")
END = "<!-- end of rule table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _in_loop(rule: Rule) -> str:
    if rule.switch:
        return f"switched in place: `{rule.switch.rsplit(':', 1)[1]}`"
    return f"not verifiable in the loop: {rule.not_verifiable}" if rule.not_verifiable else "–"


def table() -> str:
    """The rule table, one row per registered rule, in the registry's order."""
    rows = ["| id | reads | fires when | silent when (or already in place) | estimate | "
            "bound (`removable_ms`) | flags that show it in place | verification |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in RULES:
        flags = ", ".join(f"`{f}`" for f in r.applied_flags) or "–"
        rows.append("| " + " | ".join(_cell(c) for c in (
            f"`{r.id}`", r.doc.reads, r.doc.fires, r.doc.silent, r.doc.estimate, r.doc.bound,
            flags, _in_loop(r))) + " |")
    return "\n".join(rows)


def rendered(text: str) -> str:
    """``text`` with the table between the markers replaced by the registry's."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{DOC}: the rule table markers are missing")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the docs are stale")
    args = ap.parse_args()
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    new = rendered(text)
    if args.check:
        if new != text:
            print(f"{DOC}: the rule table is stale; run python tools/rule_docs.py")
            return 1
        return 0
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
