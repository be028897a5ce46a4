// The allocator over the profiled window (report.memory): allocated and reserved over time, the
// peak and the ops (and source lines) whose allocations were live at it, per-iteration peaks of
// the window and of the whole run (the hook's always-on scalars), NVML framebuffer use.
// Op names and stacks come from traces: they are text nodes and attributes only.
import { useMemo, useState } from "preact/hooks";
import { api } from "../api";
import { Chart } from "../charts";
import { Empty, ErrorBox, KeyValues, Panel, Trunc, useAsync } from "../components";
import { DASH, fmtBytes, fmtMs, fmtNum, fmtPct } from "../format";
import { PeakParts } from "./MemoryParts";
import type * as Gen from "../report.gen";
import type { OomReport, Point, Report, RunInfo } from "../types";

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;

/** Bytes in the unit that suits the largest value: [divisor, unit]. */
function byteScale(max: number): [number, string] {
  return max >= GIB ? [GIB, "GiB"] : max >= MIB ? [MIB, "MiB"] : [1024, "KiB"];
}

/** Indices of the series' points inside [lo, hi] ms, and the one before (where the step starts). */
export function pointsIn(t: number[], lo: number, hi: number): { from: number; to: number } {
  let from = 0;
  while (from < t.length && t[from] < lo) from++;
  let to = from;
  while (to < t.length && t[to] <= hi) to++;
  return { from, to };
}

function OverTime({ run, step, dev, dark }: { run: string; step: number | null; dev: Gen.MemoryDevice; dark: boolean }) {
  const whole = dev.series;
  const end = whole.t_ms.length ? whole.t_ms[whole.t_ms.length - 1] : 0;
  const [range, setRange] = useState<[number, number]>([0, end]);
  const [lo, hi] = range;
  // a zoomed range of a down-sampled window: the server samples the raw trace's events again
  const zoomed = (lo > 0 || hi < end) && whole.downsampled_from > whole.t_ms.length;
  const finer = useAsync(() => (zoomed ? api.memory(run, step, dev.device, lo, hi) : null), [run, step, dev.device, lo, hi, zoomed]);
  const s = zoomed && finer.data ? finer.data.series : whole;
  const { from, to } = pointsIn(s.t_ms, lo, hi);
  const option = useMemo(() => {
    const [div, unit] = byteScale(Math.max(dev.peak.allocated_bytes, dev.max_reserved_bytes ?? 0));
    const first = Math.max(from - 1, 0); // the step drawn into the range starts before it
    const line = (name: string, values: number[], dashed = false) => ({
      type: "line", name, step: "end", showSymbol: false, sampling: undefined,
      lineStyle: dashed ? { type: "dashed" } : undefined,
      data: s.t_ms.slice(first, to).map((t, i) => [t, values[first + i] / div]),
    });
    const series = [line("allocated", s.allocated_bytes)];
    if (s.reserved_bytes) series.push(line("reserved", s.reserved_bytes, true));
    return {
      grid: { left: 64, right: 24, top: 36, bottom: 44 },
      legend: { top: 0 },
      tooltip: { trigger: "axis", valueFormatter: (v: number) => `${fmtNum(v, 2)} ${unit}` },
      xAxis: { type: "value", name: "time in the window (ms)", nameLocation: "middle", nameGap: 28, min: lo, max: hi },
      yAxis: { type: "value", name: unit, min: 0 },
      series,
    };
  }, [dev, s, lo, hi]);
  let peakI = -1;
  for (let i = from; i < to; i++) if (peakI < 0 || s.allocated_bytes[i] > s.allocated_bytes[peakI]) peakI = i;
  const set = (which: 0 | 1) => (e: Event) => {
    const v = Number((e.target as HTMLInputElement).value);
    if (!Number.isFinite(v)) return;
    const next: [number, number] = [...range] as [number, number];
    next[which] = Math.min(Math.max(v, 0), end);
    if (next[0] < next[1]) setRange(next);
  };
  return (
    <>
      <div class="toolbar" data-testid="memory-range" data-lo={lo} data-hi={hi} data-points={to - from} data-source={s === whole ? "report" : "trace"}>
        <label>from <input type="number" step="any" min={0} max={end} value={lo} onChange={set(0)} data-testid="memory-range-from" /> ms</label>
        <label>to <input type="number" step="any" min={0} max={end} value={hi} onChange={set(1)} data-testid="memory-range-to" /> ms</label>
        <button type="button" onClick={() => setRange([0, end])} disabled={lo === 0 && hi === end} data-testid="memory-range-reset">whole window</button>
        <span class="muted small" data-testid="memory-range-text">
          {fmtMs(lo)} to {fmtMs(hi)} of {fmtMs(end)}: {fmtNum(to - from)} points{s === whole ? "" : ", sampled again from the trace"}
          {peakI >= 0 ? `, highest ${fmtBytes(s.allocated_bytes[peakI])} at ${fmtMs(s.t_ms[peakI])}` : ""}
          {zoomed && finer.error ? " (the raw trace could not be read again: the report's points are drawn)" : ""}
        </span>
      </div>
      <Chart option={option} dark={dark} height={300} label={`memory over the window on ${dev.device}`} testId="memory-chart" />
    </>
  );
}

