"""Predicted vs measured: does the saving a report predicts for its fix come true?

Three ladders recorded on an H200, each rung the previous one with the next fix applied:
ResNet-50 in PyTorch (FP32 -> TF32 -> AMP -> AMP + channels_last), HF GPT-2 124M eager at
batch 4x256 (TF32 -> AMP, where the fix meets a host-bound loop -> torch.compile), and a JAX
MLP language model (FP32 -> TF32 -> BF16), plus pageable -> pinned copies. For each step it
re-reads rung A's trace, takes the recommendation for the fix that leads to rung B, and prints
A's predicted iteration time next to B's measured one (each rung timed without any hook).

    python3 benchmarks/bench_savings.py                      # the recordings in tests/data
    python3 benchmarks/bench_savings.py --recorded DIR       # a recording made anew

The recorder is no longer in the tree: ``git show 7f020dc:gpu/ladders.py > ladders.py`` and
``python3 ladders.py --out DIR`` on a GPU record every rung of a ladder in one process, timed
interleaved with its neighbours, plus a held-out ViT-B/16 ladder; ``--recorded DIR`` compares
that recording.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tb_gpuprof.analysis.report import build_report  # noqa: E402
from tb_gpuprof.errors import GpuProfError  # noqa: E402
from tb_gpuprof.readers import load_profile  # noqa: E402

LOOPS = ROOT / "tests" / "data" / "h200_loops"
LADDERS = ROOT / "tests" / "data" / "h200_ladders"
# (ladder, rung A, fix, rung B); the recorded case of each rung name (tests/data READMEs)
STEPS = [
    ("ResNet-50", "resnet50_fp32", "tf32", "resnet50_tf32"),
    ("ResNet-50", "resnet50_tf32", "amp", "resnet50_amp"),
    ("ResNet-50", "resnet50_amp", "channels_last", "resnet50_amp_cl"),
    ("GPT-2 eager", "gpt2_tf32", "amp", "gpt2_bf16"),
    ("GPT-2 eager", "gpt2_bf16", "compile", "gpt2_bf16_compile"),
    ("JAX LM", "jax_lm_fp32", "tf32", "jax_lm_tf32"),
    ("JAX LM", "jax_lm_tf32", "amp", "jax_lm_bf16"),
    ("MLP input copy", "pageable", "pinned_memory", "pinned"),
]
# Held out: a model no rule or factor was developed on (in a new recording only)
HELD_OUT = [
    ("ViT-B/16 (held out)", "vit_fp32", "tf32", "vit_tf32"),
    ("ViT-B/16 (held out)", "vit_tf32", "amp", "vit_bf16"),
]
TOLERANCE_PCT = 15.0


def stored(case: str) -> tuple[Path, dict[str, Any]]:
    """Trace and env of a rung from tests/data (tests/data/h200_ladders/README.md)."""
    for d in (LADDERS, LOOPS):
        env = d / f"{case}.env.json"
        if env.exists():
            trace = next(p for p in d.glob(f"{case}.*") if not p.name.endswith(".json"))
            return trace, json.loads(env.read_text())
    raise FileNotFoundError(case)


def recorded(root: Path, case: str) -> tuple[Path, dict[str, Any]]:
    """Trace and env of a rung recorded into ``root`` (7f020dc:gpu/ladders.py)."""
    meta = json.loads((root / f"{case}.meta.json").read_text())
    traces = sorted(root.glob(f"{case}/plugins/gpuprof/traces/*/*")) or \
        sorted(root.glob(f"{case}_trace/plugins/profile/*/*.xplane.pb"))
    env = {"unprofiled": {"median_ms": meta["unprofiled_mean_ms"],
                          "source": meta.get("unprofiled_source", "timed_without_hook")},
           "hook_system": meta.get("hook_system") or {}}
    return traces[0], env


def analyze(trace: Path, env: dict[str, Any]) -> dict[str, Any]:
    hook_env = dict(env.get("hook_system") or {})
    hook_env["unprofiled"] = env["unprofiled"]
    return build_report(load_profile(str(trace)), env=hook_env)


def compare(get: Any, steps: list[tuple[str, str, str, str]]) -> list[dict[str, Any]]:
    rows = []
    for ladder, a, fix, b in steps:
        try:
            trace, env = get(a)
            measured_b = get(b)[1]["unprofiled"]["median_ms"]
        except (FileNotFoundError, IndexError):
            print(f"{ladder}: {a} -> {b} not recorded", file=sys.stderr)
            continue
        try:
            report = analyze(trace, env)
        except GpuProfError as exc:  # e.g. a CPU smoke recording: no GPU activity
            print(f"{ladder}: {a}: {exc}", file=sys.stderr)
            continue
        measured_a = env["unprofiled"]["median_ms"]
        rec = next((r for r in report["recommendations"] if r["id"] == fix), None)
        predicted = rec.get("predicted_iteration_ms") if rec else None
        err = 100.0 * (predicted - measured_b) / measured_b if predicted else None
        rows.append({"ladder": ladder, "from": a, "fix": fix, "to": b,
                     "measured_from_ms": measured_a, "measured_to_ms": measured_b,
                     "predicted_to_ms": predicted, "error_pct": err,
                     "range_pct": rec.get("estimated_range_pct") if rec else None,
                     "bound_before": report["bottleneck"]["bound"],
                     "recommended": [r["id"] for r in report["recommendations"]]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recorded", metavar="DIR", help="compare a recording made earlier")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    if args.recorded:
        root = Path(args.recorded)
        rows = compare(lambda c: recorded(root, c), STEPS + HELD_OUT)
    else:
        rows = compare(stored, STEPS + HELD_OUT)
    print(f"{'ladder':15} {'step':34} {'measured':>17} {'predicted':>9} {'error':>7}  range "
          "of saving")
    within = held_within = held = 0
    for r in rows:
        step = f"{r['from']} +{r['fix']}"
        pred = f"{r['predicted_to_ms']:.1f}" if r["predicted_to_ms"] else "no rec"
        err = f"{r['error_pct']:+.1f}%" if r["error_pct"] is not None else "-"
        ok = r["error_pct"] is not None and abs(r["error_pct"]) <= TOLERANCE_PCT
        if "held out" in r["ladder"]:
            held += 1
            held_within += ok
        else:
            within += ok
        print(f"{r['ladder']:15} {step:34} {r['measured_from_ms']:7.1f} -> "
              f"{r['measured_to_ms']:6.1f} {pred:>9} {err:>7}  {r['range_pct']} "
              f"{'' if ok else '  <-- outside +-15%'}")
    print(f"{within} of {len(rows) - held} steps within +-{TOLERANCE_PCT:.0f}%"
          + (f"; held out: {held_within} of {held}" if held else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
