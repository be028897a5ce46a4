"""Render a report as text (DLProf summary + pyprof-style table), JSON, or CSV (kernel table)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from typing import Any

CSV_FIELDS = ["name", "kind", "count", "total_us", "mean_us", "min_us", "max_us", "pct",
              "uses_tensor_cores", "precision", "category", "tc_eligible", "ops", "grid", "block",
              "registers", "shared_mem", "occupancy_pct", "flops", "bytes", "tflops", "flops_basis",
              "source"]


def render(report: dict[str, Any], fmt: str = "text", top: int = 10) -> str:
    if fmt == "json":
        return json.dumps(report, indent=1) + "\n"
    if fmt == "csv":
        return _csv(report, top)
    return _text(report, top)


def _csv(report: dict[str, Any], top: int) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_FIELDS)
    for k in report["kernels"][:top]:
        row = []
        for f in CSV_FIELDS:
            v = k.get(f)
            if isinstance(v, list):
                v = ";".join(str(x) for x in v) if f == "ops" else "x".join(str(x) for x in v)
            row.append("" if v is None else v)
        w.writerow(row)
    return buf.getvalue()


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


_SHARE_LABELS = {"gpu": "GPU kernels", "copy": "copies", "communication": "communication",
                 "dispatch": "op dispatch", "host": "host outside ops",
                 "data_wait": "data loader", "sync": "sync"}


def _shares(bn: dict[str, Any]) -> str:
    """"GPU kernels 46.5%, op dispatch 51.2%, ..." on the basis the verdict used."""
    pct = bn.get("corrected_pct") or bn["mean_pct"]
    ms = bn.get("corrected_ms") or bn["mean_ms"]
    parts = [f"{_SHARE_LABELS.get(c, c)} {pct[c]:.1f}% ({ms[c]:.2f} ms)"
             for c in sorted(pct, key=lambda c: -pct[c]) if pct[c] >= 0.5]
    return ", ".join(parts) + (" of the un-profiled iteration" if bn.get("corrected_pct")
                               else " of the iteration")


def _throughput(tp: dict[str, Any]) -> str:
    """MFU first (against one peak for every precision, so comparable across runs), then the
    utilisation of the peak of the precision in use."""
    tflops = tp.get("achieved_tflops")
    if tflops is None:
        return "no FLOPs counted (no op shapes in the trace)"
    text = f"{tflops:.1f} model TFLOP/s"
    if tp.get("mfu_pct") is not None:
        ref = tp.get("peak_precision")
        of = f"dense {ref.upper()} peak" if ref else "peak passed as peak_tflops="
        text += f", MFU {tp['mfu_pct']:.1f}% (of the {tp['peak_tflops']:g} TFLOP/s {of})"
    else:
        text += f", no MFU ({tp.get('peak_source')})"
    util = tp.get("precision_utilization_pct")
    if util is not None:
        text += (f", {util:.1f}% of the {tp['precision_peak_tflops']:g} TFLOP/s "
                 f"{tp['precision']} peak (the precision in use)")
    return text


def _text(report: dict[str, Any], top: int) -> str:
    it = report["iterations"]
    tc = report["tensor_cores"]
    sysinfo = report.get("system") or {}
    bd = report["breakdown"]
    lines: list[str] = []
    add = lines.append
    add("tb-gpuprof report")
    if report.get("refreshed"):
        add(f"  refreshed:         {report['refreshed']['reason']}")
    bn = report.get("bottleneck")
    if bn:
        add(f"  verdict:           {bn['verdict']}")
        if bn["bound"] != "no_gpu":  # shares of a GPU's wait: none without one
            add("  bound by:          " + _shares(bn))
    add(f"  source:            {report['source']['path']} ({report['source']['format']})")
    if sysinfo.get("gpu_name"):
        cc = sysinfo.get("compute_capability")
        add(f"  GPU:               {sysinfo['gpu_name']}" + (f" (sm_{cc.replace('.', '')})"
                                                              if cc else ""))
    rng = it.get("range")
    add(f"  iterations:        {it['count']} by {it['method']}"
        + (f" ({it['key']})" if it.get("key") else "")
        + (f", range {rng[0]}-{rng[1]}" if rng else ""))
    add(f"  iteration time:    mean {_ms(it['mean_ms'])}, median {_ms(it['median_ms'])}, "
        f"min {_ms(it['min_ms'])}, max {_ms(it['max_ms'])}, p95 {_ms(it['p95_ms'])}")
    if it.get("unprofiled_median_ms"):
        add(f"  un-profiled:       median {_ms(it['unprofiled_median_ms'])} outside the window "
            f"(profiler overhead x{it['profiler_overhead_ratio']:.2f})")
    wall = bd["wall_us"] or 1.0
    add(f"  GPU busy:          {_ms(it['gpu_busy_mean_ms'])} per iteration "
        f"({100 * bd['gpu_busy_us'] / wall:.1f}% of wall time)")
    add(f"  GPU time:          {report['gpu_time_us'] / 1e3:.2f} ms in "
        f"{report['kernels_total']} distinct kernels/copies")
    eff = tc.get("tc_kernel_efficiency_pct")
    add(f"  Tensor Cores:      {tc['tc_pct']:.1f}% of GPU time using TC, "
        f"{tc['eligible_not_tc_pct']:.1f}% eligible but not using TC, "
        f"{tc['other_pct']:.1f}% other, {tc['memory_pct']:.1f}% memory")
    add("  TC kernel efficiency: " + ("-" if eff is None else f"{eff:.1f}%"))
    if report.get("throughput"):
        add("  throughput:        " + _throughput(report["throughput"]))
    if report.get("phases"):
        ph = report["phases"]
        add(f"  phases (GPU time): forward {_ms(ph['forward_ms'])}, backward "
            f"{_ms(ph['backward_ms'])}, optimizer {_ms(ph['optimizer_ms'])} per iteration")
    dist = report.get("distributed")
    if dist:
        overlap = dist.get("overlap_pct")
        add(f"  distributed:       rank {dist.get('rank')} of {dist.get('world_size')} "
            f"({dist.get('backend') or 'unknown backend'}); communication "
            f"{dist.get('communication_pct', 0):.1f}% of wall time, exposed "
            f"{dist.get('exposed_pct', 0):.1f}%, overlapped "
            + ("-" if overlap is None else f"{overlap:.1f}%"))
    idle = bd["idle_attribution_us"]
    if bd["idle_us"] > 0:
        parts = ", ".join(f"{k.replace('_', ' ')} {v / 1e3:.2f}" for k, v in idle.items() if v)
        add(f"  GPU idle:          {bd['idle_us'] / 1e3:.2f} ms ({parts} ms)")
    add("")
    add(f"Top {min(top, len(report['kernels']))} kernels by GPU time")
    header = f"  {'time ms':>10} {'%':>6} {'count':>7} {'TC':>3} {'prec':>5} {'category':<12} name"
    add(header)
    for k in report["kernels"][:top]:
        add(f"  {k['total_us'] / 1e3:>10.3f} {k['pct']:>6.2f} {k['count']:>7} "
            f"{'yes' if k['uses_tensor_cores'] else 'no':>3} {k['precision']:>5} "
            f"{k['category']:<12} {_short(k.get('demangled') or k['name'], 90)}")
    add("")
    recs = report["recommendations"]
    add(f"Recommendations ({len(recs)})")
    if not recs:
        add("  none: no rule found a problem worth fixing in this window")
    for i, r in enumerate(recs, 1):
        saving = r.get("estimated_saving_ms")
        rng = r.get("estimated_range_pct")
        add(f"  {i}. [{r['id']}] {r['title']} ({r['severity']}"
            + (f", saves ~{saving:.1f} ms/iteration" if saving else "")
            + (f", {rng[0]:.0f}–{rng[1]:.0f}%" if rng else "") + ")")
        verified = r.get("verified")
        if verified:
            add(f"     predicted {_predicted(r)} · verified in the loop: {verified['verdict']}"
                f" ({verified.get('iterations', 0)} iterations, "
                f"{verified.get('seconds') or 0.0:.1f} s)")
        add(f"     {r['problem']}")
        for fw in ("pytorch", "keras", "jax"):
            fix = (r.get("fix") or {}).get(fw)
            if fix:
                first, *rest = fix.splitlines()
                add(f"     {fw + ':':<9}{first}")
                for line in rest:
                    add(f"              {line}")
    _memory_lines(report.get("memory"), add)
    _verification_lines(report.get("verification"), add)
    for w in report.get("warnings") or []:
        add(f"warning: {w}")
    return "\n".join(lines) + "\n"


def _predicted(rec: dict[str, Any]) -> str:
    pct = rec.get("estimated_saving_pct")
    return f"{pct:.0f}%" if pct is not None else "not estimated"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


def _memory_lines(section: dict[str, Any] | None, add: Callable[[str], None]) -> None:
    """Each device's peak: the allocator's bytes then, what held them (docs/report-schema.md
    #memory), fragmentation and memory outside PyTorch."""
    if not section or not section.get("recorded"):
        return
    from .memory import gpu_devices  # the trace analysis' modules: only with a memory section

    for dev in gpu_devices(section) or section.get("devices") or []:
        peak = dev["peak"]
        add("")
        add(f"Memory at the peak on {dev['device']}: {_mib(peak['allocated_bytes'])} allocated"
            + (f", {_mib(peak['reserved_bytes'])} reserved"
               if peak.get("reserved_bytes") is not None else "")
            + (f" (step {peak['step']})" if peak.get("step") is not None else ""))
        parts = dev.get("peak_parts")
        if parts:
            _part_lines(parts, add)


def _part_lines(parts: dict[str, Any], add: Callable[[str], None]) -> None:
    whole = (parts["allocated_bytes"] + parts.get("uncounted_bytes", 0)) or 1
    for part in parts["parts"]:
        name = part["part"].replace("_", " ")
        if part["bytes"] is None:
            add(f"  {name:<17} not recorded (pass model= and optimizer= to the hook)")
            continue
        top = (part.get("holders") or [{}])[0]
        where = top.get("module") or top.get("op")
        add(f"  {name:<17} {_mib(part['bytes']):>14} {100 * part['bytes'] / whole:5.1f}%"
            + (f"  largest: {where}" if where else ""))
    frag, outside = parts.get("fragmentation"), parts.get("outside_pytorch")
    if frag:
        largest = (frag.get("at_stop") or {}).get("largest_free_block_bytes")
        add(f"  {'not allocated':<17} {_mib(frag['bytes']):>14} reserved but free"
            + (f"; largest free block at the window's stop {_mib(largest)}"
               if largest is not None else ""))
    if outside:
        add(f"  {'outside PyTorch':<17} {_mib(outside['bytes']):>14} NVML "
            f"{outside['scope']} use minus the allocator's reserve")


def _verification_lines(section: dict[str, Any] | None, add: Callable[[str], None]) -> None:
    """The verification run's own figures: noise, cost, and that training went on as before."""
    if not section:
        return
    add("")
    add(f"Verification in the training loop ({section['status']}): "
        f"{section['iterations']} iterations, {section['seconds']:.1f} s, blocks of "
        f"{section.get('block_iterations')} (block noise {section.get('noise_pct')}%); "
        f"settings restored: {'yes' if section.get('restored') else 'NO'}")
    before, after = section.get("before_ms"), section.get("after_ms")
    if before and after:
        add(f"  iteration before the trials {before:.2f} ms, after {after:.2f} ms"
            + ("" if section.get("after_within_noise") is not False
               else " (outside the noise measured before)"))
    for fix, trial in (section.get("trials") or {}).items():
        add(f"  {fix}: {trial['verdict']}")
    if section.get("note"):
        add(f"  {section['note']}")