function Holders({ dev }: { dev: Gen.MemoryDevice }) {
  const peak = dev.peak.allocated_bytes;
  if (!dev.holders.length) return <Empty>no allocation recorded in the window was live at the peak</Empty>;
  return (
    <div class="tablewrap">
      <table data-testid="memory-holders">
        <thead>
          <tr><th>Op</th><th>Source</th><th class="num">Held at the peak</th><th class="num">Share of the peak</th><th class="num">Allocations</th></tr>
        </thead>
        <tbody>
          {dev.holders.map((h, i) => (
            <tr key={i}>
              <td data-testid="memory-holder-op"><Trunc text={h.op} /></td>
              <td><Trunc text={h.source} title={h.stack?.join("\n") ?? undefined} /></td>
              <td class="num">{fmtBytes(h.bytes)}</td>
              <td class="num">{fmtPct(peak > 0 ? (100 * h.bytes) / peak : null)}</td>
              <td class="num">{fmtNum(h.allocations)}</td>
            </tr>
          ))}
          {dev.held_before_window_bytes > 0 ? (
            <tr class="muted">
              <td>allocated before the profiled window</td><td>weights, optimizer state, data already there</td>
              <td class="num">{fmtBytes(dev.held_before_window_bytes)}</td>
              <td class="num">{fmtPct(peak > 0 ? (100 * dev.held_before_window_bytes) / peak : null)}</td><td class="num">{DASH}</td>
            </tr>
          ) : null}
        </tbody>
      </table>
      {dev.holders_total > dev.holders.length ? <div class="muted small">the {dev.holders.length} largest of {fmtNum(dev.holders_total)} ops holding memory</div> : null}
    </div>
  );
}

function RunPeaks({ run, tags, dark }: { run: RunInfo; tags: Record<string, string>; dark: boolean }) {
  // the report names the always-on tags (tb_gpuprof/store/layout.py owns them)
  const allocTag = tags.allocated_peak_mb ?? "";
  const resTag = tags.reserved_peak_mb ?? "";
  const has = allocTag !== "" && run.scalar_tags.includes(allocTag);
  const alloc = useAsync(() => (has ? api.scalars(run.run, allocTag) : null), [run.run, has]);
  const res = useAsync(() => (has && run.scalar_tags.includes(resTag) ? api.scalars(run.run, resTag) : null), [run.run, has]);
  const option = useMemo(() => {
    const toGiB = (p: Point[]) => p.map(([step, , v]) => [step, v / 1024]);
    const series = [{ type: "line", name: "allocated peak", showSymbol: false, data: toGiB(alloc.data?.points ?? []) }];
    if (res.data) series.push({ type: "line", name: "reserved peak", showSymbol: false, data: toGiB(res.data.points) });
    return {
      grid: { left: 64, right: 24, top: 36, bottom: 44 },
      legend: { top: 0 },
      tooltip: { trigger: "axis", valueFormatter: (v: number) => `${fmtNum(v, 2)} GiB` },
      xAxis: { type: "value", name: "step", nameLocation: "middle", nameGap: 28 },
      yAxis: { type: "value", name: "GiB", min: 0 },
      series,
    };
  }, [alloc.data, res.data]);
  if (!has) return <Empty>no per-iteration memory peaks in this run: the PyTorch hook records them on a CUDA GPU (GpuProfiler(..., memory=True), the default)</Empty>;
  if (alloc.error) return <ErrorBox what="memory scalars" error={alloc.error} />;
  return <Chart option={option} dark={dark} height={240} label="per-iteration memory peaks over the run" testId="memory-run-chart" />;
}

