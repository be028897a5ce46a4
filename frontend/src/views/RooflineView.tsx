// Roofline: the top kernels as points (arithmetic intensity vs achieved TFLOP/s, log-log) under
// the GPU's ceilings from report.roofline (tb_gpuprof/analysis/roofline.py, docs/roofline.md).
// Drawn as SVG built by Preact: kernel names reach the DOM as text nodes and <title> text only.
import { useState } from "preact/hooks";
import type * as Gen from "../report.gen";
import { Empty, KeyValues, Panel } from "../components";
import { DASH, fmtBytes, fmtNum, fmtPct, fmtSi, fmtUs } from "../format";
import type { Report } from "../types";

const W = 900;
const H = 480;
const M = { left: 64, right: 150, top: 16, bottom: 44 };
const PRECISION_COLORS: Record<string, string> = {
  fp64: "#6d4c41", fp32: "#1976d2", tf32: "#00897b", bf16: "#f57c00", fp16: "#8e24aa",
  fp8: "#c62828", int8: "#546e7a",
};
const OTHER_COLOR = "#9e9e9e";
const CEILING_LABELS: Record<string, string> = {
  fp64: "FP64 (CUDA cores)", fp64_tc: "FP64 Tensor Core", fp32: "FP32 (CUDA cores)",
  tf32: "TF32 Tensor Core", bf16: "BF16 Tensor Core", fp16: "FP16 Tensor Core",
  fp8: "FP8 Tensor Core", int8: "INT8 Tensor Core (TOPS)",
};

const color = (p: string | null | undefined) => (p && PRECISION_COLORS[p]) || OTHER_COLOR;
const log10 = Math.log10;

/** A log scale from [lo, hi] (decades widened to whole powers of ten) onto [a, b] pixels. */
function logScale(lo: number, hi: number, a: number, b: number) {
  const l = Math.floor(log10(lo));
  const h = Math.min(Math.max(Math.ceil(log10(hi)), l + 1), l + 12); // callers pass positive values
  const f = (v: number) => a + ((log10(v) - l) / (h - l)) * (b - a);
  const ticks: number[] = [];
  for (let e = l; e <= h; e++) ticks.push(10 ** e);
  return { f, ticks, lo: 10 ** l, hi: 10 ** h };
}

function tickLabel(v: number): string {
  if (v >= 1000) return `${fmtNum(v / 1000)}k`;
  return v >= 1 ? fmtNum(v) : String(Number(v.toPrecision(1)));
}

interface Props {
  report: Report;
  openKernels: (q: string) => void;
}

