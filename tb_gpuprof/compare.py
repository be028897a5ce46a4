"""Compare two reports (run A, the baseline, and run B): `tb-gpuprof compare` (docs/compare.md).

Pure functions of report dicts: what changed in iteration time, GPU busy, Tensor Core share and
MFU, which kernels changed most, and for each recommended fix whose recorded flag changed
between A and B, the saving A's report predicted next to the saving B measured. The CLI loads
the reports and turns :func:`slowdown_reason` into exit status 1.
"""

from __future__ import annotations

import json
from typing import Any

from .analysis.rules import applied_flags
from .analysis.throughput import throughput_section

# FLOPs per iteration differing by more than this means A and B do different work (batch or
# model changed), so their iteration times are not like for like.
WORK_CHANGE_WARN_PCT = 5.0


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole else None


def _throughput(report: dict[str, Any]) -> dict[str, Any]:
    # reports stored before the section existed get it computed now
    return report.get("throughput") or throughput_section(report)


def summarize(report: dict[str, Any], time_key: str) -> dict[str, Any]:
    """The headline numbers of one report; ``time_key`` names the iteration time used."""
    it = report.get("iterations") or {}
    bd = report.get("breakdown") or {}
    tp = _throughput(report)
    return {
        "source": (report.get("source") or {}).get("path"),
        "gpu_name": (report.get("system") or {}).get("gpu_name"),
        "iteration_ms": it.get(time_key),
        "gpu_busy_pct": _pct(bd.get("gpu_busy_us") or 0.0, bd.get("wall_us") or 0.0),
        "tensor_core_pct": (report.get("tensor_cores") or {}).get("tc_pct"),
        # MFU against the dense BF16 peak (analysis/throughput.py): comparable between runs of
        # any precision. Reports stored before that measured it against their own precision's
        # peak: peak_precision tells them apart (absent there).
        "mfu_pct": tp.get("mfu_pct"),
        "mfu_peak_precision": tp.get("peak_precision"),
        "precision": tp.get("precision"),
        "precision_utilization_pct": tp.get("precision_utilization_pct"),
        "achieved_tflops": tp.get("achieved_tflops"),
        "flops_per_iteration": tp.get("flops_per_iteration"),
    }


def _per_iteration_us(report: dict[str, Any]) -> dict[str, tuple[str, float]]:
    n = max(int((report.get("iterations") or {}).get("count") or 0), 1)
    return {k["name"]: (k.get("demangled") or k["name"], (k.get("total_us") or 0.0) / n)
            for k in report.get("kernels") or ()}


def kernel_changes(a: dict[str, Any], b: dict[str, Any], top: int) -> list[dict[str, Any]]:
    """The ``top`` kernels whose time per iteration changed most (appeared, vanished, moved)."""
    ka, kb = _per_iteration_us(a), _per_iteration_us(b)
    rows: list[dict[str, Any]] = []
    for name in ka.keys() | kb.keys():
        label = (ka.get(name) or kb[name])[0]
        ua, ub = ka.get(name, ("", 0.0))[1], kb.get(name, ("", 0.0))[1]
        rows.append({"name": name, "demangled": label, "a_ms": round(ua / 1e3, 4),
                     "b_ms": round(ub / 1e3, 4), "delta_ms": round((ub - ua) / 1e3, 4)})
    rows.sort(key=lambda r: (-abs(r["delta_ms"]), r["name"]))
    return rows[:top]


def fixes_applied(a: dict[str, Any], b: dict[str, Any], measured_pct: float | None
                  ) -> list[dict[str, Any]]:
    """Fixes whose flags changed from A to B, with A's predicted and B's measured saving.

    The measured saving is the whole A -> B change: when several fixes changed together it is
    their combined effect (``combined``), which no single prediction covers.
    """
    fa = (a.get("system") or {}).get("flags") or {}
    fb = (b.get("system") or {}).get("flags") or {}
    recs = {r.get("id"): r for r in a.get("recommendations") or ()}
    out = []
    # the flags each rule says show its fix in place (analysis/rules/)
    for rid, names in applied_flags().items():
        changed = {f: [fa.get(f), fb.get(f)] for f in names
                   if (f in fa or f in fb) and fa.get(f) != fb.get(f)}
        if not changed:
            continue
        rec = recs.get(rid) or {}
        verified = (rec.get("verified") or {}).get("saving_pct")
        out.append({"id": rid, "flags": changed,
                    "recommended_by_a": rid in recs,
                    "predicted_saving_pct": rec.get("estimated_saving_pct"),
                    "predicted_saving_ms": rec.get("estimated_saving_ms"),
                    # what A's run measured in its own loop (verify=), where it did: the
                    # expectation the change is held to, before the prediction
                    "verified_saving_pct": verified,
                    "expected_saving_pct": verified if verified is not None
                    else rec.get("estimated_saving_pct"),
                    "expected_from": "verified" if verified is not None else "predicted",
                    "measured_saving_pct": measured_pct})
    for f in out:
        f["combined"] = len(out) > 1
    return out