function OomFailure({ r }: { r: OomReport }) {
  const largest = r.last_peak?.parts.find((p) => p.part === r.largest_part);
  return (
    <div data-testid="oom-report">
      <KeyValues rows={[
        ["Failed at", `iteration ${r.step ?? DASH}${r.device ? ` on ${r.device}` : ""}${r.batch_size != null ? `, batch size ${r.batch_size}` : ""}`],
        ["Allocated / reserved", `${fmtBytes(r.allocator.allocated_bytes)} / ${fmtBytes(r.allocator.reserved_bytes)}`],
        ["Largest part", r.largest_part ? `${r.largest_part} (${fmtBytes(largest?.bytes ?? null)}, at the ${r.last_peak?.source ?? "last"} peak)` : DASH],
      ]} />
      <pre class="small" data-testid="oom-error">{`${r.error.type}: ${r.error.message}`}</pre>
      <div class="tablewrap">
        <table data-testid="oom-advice">
          <thead><tr><th>Fix</th><th class="num">Saves</th><th>Fits then</th><th>How</th></tr></thead>
          <tbody>
            {r.advice.map((a) => (
              <tr key={a.fix}>
                <td>{a.fix}{a.largest_batch_size != null ? ` → ${a.largest_batch_size}` : ""}</td>
                <td class="num">{fmtBytes(a.predicted_saving_bytes)}</td>
                <td>{a.fits == null ? DASH : a.fits ? "yes" : "no"}</td>
                <td>{a.detail}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {r.notes.map((n, i) => <div key={i} class="muted small">{n}</div>)}
    </div>
  );
}

/** The run's out-of-memory reports, above the window's figures; nothing where there are none. */
function OutOfMemory({ run }: { run: string }) {
  const oom = useAsync(() => api.oom(run), [run]);
  if (oom.error) return <ErrorBox what="out-of-memory reports" error={oom.error} />;
  const reports = oom.data?.reports ?? [];
  if (!reports.length) return null;
  return (
    <Panel title="Out of memory" testId="panel-oom">
      {reports.map((r, i) => <OomFailure key={i} r={r} />)}
    </Panel>
  );
}

function Nvml({ rows }: { rows: Gen.MemoryNvml[] }) {
  return (
    <div class="tablewrap">
      <table data-testid="memory-nvml">
        <thead><tr><th>GPU</th><th class="num">Used (mean)</th><th class="num">Used (max)</th><th class="num">Total</th><th class="num">This process (max)</th></tr></thead>
        <tbody>
          {rows.map((g, i) => (
            <tr key={i}>
              <td>{g.gpu ?? DASH}{g.name ? ` · ${g.name}` : ""}</td>
              <td class="num">{g.used_mib_mean == null ? DASH : fmtBytes(g.used_mib_mean * MIB)}</td>
              <td class="num">{g.used_mib_max == null ? DASH : fmtBytes(g.used_mib_max * MIB)}</td>
              <td class="num">{g.total_mib == null ? DASH : fmtBytes(g.total_mib * MIB)}</td>
              <td class="num">{g.process_mib_max == null ? DASH : fmtBytes(g.process_mib_max * MIB)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function MemoryView({ run, step, runs, report, dark }: { run: RunInfo; step: number | null; runs: RunInfo[]; report: Report; dark: boolean }) {
  const mem = report.memory;
  const [pick, setPick] = useState(0);
  const devices = mem?.devices ?? [];
  const dev = devices[Math.min(pick, devices.length - 1)];
  const tags = mem?.scalar_tags ?? {};
  return (
    <div data-testid="view-memory">
      <OutOfMemory run={run.run} />
      {!mem || !mem.recorded || !dev ? (
        <Panel title="Allocator over the window">
          <Empty>{mem?.note ?? "this report was made before tb_gpuprof read allocator events; profile the run again (the PyTorch hook records them by default, record_memory=True)"}</Empty>
        </Panel>
      ) : (
        <>
          {devices.length > 1 ? (
            <div class="toolbar" data-testid="memory-devices">
              {devices.map((d, i) => <button key={d.device} aria-pressed={d === dev} onClick={() => setPick(i)}>{d.device}</button>)}
            </div>
          ) : null}
          <Panel title={`Allocator over the window · ${dev.device}`} extra={<span class="muted">{fmtNum(dev.events)} allocations and frees</span>}>
            <KeyValues testId="memory-peak" rows={[
              ["Peak allocated", fmtBytes(dev.peak.allocated_bytes)],
              ["At", `${fmtMs(dev.peak.t_ms)} into the window${dev.peak.step != null ? `, step ${dev.peak.step}` : ""}`],
              ["Reserved at the peak", fmtBytes(dev.peak.reserved_bytes)],
              ["Highest reserve", fmtBytes(dev.max_reserved_bytes)],
            ]} />
            <OverTime key={dev.device} run={run.run} step={step} dev={dev} dark={dark} />
            {dev.series.downsampled_from > dev.series.t_ms.length ? <div class="muted small">{fmtNum(dev.series.t_ms.length)} of {fmtNum(dev.series.downsampled_from)} events drawn (each time slice's lowest and highest: the peak is kept)</div> : null}
          </Panel>
          <Panel title="The peak by part" testId="panel-memory-parts">
            <PeakParts key={`${run.run}/${dev.device}`} run={run.run} runs={runs} dev={dev} />
          </Panel>
          <Panel title="What held memory at the peak" testId="panel-memory-holders">
            <Holders dev={dev} />
          </Panel>
          <Panel title="Peak per iteration of the window">
            <div class="tablewrap">
              <table data-testid="memory-iterations">
                <thead><tr><th>Step</th><th class="num">Allocated (peak)</th><th class="num">Reserved (peak)</th></tr></thead>
                <tbody>
                  {dev.iterations.map((it, i) => (
                    <tr key={i}><td>{it.step ?? `#${i + 1}`}</td><td class="num">{fmtBytes(it.allocated_bytes)}</td><td class="num">{fmtBytes(it.reserved_bytes)}</td></tr>
                  ))}
                </tbody>
              </table>
            </div>
          </Panel>
        </>
      )}
      <Panel title="Peak per iteration over the run">
        <RunPeaks run={run} tags={tags} dark={dark} />
      </Panel>
      {mem?.nvml?.length ? (
        <Panel title="GPU memory in use (NVML, over the window)">
          <Nvml rows={mem.nvml} />
        </Panel>
      ) : null}
    </div>
  );
}