export function RooflineView({ report, openKernels }: Props) {
  const rf = report.roofline;
  const [picked, setPicked] = useState<number | null>(null);
  if (!rf) return <Empty>this report was made before the roofline existed and its run holds no raw trace to rebuild it from (reports with a stored trace are rebuilt by the installed analysis)</Empty>;
  // log axes place only positive values (the backend plots only such points)
  const pts = rf.points.filter((p) => p.intensity > 0 && p.achieved_tflops > 0);
  const leftOut = rf.kernels_total - rf.kernels_plotted;
  const summary = (
    <p class="muted" data-testid="roofline-summary">
      {`${fmtNum(rf.kernels_plotted)} of ${fmtNum(rf.kernels_total)} kernels have FLOPs and bytes from their op's shapes`}
      {rf.kernels_plotted > pts.length ? ` (the top ${pts.length} by time are drawn)` : ""}
      {leftOut > 0 ? `; ${fmtNum(leftOut)} left out:` : "."}
    </p>
  );
  const reasons = rf.left_out.length ? (
    <ul class="muted" data-testid="roofline-left-out">
      {rf.left_out.map((e) => <li key={e.reason}>{`${e.reason}: ${fmtNum(e.kernels)} kernel${e.kernels === 1 ? "" : "s"}, ${fmtUs(e.time_us)}`}</li>)}
    </ul>
  ) : null;
  if (!rf.ceilings || !pts.length) {
    return (
      <div data-testid="view-roofline">
        <Panel title="Roofline">
          <Empty>{!rf.ceilings ? rf.ceilings_source : "no kernel of this window has both FLOPs and bytes"}</Empty>
          {summary}
          {reasons}
        </Panel>
      </div>
    );
  }
  const sel = picked !== null ? pts[picked] : null;
  return (
    <div data-testid="view-roofline">
      <Panel title="Roofline" extra={<span class="muted">{rf.ceilings_source}</span>}>
        <RooflineChart pts={pts} ceilings={rf.ceilings} picked={picked} onPick={setPicked} />
        {summary}
        {reasons}
        {rf.over_ceiling.length ? (
          <div class="warn" data-testid="roofline-over">
            {rf.over_ceiling.map((o) => <div key={o.name}><span class="trunc">{o.name}</span>{` at ${fmtPct(o.pct_of_sol)} of speed of light: ${o.why}`}</div>)}
          </div>
        ) : null}
      </Panel>
      {sel ? (
        <Panel title="Kernel" testId="roofline-detail">
          <div class="mono" data-testid="roofline-detail-name" style={{ wordBreak: "break-all", marginBottom: "6px" }}>{sel.name}</div>
          <KeyValues rows={[
            ["time", `${fmtUs(sel.time_us)} in ${fmtNum(sel.count)} calls`],
            ["FLOPs", fmtSi(sel.flops, "FLOP")],
            ["bytes (least DRAM traffic)", fmtBytes(sel.bytes)],
            ["arithmetic intensity", `${fmtNum(sel.intensity, 2)} FLOP/byte`],
            ["achieved", `${fmtNum(sel.achieved_tflops, 2)} TFLOP/s`],
            ["attainable here", sel.ceiling_tflops ? `${fmtNum(sel.ceiling_tflops, 1)} TFLOP/s (${sel.bound}-bound, ${CEILING_LABELS[sel.ceiling ?? ""] ?? sel.ceiling ?? DASH})` : DASH],
            ["% of speed of light", fmtPct(sel.pct_of_sol)],
            ["precision", sel.precision ?? DASH],
          ]} />
          <button data-testid="roofline-open-kernels" onClick={() => openKernels(sel.name)}>Show in Kernels</button>
        </Panel>
      ) : <p class="muted">Hover a point for its kernel; click it for the details.</p>}
    </div>
  );
}

