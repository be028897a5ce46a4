// The allocator's peak decomposed (report.memory.devices[i].peak_parts, analysis/memory_parts.py):
// one stacked bar (parameters, gradients, optimizer state, activations, temporaries, from before
// the window; fragmentation and memory outside PyTorch beside it, outside the allocated total),
// a legend with bytes and shares, each part's holders on click, and a second run's bar under it
// with the per-part differences. Module, op and run names are text nodes and attributes only.
import { useState } from "preact/hooks";
import { api } from "../api";
import { Empty, ErrorBox, Loading, Trunc, useAsync } from "../components";
import { DASH, fmtBytes, fmtNum, fmtPct } from "../format";
import type * as Gen from "../report.gen";
import type { Report, RunInfo } from "../types";

type PartName = Gen.MemoryPart["part"];
type Extra = "fragmentation" | "outside_pytorch";

export const PART_LABELS: Record<PartName | Extra, string> = {
  parameters: "parameters",
  gradients: "gradients",
  optimizer_state: "optimizer state",
  activations: "activations",
  temporaries: "temporaries",
  before_window: "from before the window",
  fragmentation: "fragmentation (reserved, not allocated)",
  outside_pytorch: "outside PyTorch (CUDA context, libraries)",
};
const PART_COLORS: Record<PartName | Extra, string> = {
  parameters: "#1976d2",
  gradients: "#33bbee",
  optimizer_state: "#9c27b0",
  activations: "#f57c00",
  temporaries: "#ee3377",
  before_window: "#9e9e9e",
  fragmentation: "#cc3311",
  outside_pytorch: "#607d8b",
};
const NULL_WHY: Partial<Record<PartName, string>> = {
  parameters: "not recorded: the hook had no model to record them from (GpuProfiler(..., model=model)); an imported trace has no such record",
  optimizer_state: "not recorded: the hook had no optimizer to record it from (GpuProfiler(..., optimizer=opt)); an imported trace has no such record",
};

/** The bytes of the bar: the parts' sum (the allocated total, plus on the CPU the recorded
 * tensors its allocator does not count), and the two figures outside it. */
export function partsTotals(pp: Gen.MemoryPeakParts): { inside: number; outside: number } {
  const inside = pp.parts.reduce((s, p) => s + (p.bytes ?? 0), 0);
  const outside = (pp.fragmentation?.bytes ?? 0) + Math.max(pp.outside_pytorch?.bytes ?? 0, 0);
  return { inside, outside };
}

function signedBytes(v: number | null): string {
  if (v === null) return DASH;
  if (v === 0) return "0 B";
  return `${v > 0 ? "+" : "\u2212"}${fmtBytes(Math.abs(v))}`;
}

/** One run's bar: allocated parts, then (hatched, after a gap) what lies outside the allocated total. */
function Bar({ pp, scale, run, selected, onSelect }: { pp: Gen.MemoryPeakParts; scale: number; run: string; selected: string | null; onSelect: (p: string) => void }) {
  const { inside } = partsTotals(pp);
  const w = (b: number) => `${scale > 0 ? (100 * b) / scale : 0}%`;
  const extras: [Extra, number][] = [];
  if (pp.fragmentation && pp.fragmentation.bytes > 0) extras.push(["fragmentation", pp.fragmentation.bytes]);
  if (pp.outside_pytorch && pp.outside_pytorch.bytes > 0) extras.push(["outside_pytorch", pp.outside_pytorch.bytes]);
  return (
    <div class="pp-row">
      <div class="pp-run"><Trunc narrow text={run} /></div>
      <div class="pp-bar" data-testid="memory-parts-bar" data-run={run} role="img" aria-label={`memory at the peak by part, run ${run}`}>
        {pp.parts.filter((p) => (p.bytes ?? 0) > 0).map((p) => (
          <button key={p.part} type="button" class="pp-seg" data-part={p.part} aria-pressed={selected === p.part} onClick={() => onSelect(p.part)}
            title={`${PART_LABELS[p.part]}: ${fmtBytes(p.bytes)} (${fmtPct(inside > 0 ? (100 * (p.bytes ?? 0)) / inside : null)})`}
            style={{ width: w(p.bytes ?? 0), background: PART_COLORS[p.part] }} />
        ))}
        {extras.length ? <span class="pp-gap" /> : null}
        {extras.map(([k, b]) => (
          <span key={k} class="pp-seg pp-outside" data-part={k} title={`${PART_LABELS[k]}: ${fmtBytes(b)}, outside the allocated total`}
            style={{ width: w(b), background: PART_COLORS[k] }} />
        ))}
      </div>
      <div class="pp-total num" data-testid="memory-parts-total">{fmtBytes(inside)}</div>
    </div>
  );
}

