// The window's timeline: CPU threads (ops, runtime calls by nesting depth) and GPU streams
// (kernels, copies, NCCL) on one canvas, iterations marked on top and shaded by what bounds them.
// The server merges events to the pixel width (/timeline), so a 1M-event window never travels
// whole: each pan or zoom redraws the bars at hand at once and asks for the new range after a
// short pause. Names are drawn with fillText and shown in the details as text nodes: inert.
import { useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";
import { api, getJson } from "../api";
import { COLORS } from "../charts";
import { Empty, ErrorBox, KeyValues, Loading, Panel } from "../components";
import { DASH, fmtDims, fmtMs, fmtNum, fmtSi, fmtUs } from "../format";
import type { Report } from "../types";
import { BOUND_PARTS } from "./DashboardView";

interface Row {
  id: number;
  kind: "cpu" | "gpu" | "python";
  label: string;
  events: number;
  lanes: number;
}

interface Iteration {
  step: number | null;
  start_us: number;
  end_us: number;
  bound: string | null;
  bottleneck_ms: Record<string, number>;
}

export interface TimelineAnswer {
  span_us: number;
  start_us: number;
  end_us: number;
  width: number;
  px_us: number;
  rows: Row[];
  categories: string[];
  names: string[];
  bars: { row: number[]; lane: number[]; start: number[]; end: number[]; count: number[]; cat: number[]; name: number[]; id: number[] };
  events: number;
  iterations: Iteration[];
}

interface EventDetails {
  id: number;
  name: string;
  category: string;
  start_us: number;
  dur_us: number;
  op?: string | null;
  tid?: number;
  device?: number;
  stream?: number;
  input_shapes?: unknown[] | null;
  input_types?: string[] | null;
  flops?: number | null;
  stack?: string[] | null;
  grid?: number[] | null;
  block?: number[] | null;
  registers?: number | null;
  shared_mem?: number | null;
  bytes?: number | null;
}

const CAT_COLORS: Record<string, string> = {
  op: COLORS.nonTc, runtime: COLORS.layout, kernel: COLORS.tc, memcpy: COLORS.memory, memset: "#33bbee", nccl: COLORS.communication,
  python: "#607d8b",
};
const BOUND_COLOR = Object.fromEntries(BOUND_PARTS.map(([k, , c]) => [k, c]));
const BOUND_LABEL = Object.fromEntries(BOUND_PARTS.map(([k, l]) => [k, l]));
const LANE_H = { cpu: 14, gpu: 20, python: 12 };
const ROW_GAP = 6;
const BAND_H = 22; // the iterations band
const LABEL_W = 150;
const FETCH_DELAY_MS = 60;

interface Layout {
  rowTop: number[]; // y of each row's first lane
  height: number;
}

function layout(rows: Row[]): Layout {
  const rowTop: number[] = [];
  let y = BAND_H + ROW_GAP;
  for (const r of rows) {
    rowTop[r.id] = y;
    y += r.lanes * LANE_H[r.kind] + ROW_GAP;
  }
  return { rowTop, height: y };
}

type View = [number, number]; // µs from the window start

/** Frame times (input to the next frame after the redraw) for benchmarks/bench_timeline.py. */
declare global {
  interface Window {
    __gpTimelineFrames?: number[];
  }
}

function draw(canvas: HTMLCanvasElement, data: TimelineAnswer, view: View, dark: boolean, selected: number | null): number {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth;
  const lay = layout(data.rows);
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(lay.height * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(lay.height * dpr);
    canvas.style.height = `${lay.height}px`;
  }
  const g = canvas.getContext("2d")!;
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, lay.height);
  const [lo, hi] = view;
  const k = w / (hi - lo);
  const x = (t: number) => (t - lo) * k;
  // iterations: shaded by what bounds them, split in the band by their bottleneck shares
  g.font = "11px Roboto, Arial, sans-serif";
  g.textBaseline = "middle";
  for (const it of data.iterations) {
    const x0 = x(it.start_us);
    const x1 = x(it.end_us);
    if (x1 < 0 || x0 > w) continue;
    if (it.bound) {
      g.globalAlpha = 0.07;
      g.fillStyle = BOUND_COLOR[it.bound] ?? "#999";
      g.fillRect(x0, BAND_H, x1 - x0, lay.height - BAND_H);
    }
    const total = Object.values(it.bottleneck_ms).reduce((a, b) => a + b, 0);
    let cx = x0;
    g.globalAlpha = 0.55;
    for (const [key] of BOUND_PARTS) {
      const share = total > 0 ? (it.bottleneck_ms[key] ?? 0) / total : 0;
      if (share <= 0) continue;
      g.fillStyle = BOUND_COLOR[key];
      g.fillRect(cx, 2, (x1 - x0) * share, BAND_H - 4);
      cx += (x1 - x0) * share;
    }
    g.globalAlpha = 1;
    g.strokeStyle = dark ? "#bbb" : "#555";
    g.beginPath();
    g.moveTo(Math.round(x0) + 0.5, 0);
    g.lineTo(Math.round(x0) + 0.5, lay.height);
    g.stroke();
    if (x1 - x0 > 90) {
      g.fillStyle = dark ? "#fff" : "#000";
      const label = `step ${it.step ?? "?"}${it.bound ? ` · ${BOUND_LABEL[it.bound] ?? it.bound}` : ""}`;
      g.fillText(label, Math.max(x0, 0) + 4, BAND_H / 2, Math.min(x1, w) - Math.max(x0, 0) - 8);
    }
  }
  const b = data.bars;
  const n = b.start.length;
  let drawn = 0;
  for (let i = 0; i < n; i++) {
    const x0 = x(b.start[i]);
    const x1 = x(b.end[i]);
    if (x1 < 0 || x0 > w) continue;
    const row = data.rows[b.row[i]];
    const lh = LANE_H[row.kind];
    const y = lay.rowTop[row.id] + b.lane[i] * lh;
    const bw = Math.max(x1 - x0, 1);
    g.fillStyle = CAT_COLORS[data.categories[b.cat[i]]] ?? "#888";
    g.globalAlpha = b.count[i] > 1 ? 0.75 : 1;
    g.fillRect(x0, y + 1, bw, lh - 2);
    drawn++;
    if (bw > 40) {
      g.globalAlpha = 1;
      g.fillStyle = "#fff";
      const label = b.count[i] > 1 ? `${b.count[i]} events: ${data.names[b.name[i]]}` : data.names[b.name[i]];
      // clipped to the bar, not squeezed into it
      const left = Math.max(x0, 0);
      g.save();
      g.beginPath();
      g.rect(left, y, Math.min(x1, w) - left - 2, lh);
      g.clip();
      g.fillText(label, left + 3, y + lh / 2);
      g.restore();
    }
    if (selected !== null && b.id[i] === selected) {
      g.globalAlpha = 1;
      g.strokeStyle = dark ? "#fff" : "#000";
      g.lineWidth = 2;
      g.strokeRect(x0, y + 1, bw, lh - 2);
      g.lineWidth = 1;
    }
  }
  g.globalAlpha = 1;
  return drawn;
}