def _time_key(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Both runs' un-profiled median when both know it, else both windows' median."""
    key = "unprofiled_median_ms"
    if all((r.get("iterations") or {}).get(key) for r in (a, b)):
        return key
    return "median_ms"


def compare_reports(a: dict[str, Any], b: dict[str, Any], *, top: int = 5) -> dict[str, Any]:
    """The comparison of B against baseline A (the JSON that ``--format json`` prints)."""
    key = _time_key(a, b)
    sa, sb = summarize(a, key), summarize(b, key)
    ta, tb = sa["iteration_ms"] or 0.0, sb["iteration_ms"] or 0.0
    change = round(100.0 * (tb - ta) / ta, 2) if ta > 0 and tb > 0 else None
    warnings = []
    if sa["gpu_name"] != sb["gpu_name"]:
        warnings.append(f"A ran on {sa['gpu_name']}, B on {sb['gpu_name']}")
    if sa["mfu_pct"] is not None and sb["mfu_pct"] is not None and \
            sa["mfu_peak_precision"] != sb["mfu_peak_precision"]:
        warnings.append("A's and B's MFU are not against the same peak (a peak_tflops= "
                        "override, or a report stored before MFU was against the BF16 peak): "
                        "compare model TFLOP/s")
    fa, fb = sa["flops_per_iteration"], sb["flops_per_iteration"]
    if fa and fb and abs(fb - fa) / fa * 100 > WORK_CHANGE_WARN_PCT:
        warnings.append(f"B does {100 * (fb - fa) / fa:+.1f}% FLOPs per iteration compared with A "
                        "(batch or model changed): iteration times compare unlike work")
    return {
        "time_source": key,
        "a": sa, "b": sb,
        "iteration_change_pct": change,  # > 0: B is slower
        "speedup": round(ta / tb, 3) if ta > 0 and tb > 0 else None,
        "kernels": kernel_changes(a, b, top),
        "fixes": fixes_applied(a, b, -change if change is not None else None),
        "warnings": warnings,
    }


def slowdown_reason(cmp: dict[str, Any], max_slowdown_pct: float) -> str | None:
    """One line when B is slower than A by more than ``max_slowdown_pct``, else None."""
    change = cmp["iteration_change_pct"]
    if change is None or change <= max_slowdown_pct:
        return None
    return (f"B is {change:.1f}% slower than A ({cmp['b']['iteration_ms']:.2f} ms vs "
            f"{cmp['a']['iteration_ms']:.2f} ms per iteration), more than the allowed "
            f"{max_slowdown_pct:g}%")


def _num(v: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def _delta(a: float | None, b: float | None, unit: str, digits: int) -> str:
    return "" if a is None or b is None else f"{b - a:+.{digits}f}{unit}"


def _mfu_label(a: dict[str, Any], b: dict[str, Any]) -> str:
    """"MFU (vs BF16 peak)" when both runs' MFU is against the same peak, else "MFU"."""
    ref = a.get("mfu_peak_precision")
    return f"MFU (vs {ref.upper()} peak)" if ref and ref == b.get("mfu_peak_precision") else "MFU"


def _precision_line(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Each run's utilisation of the peak of its own precision: not comparable across
    precisions (a faster run in a faster precision reads lower), so no change column."""
    def cell(s: dict[str, Any]) -> str:
        u = s.get("precision_utilization_pct")
        return "-" if u is None else f"{u:.1f}% {s.get('precision') or '?'}"
    return f"{'of own precision peak':22}{cell(a):>12}{cell(b):>12}"


def render_comparison(cmp: dict[str, Any], fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps(cmp, indent=1) + "\n"
    a, b = cmp["a"], cmp["b"]
    time_label = ("un-profiled median" if cmp["time_source"] == "unprofiled_median_ms"
                  else "profiled window median")
    lines = [f"A: {a['source']}", f"B: {b['source']}", "",
             f"{'':22}{'A':>12}{'B':>12}{'change':>12}",
             f"{'iteration time':22}{_num(a['iteration_ms'], ' ms', 2):>12}"
             f"{_num(b['iteration_ms'], ' ms', 2):>12}"
             f"{_num(cmp['iteration_change_pct'], '%'):>12}   ({time_label})"]
    for label, field, unit, digits in (("GPU busy", "gpu_busy_pct", "%", 1),
                                       ("Tensor Core share", "tensor_core_pct", "%", 1),
                                       (_mfu_label(a, b), "mfu_pct", "%", 2),
                                       ("model TFLOP/s", "achieved_tflops", "", 2)):
        delta_unit = " pt" if unit == "%" else ""
        lines.append(f"{label:22}{_num(a[field], unit, digits):>12}"
                     f"{_num(b[field], unit, digits):>12}"
                     f"{_delta(a[field], b[field], delta_unit, digits):>12}")
    lines.append(_precision_line(a, b))
    if cmp["speedup"] is not None:
        s = cmp["speedup"]
        lines += ["", f"B is {s:.2f}x as fast as A." if s >= 1
                  else f"B is {1 / s:.2f}x slower than A."]
    if cmp["fixes"]:
        lines += ["", "Fixes applied between A and B (recorded flags):",
                  f"  {'fix':16}{'expected by A':>22}{'measured':>20}  flags"]
        for f in cmp["fixes"]:
            flags = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in f["flags"].items())
            pred = (_num(f["expected_saving_pct"], "%") + f" ({f['expected_from']})"
                    if f["recommended_by_a"] else "not recommended")
            meas = _num(f["measured_saving_pct"], "%") + (" (together)" if f["combined"] else "")
            lines.append(f"  {f['id']:16}{pred:>22}{meas:>20}  {flags}")
    if cmp["kernels"]:
        lines += ["", "Kernels that changed most (ms per iteration):",
                  f"  {'A':>9}{'B':>9}{'change':>9}  kernel"]
        for k in cmp["kernels"]:
            name = k["demangled"] if len(k["demangled"]) <= 70 else k["demangled"][:69] + "…"
            lines.append(f"  {k['a_ms']:9.2f}{k['b_ms']:9.2f}{k['delta_ms']:+9.2f}  {name}")
    for w in cmp["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"


__all__ = ["compare_reports", "render_comparison", "slowdown_reason"]