function Legend({ pp, selected, onSelect }: { pp: Gen.MemoryPeakParts; selected: string | null; onSelect: (p: string) => void }) {
  const { inside } = partsTotals(pp);
  return (
    <div class="tablewrap">
      <table data-testid="memory-parts-legend">
        <thead><tr><th>Part</th><th class="num">Bytes at the peak</th><th class="num">Share of the parts</th><th class="num">Allocations</th><th class="num">Holders</th></tr></thead>
        <tbody>
          {pp.parts.map((p) => (
            <tr key={p.part} data-part={p.part} class={selected === p.part ? "selected" : undefined}>
              <td data-col="part">
                <button type="button" class="linklike" onClick={() => onSelect(p.part)} aria-pressed={selected === p.part}>
                  <span class="legend-dot" style={{ background: PART_COLORS[p.part] }} />{PART_LABELS[p.part]}
                </button>
              </td>
              {p.bytes === null ? (
                <td colSpan={4} class="muted" data-col="bytes">{NULL_WHY[p.part] ?? "not recorded"}</td>
              ) : (
                <>
                  <td class="num" data-col="bytes">{fmtBytes(p.bytes)}</td>
                  <td class="num" data-col="share">{fmtPct(inside > 0 ? (100 * p.bytes) / inside : null)}</td>
                  <td class="num" data-col="allocations">{fmtNum(p.allocations)}</td>
                  <td class="num" data-col="holders">{fmtNum(p.holders_total)}</td>
                </>
              )}
            </tr>
          ))}
          <tr class="muted" data-part="fragmentation">
            <td data-col="part"><span class="legend-dot pp-outside" style={{ background: PART_COLORS.fragmentation }} />{PART_LABELS.fragmentation}</td>
            <td colSpan={4} data-col="bytes">
              {pp.fragmentation ? `${fmtBytes(pp.fragmentation.bytes)}, outside the allocated total` : "none: the CPU allocator keeps no reserve, or the trace has no reserve at the peak"}
            </td>
          </tr>
          <tr class="muted" data-part="outside_pytorch">
            <td data-col="part"><span class="legend-dot pp-outside" style={{ background: PART_COLORS.outside_pytorch }} />{PART_LABELS.outside_pytorch}</td>
            <td colSpan={4} data-col="bytes">
              {pp.outside_pytorch
                ? `${fmtBytes(pp.outside_pytorch.bytes)}, outside the allocated total (NVML ${pp.outside_pytorch.scope === "process" ? "this process" : "all processes"} ${fmtBytes(pp.outside_pytorch.nvml_used_bytes)} \u2212 reserved ${fmtBytes(pp.outside_pytorch.reserved_bytes)})`
                : "not known: no NVML samples for this one GPU in the window"}
            </td>
          </tr>
        </tbody>
      </table>
    </div>
  );
}