function RooflineChart({ pts, ceilings, picked, onPick }: { pts: Gen.RooflinePoint[]; ceilings: Gen.RooflineCeilings; picked: number | null; onPick: (i: number) => void }) {
  const bw = ceilings.hbm_gbps ?? null; // GB/s: TFLOP/s at intensity I is I * bw / 1000
  const used = [...new Set(pts.map((p) => p.ceiling).filter((c): c is string => !!c && ceilings.tflops[c] !== undefined))];
  const peaks = used.map((c) => ({ c, peak: ceilings.tflops[c] })).sort((a, b) => b.peak - a.peak);
  const maxPeak = peaks.length ? peaks[0].peak : Math.max(...pts.map((p) => p.achieved_tflops));
  const ridgeMax = bw ? (maxPeak * 1000) / bw : 1;
  const x = logScale(Math.min(...pts.map((p) => p.intensity), 0.05), Math.max(...pts.map((p) => p.intensity), ridgeMax * 4), M.left, W - M.right);
  const y = logScale(Math.min(...pts.map((p) => p.achieved_tflops), maxPeak / 1e4), maxPeak * 1.5, H - M.bottom, M.top);
  const clampY = (v: number) => Math.max(Math.min(v, y.hi), y.lo);
  // where the memory roof enters the plot (its slope is exact: no clamping along it)
  const memStart = bw ? Math.max(x.lo, (y.lo * 1000) / bw) : x.lo;
  return (
    <svg viewBox={`0 0 ${W} ${H}`} width="100%" style={{ maxWidth: `${W}px` }} role="img" aria-label="roofline chart" data-testid="roofline-svg">
      <g class="axes" fill="currentColor" font-size="11">
        {x.ticks.map((t) => (
          <g key={`x${t}`}>
            <line x1={x.f(t)} x2={x.f(t)} y1={M.top} y2={H - M.bottom} stroke="currentColor" opacity="0.12" />
            <text x={x.f(t)} y={H - M.bottom + 14} text-anchor="middle">{tickLabel(t)}</text>
          </g>
        ))}
        {y.ticks.map((t) => (
          <g key={`y${t}`}>
            <line x1={M.left} x2={W - M.right} y1={y.f(t)} y2={y.f(t)} stroke="currentColor" opacity="0.12" />
            <text x={M.left - 6} y={y.f(t) + 4} text-anchor="end">{tickLabel(t)}</text>
          </g>
        ))}
        <text x={(M.left + W - M.right) / 2} y={H - 6} text-anchor="middle" data-testid="roofline-x-label">arithmetic intensity (FLOP/byte, log)</text>
        <text transform={`translate(14 ${(M.top + H - M.bottom) / 2}) rotate(-90)`} text-anchor="middle" data-testid="roofline-y-label">achieved TFLOP/s (log)</text>
      </g>
      {peaks.map(({ c, peak }) => {
        const ridge = bw ? (peak * 1000) / bw : x.lo;
        const x0 = x.f(Math.max(ridge, x.lo));
        return (
          <g key={c} data-testid="roofline-ceiling" data-precision={c} data-peak={peak}>
            {bw ? <line x1={x.f(memStart)} y1={y.f((memStart * bw) / 1000)} x2={x0} y2={y.f(peak)} stroke={color(c)} stroke-width="2" stroke-dasharray="5 3" /> : null}
            <line x1={x0} y1={y.f(peak)} x2={W - M.right} y2={y.f(peak)} stroke={color(c)} stroke-width="2" />
            <text x={W - M.right + 4} y={y.f(peak) + 4} font-size="11" fill={color(c)}>{`${CEILING_LABELS[c] ?? c} ${fmtNum(peak, 1)}`}</text>
          </g>
        );
      })}
      {bw ? (
        <text x={x.f(memStart) + 6} y={y.f((memStart * bw) / 1000) - 6} font-size="11" fill="currentColor" data-testid="roofline-bandwidth">{`memory ${fmtNum(bw)} GB/s (${ceilings.memory})`}</text>
      ) : null}
      {pts.map((p, i) => (
        <circle key={`${i}:${p.name}`} cx={x.f(p.intensity)} cy={y.f(clampY(p.achieved_tflops))} r={picked === i ? 7 : 5}
          fill={color(p.precision)} fill-opacity="0.75" stroke={picked === i ? "currentColor" : "none"} stroke-width="2"
          style={{ cursor: "pointer" }} data-testid="roofline-point" data-index={i} data-precision={p.precision ?? ""}
          onClick={() => onPick(i)}>
          <title>{`${p.name}\n${fmtNum(p.intensity, 2)} FLOP/byte, ${fmtNum(p.achieved_tflops, 2)} TFLOP/s, ${fmtPct(p.pct_of_sol)} of speed of light (${p.bound}-bound)`}</title>
        </circle>
      ))}
      <g font-size="11" data-testid="roofline-legend">
        {[...new Set(pts.map((p) => p.precision ?? "other"))].map((p, i) => (
          <g key={p} transform={`translate(${W - M.right + 4} ${H - M.bottom - 14 * (i + 1)})`}>
            <circle cx="5" cy="-4" r="4" fill={color(p)} />
            <text x="14" y="0" fill="currentColor">{p}</text>
          </g>
        ))}
      </g>
    </svg>
  );
}
