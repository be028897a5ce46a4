"""Dump ``build_report`` JSON for every fixture, then check a later run gives the same reports.

For optimisations that must not change results (issue 15): run ``--save DIR`` before the
change and ``--compare DIR`` after it. Inputs: every trace under tests/data and
../shared/fixtures (with its ``.env.json`` as the hook passes it, when there is one), two
Nsight exports built with tests/nsys_builder.py, and small scaled traces (Kineto in both
layouts, a scaled XPlane) so the merged/streamed paths are covered too.

    python benchmarks/report_digest.py --save /tmp/digest_before
    python benchmarks/report_digest.py --compare /tmp/digest_before
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)


def _env_for(path: str) -> dict | None:
    base = path.removesuffix(".gz").removesuffix(".json").removesuffix(".pb")
    base = base.removesuffix(".xplane")
    env_path = base + ".env.json"
    if not os.path.exists(env_path):
        return None
    meta = json.load(open(env_path))
    if "hook_system" in meta or "unprofiled" in meta:  # tests/h200.py's loop_env
        env = dict(meta.get("hook_system") or {})
        if meta.get("unprofiled"):
            env["unprofiled"] = meta["unprofiled"]
        return env
    return meta


def _nsys_loop(path: str, iterations: int) -> None:
    """A training-like Nsight export: NVTX iteration ranges, a copy, 12 GEMMs and a memset each
    (the base export of the former bench_nsys.py: `git show 0f520c4:benchmarks/bench_nsys.py`)."""
    from tests.nsys_builder import NsysExport

    ex = NsysExport()
    t = 1_000_000
    for i in range(iterations):
        ex.range(t, t + 900_000, f"iteration {i}")
        ex.memcpy(t + 10_000, 20_000, 4 << 20, 1)
        for k in range(12):
            ex.launch(t + 40_000 + k * 60_000, 50_000,
                      f"void gemm_kernel<{k % 4}>(float*, float const*, int)",
                      grid=(132, 1 + k % 3, 1), block=(256, 1, 1), regs=96, dyn_smem=49152)
        ex.memset(t + 800_000, 5_000, 1 << 20)
        t += 1_000_000
    ex.write(path)


def _inputs(tmp: str) -> list[tuple[str, str, dict | None]]:
    from bench_parse import build_trace
    from scale_xplane import scale

    from tests.test_reader_nsys import _training_export

    data = os.path.join(REPO, "tests", "data")
    paths = sorted(glob.glob(os.path.join(data, "**", "*.json.gz"), recursive=True)
                   + glob.glob(os.path.join(data, "**", "*.pb"), recursive=True)
                   + glob.glob(os.path.join(REPO, "..", "shared", "fixtures", "*.[gb]z")))
    paths += sorted(glob.glob(os.path.join(REPO, "..", "shared", "fixtures", "*.pb")))
    out = []
    for p in paths:
        name = os.path.relpath(p, REPO).replace("/", "__")
        out.append((name, p, None))
        env = _env_for(p)
        if env is not None:
            out.append((name + "+env", p, env))
    kineto = os.path.join(data, "kineto_transformer_bf16_h200.json.gz")
    for layout in ("kineto", "line"):
        p = os.path.join(tmp, f"scaled_{layout}.json")
        build_trace(kineto, p, 8, layout)
        out.append((f"scaled_{layout}", p, None))
    p = os.path.join(tmp, "scaled.xplane.pb")
    with open(p, "wb") as f:
        f.write(scale(open(os.path.join(data, "jax_conv_h200.xplane.pb"), "rb").read(), 20))
    out.append(("scaled_xplane", p, None))
    p = os.path.join(tmp, "train.sqlite")
    _training_export().write(p)
    out.append(("nsys_training", p, None))
    p = os.path.join(tmp, "loop.sqlite")
    _nsys_loop(p, 200)
    out.append(("nsys_loop", p, None))
    return out


def reports() -> dict[str, str]:
    from tb_gpuprof.analysis.format import render
    from tb_gpuprof.analysis.report import build_report
    from tb_gpuprof.readers import load_profile

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, env in _inputs(tmp):
            report = build_report(load_profile(path), env=env)
            report["source"]["path"] = os.path.basename(path)
            # the digest of the analysis' code changes with any refactor by design
            # (analysis/identity.py): the answers are what must not
            report.pop("analysis_id", None)
            out[name] = render(report, fmt="json")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", metavar="DIR")
    g.add_argument("--compare", metavar="DIR")
    args = ap.parse_args()
    now = reports()
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        for name, text in now.items():
            with open(os.path.join(args.save, name + ".json"), "w") as f:
                f.write(text)
        print(f"saved {len(now)} reports to {args.save}")
        return 0
    bad = 0
    for name, text in now.items():
        path = os.path.join(args.compare, name + ".json")
        if not os.path.exists(path):
            print(f"NEW   {name}")
            continue
        if open(path).read() != text:
            bad += 1
            print(f"DIFF  {name}")
    print(f"{len(now) - bad}/{len(now)} reports identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