/** The bar under (px, py) in canvas pixels, or -1. */
function hitTest(data: TimelineAnswer, view: View, width: number, px: number, py: number): number {
  const lay = layout(data.rows);
  const t = view[0] + (px / width) * (view[1] - view[0]);
  const slack = (2 * (view[1] - view[0])) / width;
  const b = data.bars;
  for (let i = 0; i < b.start.length; i++) {
    const row = data.rows[b.row[i]];
    const lh = LANE_H[row.kind];
    const y = lay.rowTop[row.id] + b.lane[i] * lh;
    if (py >= y && py < y + lh && t >= b.start[i] - slack && t <= b.end[i] + slack) return i;
  }
  return -1;
}

function Details({ ev }: { ev: EventDetails }) {
  const rows: [string, string][] = [
    ["Kind", ev.category],
    ["Start", `${fmtUs(ev.start_us)} after the window start`],
    ["Duration", fmtUs(ev.dur_us)],
  ];
  if (ev.op) rows.push(["Op", ev.op]);
  if (ev.device !== undefined) rows.push(["GPU / stream", `${ev.device} / ${ev.stream}`]);
  if (ev.tid !== undefined) rows.push(["CPU thread", String(ev.tid)]);
  if (ev.flops != null) rows.push(["FLOPs", fmtSi(ev.flops, "FLOP", 2)]);
  if (ev.grid) rows.push(["Grid × block", `${fmtDims(ev.grid)} × ${fmtDims(ev.block)}`]);
  if (ev.registers != null) rows.push(["Registers per thread", fmtNum(ev.registers)]);
  if (ev.shared_mem != null) rows.push(["Shared memory per block", `${fmtNum(ev.shared_mem)} B`]);
  if (ev.bytes != null) rows.push(["Bytes", fmtNum(ev.bytes)]);
  const shapes = ev.input_shapes ?? [];
  return (
    <div data-testid="timeline-details" data-event={ev.id}>
      <h3 class="wrap" data-testid="timeline-event-name">{ev.name}</h3>
      <KeyValues rows={rows} />
      {shapes.length ? (
        <table class="evidence-table" data-testid="timeline-shapes">
          <thead><tr><th>Input</th><th>Shape</th><th>Type</th></tr></thead>
          <tbody>
            {shapes.map((s, i) => (
              <tr key={i}><td>{i}</td><td>{Array.isArray(s) && s.length ? s.join("×") : Array.isArray(s) ? "scalar" : String(s)}</td><td>{ev.input_types?.[i] ?? DASH}</td></tr>
            ))}
          </tbody>
        </table>
      ) : null}
      {ev.stack?.length ? (
        <>
          <div class="muted small">Python stack (innermost last)</div>
          <pre data-testid="timeline-stack">{ev.stack.join("\n")}</pre>
        </>
      ) : null}
    </div>
  );
}