function PartHolders({ part }: { part: Gen.MemoryPart }) {
  if (part.bytes === null) return <Empty>{NULL_WHY[part.part] ?? "not recorded"}</Empty>;
  if (!part.holders.length) return <Empty>no holder recorded for {PART_LABELS[part.part]}</Empty>;
  return (
    <div class="tablewrap">
      <table data-testid="memory-part-holders" data-part={part.part}>
        <thead><tr><th>Module</th><th>Op</th><th>Source</th><th class="num">Bytes</th><th class="num">Allocations</th></tr></thead>
        <tbody>
          {part.holders.map((h, i) => (
            <tr key={i}>
              <td data-col="module"><Trunc text={h.module ?? DASH} /></td>
              <td data-col="op"><Trunc text={h.op ?? DASH} /></td>
              <td data-col="source"><Trunc text={h.source ?? DASH} /></td>
              <td class="num" data-col="bytes">{fmtBytes(h.bytes)}</td>
              <td class="num" data-col="allocations">{fmtNum(h.allocations)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {part.holders_total > part.holders.length ? <div class="muted small">the {part.holders.length} largest of {fmtNum(part.holders_total)} holders</div> : null}
    </div>
  );
}

function Notes({ pp }: { pp: Gen.MemoryPeakParts }) {
  const notes: string[] = [];
  if (pp.uncounted_bytes > 0) {
    notes.push(`The allocator counted ${fmtBytes(pp.allocated_bytes)} at the peak; the parts add ${fmtBytes(pp.uncounted_bytes)} of recorded tensors it does not count (the CPU allocator counts only what it allocates while profiling).`);
  }
  if (!pp.sum_matches_allocated) notes.push("The parts do not sum to the allocator's total (within 1%): the events and the allocator's count disagree.");
  if (!pp.tensors_recorded.length) notes.push("No record of the model's and optimizer's tensors (an imported trace, or the hook without model= and optimizer=): parameters and optimizer state cannot be told apart.");
  if (pp.backward_passes === 0) notes.push("No backward pass found in the trace: activations and gradients cannot be told from temporaries.");
  return notes.length ? <ul class="small muted" data-testid="memory-parts-notes">{notes.map((n, i) => <li key={i}>{n}</li>)}</ul> : null;
}

function DiffTable({ a, b, runA, runB }: { a: Gen.MemoryPeakParts; b: Gen.MemoryPeakParts; runA: string; runB: string }) {
  const byPart = new Map(b.parts.map((p) => [p.part, p]));
  const row = (key: string, label: string, x: number | null, y: number | null) => (
    <tr key={key} data-part={key}>
      <td data-col="part">{label}</td>
      <td class="num" data-col="a">{fmtBytes(x)}</td>
      <td class="num" data-col="b">{fmtBytes(y)}</td>
      <td class="num" data-col="diff">{signedBytes(x === null || y === null ? null : y - x)}</td>
    </tr>
  );
  return (
    <div class="tablewrap">
      <table data-testid="memory-parts-diff">
        <thead><tr><th>Part</th><th class="num"><Trunc narrow text={runA} /></th><th class="num"><Trunc narrow text={runB} /></th><th class="num">Difference</th></tr></thead>
        <tbody>
          {a.parts.map((p) => row(p.part, PART_LABELS[p.part], p.bytes, byPart.get(p.part)?.bytes ?? null))}
          {row("total", "all parts", partsTotals(a).inside, partsTotals(b).inside)}
          {row("fragmentation", "fragmentation (outside)", a.fragmentation?.bytes ?? null, b.fragmentation?.bytes ?? null)}
          {row("outside_pytorch", "outside PyTorch (outside)", a.outside_pytorch?.bytes ?? null, b.outside_pytorch?.bytes ?? null)}
        </tbody>
      </table>
      <div class="muted small">difference: {runB} minus {runA}</div>
    </div>
  );
}

function deviceOf(report: Report | null | undefined, device: string): Gen.MemoryDevice | null {
  const devs = report?.memory?.devices ?? [];
  return devs.find((d) => d.device === device) ?? devs[0] ?? null;
}

/** The decomposition of one device's peak, and another run's beside it on request. */
export function PeakParts({ run, runs, dev }: { run: string; runs: RunInfo[]; dev: Gen.MemoryDevice }) {
  const pp = dev.peak_parts;
  const [selected, setSelected] = useState<string | null>(null);
  const [other, setOther] = useState("");
  const others = runs.filter((r) => r.run !== run && r.reports.length && !r.error);
  const cmp = useAsync<Report>(() => (other ? api.report(other, null) : null), [other]);
  if (!pp) {
    return <Empty>this report has no decomposition of the peak (made before tb_gpuprof decomposed it); profile the run again, or open it with the installed tb_gpuprof so its raw trace is read again</Empty>;
  }
  const otherDev = other ? deviceOf(cmp.data, dev.device) : null;
  const otherPp = otherDev?.peak_parts ?? null;
  const t = partsTotals(pp);
  const scale = Math.max(t.inside + t.outside, otherPp ? partsTotals(otherPp).inside + partsTotals(otherPp).outside : 0);
  const sel = pp.parts.find((p) => p.part === selected) ?? null;
  return (
    <div data-testid="memory-parts">
      <Bar pp={pp} scale={scale} run={run} selected={selected} onSelect={setSelected} />
      {otherPp ? <Bar pp={otherPp} scale={scale} run={other} selected={selected} onSelect={setSelected} /> : null}
      <div class="muted small">one bar per run, on one scale: the parts of the allocated memory at the peak; hatched after the gap, memory outside the allocated total (fragmentation, outside PyTorch). Click a part for what holds it.</div>
      <Notes pp={pp} />
      <Legend pp={pp} selected={selected} onSelect={setSelected} />
      {sel ? (
        <div data-testid="memory-part-detail">
          <h4>What holds {PART_LABELS[sel.part]}</h4>
          <PartHolders part={sel} />
        </div>
      ) : <div class="muted small">click a part (bar or legend) to list what holds it: modules for recorded tensors, else the op and source line that allocated it</div>}
      <div class="toolbar pp-compare">
        <label>Compare with run{" "}
          <select data-testid="memory-compare-select" value={other} onChange={(e) => setOther((e.target as HTMLSelectElement).value)}>
            <option value="">none</option>
            {others.map((r) => <option key={r.run} value={r.run}>{r.run}</option>)}
          </select>
        </label>
      </div>
      {other ? (
        cmp.error ? <ErrorBox what={`run “${other}”`} error={cmp.error} />
          : !cmp.data ? <Loading what="Loading the other run" />
          : !otherDev ? <Empty>run “{other}” recorded no allocator events: nothing to compare</Empty>
          : !otherPp ? <Empty>run “{other}” has no decomposition of its peak (a report made before tb_gpuprof decomposed it)</Empty>
          : <DiffTable a={pp} b={otherPp} runA={run} runB={other} />
      ) : null}
    </div>
  );
}