export function TimelineView({ run, step, report, hasTrace, dark }: { run: string; step: number | null; report: Report; hasTrace: boolean; dark: boolean }) {
  const canvas = useRef<HTMLCanvasElement>(null);
  const [data, setData] = useState<TimelineAnswer | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [view, setView] = useState<View | null>(null);
  const [details, setDetails] = useState<EventDetails | null>(null);
  const [selected, setSelected] = useState<number | null>(null);
  const seq = useRef(0);
  const inputAt = useRef<number | null>(null);
  const drag = useRef<{ x: number; view: View; moved: boolean } | null>(null);
  const [drawn, setDrawn] = useState(0);

  const load = (v: View | null) => {
    const id = ++seq.current;
    const width = Math.max(100, Math.round(canvas.current?.clientWidth ?? 1200));
    // ask for a margin of half a screen each side so a pan shows bars before the answer comes
    const params = v ? { start_us: v[0] - (v[1] - v[0]) / 2, end_us: v[1] + (v[1] - v[0]) / 2, width: width * 2 } : { width };
    getJson<TimelineAnswer>("timeline", { run, step, ...params }, false).then(
      (d) => {
        if (id !== seq.current) return;
        setData(d);
        if (!v) setView([d.start_us, d.end_us]);
      },
      (e: unknown) => id === seq.current && setError(e instanceof Error ? e.message : String(e)),
    );
  };
  useEffect(() => {
    if (hasTrace) load(null);
  }, [run, step]);
  // redraw at once on every change (in the render, not after the next paint); fetch the new
  // range once the input pauses
  useLayoutEffect(() => {
    if (!data || !view || !canvas.current) return;
    setDrawn(draw(canvas.current, data, view, dark, selected));
    if (inputAt.current !== null) {
      const t = inputAt.current;
      inputAt.current = null;
      requestAnimationFrame(() => (window.__gpTimelineFrames ??= []).push(performance.now() - t));
    }
  }, [data, view, dark, selected]);
  useEffect(() => {
    if (!view || !data) return;
    const perPx = (view[1] - view[0]) / Math.max(1, canvas.current?.clientWidth ?? 1);
    const covered = view[0] >= data.start_us && view[1] <= data.end_us;
    if (covered && Math.abs(data.px_us / perPx - 1) < 0.1) return; // the bars at hand are right
    const t = setTimeout(() => load(view), FETCH_DELAY_MS);
    return () => clearTimeout(t);
  }, [view]);
  useEffect(() => {
    const c = canvas.current;
    if (!c) return;
    const ro = new ResizeObserver(() => data && view && setDrawn(draw(c, data, view, dark, selected)));
    ro.observe(c);
    return () => ro.disconnect();
  }, [data, view, dark, selected]);

  if (!hasTrace) return <Empty>this run has no raw trace stored, so there is no timeline</Empty>;
  if (error) return <ErrorBox what="timeline" error={error} />;

  const span = data?.span_us ?? 1;
  const clamp = (v: View): View => {
    const min = 0.05; // µs
    let [lo, hi] = v;
    if (hi - lo < min) [lo, hi] = [(lo + hi) / 2 - min / 2, (lo + hi) / 2 + min / 2];
    const margin = span * 0.05;
    if (hi - lo > span + 2 * margin) return [-margin, span + margin];
    if (lo < -margin) [lo, hi] = [-margin, hi - lo - margin];
    if (hi > span + margin) [lo, hi] = [lo - (hi - span - margin), span + margin];
    return [lo, hi];
  };
  const change = (v: View) => {
    inputAt.current = performance.now();
    setView(clamp(v));
  };
  const zoomAt = (factor: number, frac: number) => {
    if (!view) return;
    const t = view[0] + frac * (view[1] - view[0]);
    change([t - (t - view[0]) * factor, t + (view[1] - t) * factor]);
  };
  const onWheel = (e: WheelEvent) => {
    e.preventDefault();
    const c = canvas.current!;
    const r = c.getBoundingClientRect();
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      const d = (e.deltaX || e.deltaY) / r.width;
      if (view) change([view[0] + d * (view[1] - view[0]), view[1] + d * (view[1] - view[0])]);
    } else {
      zoomAt(Math.exp(e.deltaY * 0.002), (e.clientX - r.left) / r.width);
    }
  };
  const onDown = (e: MouseEvent) => {
    if (view) drag.current = { x: e.clientX, view, moved: false };
  };
  const onMove = (e: MouseEvent) => {
    const d = drag.current;
    if (!d) return;
    const dx = e.clientX - d.x;
    if (Math.abs(dx) > 3) d.moved = true;
    if (d.moved) {
      const w = canvas.current!.clientWidth;
      const shift = (-dx / w) * (d.view[1] - d.view[0]);
      change([d.view[0] + shift, d.view[1] + shift]);
    }
  };
  const onUp = (e: MouseEvent) => {
    const d = drag.current;
    drag.current = null;
    if (!d || d.moved || !data || !view) return;
    const c = canvas.current!;
    const r = c.getBoundingClientRect();
    const i = hitTest(data, view, r.width, e.clientX - r.left, e.clientY - r.top);
    if (i < 0) return;
    const id = data.bars.id[i];
    if (id < 0) {
      // a merged bar: zoom into it
      const pad = (data.bars.end[i] - data.bars.start[i]) * 0.1;
      change([data.bars.start[i] - pad, data.bars.end[i] + pad]);
      return;
    }
    setSelected(id);
    getJson<{ event: EventDetails }>("timeline", { run, step, event: id }).then((a) => setDetails(a.event), (err: unknown) => setError(String(err)));
  };

  const lay = data ? layout(data.rows) : null;
  return (
    <div data-testid="view-timeline">
      <div class="toolbar">
        <button data-testid="tl-zoom-in" onClick={() => zoomAt(0.5, 0.5)} title="zoom in">+</button>
        <button data-testid="tl-zoom-out" onClick={() => zoomAt(2, 0.5)} title="zoom out">-</button>
        <button data-testid="tl-reset" onClick={() => data && change([0, span])}>whole window</button>
        <span class="muted" data-testid="tl-range" data-lo={view?.[0]} data-hi={view?.[1]}>
          {view ? `${fmtMs(view[0] / 1000)} – ${fmtMs(view[1] / 1000)} (${fmtMs((view[1] - view[0]) / 1000)} shown)` : ""}
          {data ? ` · ${fmtNum(data.events)} events, ${fmtNum(drawn)} bars drawn` : ""}
        </span>
        <span class="muted small">wheel: zoom · shift+wheel or drag: pan · click: details (a merged bar zooms in)</span>
        <a href={api.traceUrl(run, step)} download data-testid="tl-download">Download trace (Perfetto / chrome://tracing)</a>
      </div>
      <div class="tl-legend">
        {Object.entries(CAT_COLORS).map(([k, c]) => <span key={k}><span class="legend-dot" style={{ background: c }} />{k}</span>)}
        <span class="muted">iterations shaded by:</span>
        {BOUND_PARTS.map(([k, l, c]) => <span key={k}><span class="legend-dot" style={{ background: c, opacity: 0.6 }} />{l}</span>)}
      </div>
      {!data ? <Loading what="Loading timeline" /> : null}
      <div class="tl-body">
        <div class="tl-labels" data-testid="timeline-rows" style={{ width: `${LABEL_W}px`, height: lay ? `${lay.height}px` : undefined }}>
          <div class="tl-label" style={{ top: "0px", height: `${BAND_H}px` }}>iterations</div>
          {data?.rows.map((r) => (
            <div key={r.id} class="tl-label" data-kind={r.kind} style={{ top: `${lay!.rowTop[r.id]}px`, height: `${r.lanes * LANE_H[r.kind]}px` }} title={`${fmtNum(r.events)} events`}>{r.label}</div>
          ))}
        </div>
        <canvas ref={canvas} class="tl-canvas" data-testid="timeline-canvas" data-bars={drawn}
          onWheel={onWheel} onMouseDown={onDown} onMouseMove={onMove} onMouseUp={onUp} onMouseLeave={() => (drag.current = null)} />
      </div>
      <Panel title="Selected event" testId="panel-timeline-details">
        {details ? <Details ev={details} /> : <Empty>click an event to see its op, stack, shapes and FLOPs</Empty>}
      </Panel>
      {report.iterations?.method ? <div class="muted small">iterations by {report.iterations.method}</div> : null}
    </div>
  );
}
