// NVML telemetry: one zoomable time-series chart per metric (lines per GPU), the window averages
// stored in the report, and the topology matrix like `nvidia-smi topo -m`.
import { useMemo, useState } from "preact/hooks";
import { api } from "../api";
import { Chart } from "../charts";
import { Empty, ErrorBox, KeyValues, Loading, Panel, useAsync } from "../components";
import { fmtNum, fmtValue, humanize } from "../format";
import type { Point, Report } from "../types";

const UNITS: [RegExp, string][] = [[/_pct$/, "%"], [/_mib_s$/, "MiB/s"], [/_w$/, "W"], [/_c$/, "°C"], [/_mhz$/, "MHz"], [/_mb$/, "MB"], [/_mib$/, "MiB"], [/_bytes$/, "B"], [/_gbps$/, "GB/s"]];

function unitOf(metric: string): string {
  for (const [re, u] of UNITS) if (re.test(metric)) return u;
  return "";
}

/** "gpu0/sm_util_pct" -> ["gpu0", "sm_util_pct"]; a key without a device prefix is its own metric. */
function splitKey(key: string): [string, string] {
  const i = key.indexOf("/");
  return i < 0 ? ["", key] : [key.slice(0, i), key.slice(i + 1)];
}

// What a user looks at first: utilization and Tensor Core activity, then memory, power, heat, clocks.
const PRIORITY = ["sm_util_pct", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "hmma_tensor_active_pct",
  "mem_util_pct", "dram_bw_pct", "fb_used_mib", "power_w", "gpu_temp_c", "mem_temp_c", "sm_clock_mhz", "mem_clock_mhz",
  "clock_event_power_pct", "clock_event_thermal_pct"];

export function metricOrder(a: string, b: string): number {
  const ia = PRIORITY.indexOf(a);
  const ib = PRIORITY.indexOf(b);
  if (ia !== ib) return (ia < 0 ? PRIORITY.length : ia) - (ib < 0 ? PRIORITY.length : ib);
  return a.localeCompare(b);
}

const byDevice = (a: string, b: string) => a.localeCompare(b, "en", { numeric: true });

// What each NVML metric is, in words (tb_gpuprof/nvml/fields.py METRICS).
const METRIC_LABELS: Record<string, string> = {
  sm_util_pct: "NVML utilization (a kernel was running)", mem_util_pct: "NVML memory utilization",
  enc_util_pct: "Video encoder", dec_util_pct: "Video decoder", power_w: "Power draw", power_limit_w: "Power limit",
  gpu_temp_c: "GPU temperature", mem_temp_c: "HBM temperature", sm_clock_mhz: "SM clock", mem_clock_mhz: "Memory clock",
  fb_used_mib: "Memory used", fb_total_mib: "Memory total", fb_used_pct: "Memory used (share)", process_mem_mib: "Memory of this process",
  pcie_tx_mib_s: "PCIe from the GPU", pcie_rx_mib_s: "PCIe to the GPU",
  clock_event_power_pct: "Samples with power-cap clock events", clock_event_thermal_pct: "Samples with thermal clock events",
  sm_active_pct: "SM active (GPM)", sm_occupancy_pct: "SM occupancy (GPM)", tensor_active_pct: "Tensor Core active (GPM)",
  hmma_tensor_active_pct: "FP16/BF16/TF32 Tensor Core active", imma_tensor_active_pct: "INT8 Tensor Core active",
  dfma_tensor_active_pct: "FP64 Tensor Core active", dram_bw_pct: "DRAM bandwidth (of peak)",
  fp16_active_pct: "FP16 pipe active (non-tensor)", fp32_active_pct: "FP32 pipe active (non-tensor)", fp64_active_pct: "FP64 pipe active (non-tensor)",
  nvlink_rx_mib_s: "NVLink receive", nvlink_tx_mib_s: "NVLink transmit",
};

export const metricLabel = (m: string): string => METRIC_LABELS[m] ?? humanize(m);

interface Line {
  metric: string;
  dashed?: boolean;
  axis?: 1; // the right-hand axis
}

interface KeyChart {
  id: string;
  title: string;
  unit: string;
  lines: Line[];
  right?: string; // unit of the right-hand axis
  scale?: number; // divide values (MiB -> GiB)
}

/** The charts a user reads first; each is drawn when one of its left-axis metrics is non-zero. */
export const KEY_CHARTS: KeyChart[] = [
  { id: "sm", title: "SM active vs NVML utilization", unit: "%", lines: [{ metric: "sm_active_pct" }, { metric: "sm_util_pct", dashed: true }] },
  { id: "tensor", title: "Tensor Core active", unit: "%", lines: [{ metric: "tensor_active_pct" }, { metric: "hmma_tensor_active_pct", dashed: true }] },
  { id: "dram", title: "DRAM bandwidth", unit: "% of peak", lines: [{ metric: "dram_bw_pct" }, { metric: "mem_util_pct", dashed: true }] },
  { id: "power", title: "Power vs limit", unit: "W", lines: [{ metric: "power_w" }, { metric: "power_limit_w", dashed: true }] },
  { id: "memory", title: "Memory used vs total", unit: "GiB", scale: 1024, lines: [{ metric: "fb_used_mib" }, { metric: "fb_total_mib", dashed: true }, { metric: "process_mem_mib" }] },
  { id: "clocks", title: "Clocks and throttle reasons", unit: "MHz", right: "% of samples", lines: [{ metric: "sm_clock_mhz" }, { metric: "mem_clock_mhz" },
    { metric: "clock_event_power_pct", axis: 1, dashed: true }, { metric: "clock_event_thermal_pct", axis: 1, dashed: true }] },
];

type Series = Map<string, [string, Point[]][]>; // metric -> [device, points][]

/** A metric is worth a chart when some GPU reported a finite, non-zero value. */
export function informative(series: [string, Point[]][]): boolean {
  return series.some(([, pts]) => pts.some((p) => Number.isFinite(p[2]) && p[2] !== 0));
}

const timeAxis = { type: "value", name: "time (s)", nameLocation: "middle", nameGap: 24, min: "dataMin", max: "dataMax",
  axisLabel: { hideOverlap: true, formatter: (v: number) => fmtNum(v, v >= 100 ? 0 : v >= 10 ? 1 : 2) } };

function KeyMetricChart({ spec, byMetric, t0, dark }: { spec: KeyChart; byMetric: Series; t0: number; dark: boolean }) {
  const lines = spec.lines.filter((l) => byMetric.has(l.metric) && (l.axis !== 1 || informative(byMetric.get(l.metric)!)));
  const option = useMemo(() => {
    const k = spec.scale ?? 1;
    const devices = new Set(lines.flatMap((l) => byMetric.get(l.metric)!.map(([d]) => d)));
    const series = lines.flatMap((l) => byMetric.get(l.metric)!.map(([dev, pts]) => ({
      type: "line", showSymbol: false, yAxisIndex: l.axis ?? 0,
      name: devices.size > 1 ? `${dev.toUpperCase()} ${metricLabel(l.metric)}` : metricLabel(l.metric),
      lineStyle: l.dashed ? { type: "dashed" } : undefined,
      data: pts.map((p) => [p[1] - t0, l.axis === 1 ? p[2] : p[2] / k]),
    })));
    const pct = spec.unit.startsWith("%");
    const yAxis: Record<string, unknown>[] = [{ type: "value", name: spec.unit, min: 0, max: pct ? 100 : undefined }];
    if (spec.right) yAxis.push({ type: "value", name: spec.right, min: 0, max: 100, splitLine: { show: false } });
    return {
      grid: { left: 56, right: spec.right ? 56 : 16, top: 52, bottom: 64 },
      legend: { top: 0, type: "scroll" },
      tooltip: { trigger: "axis", valueFormatter: (v: number) => fmtNum(v, 1) },
      xAxis: timeAxis, yAxis,
      dataZoom: [{ type: "inside" }, { type: "slider", height: 14, bottom: 6 }],
      series,
    };
  }, [byMetric, spec]);
  return (
    <Panel title={spec.title} testId={`key-chart-${spec.id}`} extra={<span class="muted" data-metrics={lines.map((l) => l.metric).join(",")}>{spec.unit}{spec.right ? ` · ${spec.right}` : ""}</span>}>
      <Chart option={option} dark={dark} height={240} label={`${spec.title} over time`} />
    </Panel>
  );
}

function MetricChart({ metric, series, t0, dark }: { metric: string; series: [string, Point[]][]; t0: number; dark: boolean }) {
  const unit = unitOf(metric);
  const option = useMemo(
    () => ({
      grid: { left: 56, right: 16, top: 28, bottom: 64 },
      legend: series.length > 1 ? { top: 0 } : undefined,
      tooltip: { trigger: "axis", valueFormatter: (v: number) => `${fmtNum(v, 1)} ${unit}` },
      xAxis: timeAxis,
      yAxis: { type: "value", name: unit, scale: unit !== "%", max: unit === "%" ? 100 : undefined },
      dataZoom: [{ type: "inside" }, { type: "slider", height: 14, bottom: 6 }],
      series: series.map(([dev, pts]) => ({ type: "line", name: dev.toUpperCase() || metric, showSymbol: false, data: pts.map((p) => [p[1] - t0, p[2]]) })),
    }),
    [series],
  );
  return (
    <Panel title={metricLabel(metric)} testId={`telemetry-${metric}`} extra={<span class="muted">{unit}</span>}>
      <Chart option={option} dark={dark} height={220} label={`${metricLabel(metric)} over time`} />
    </Panel>
  );
}

/** Key charts first; every other informative metric under "all metrics"; flat-zero ones named only. */
function Curated({ byMetric, t0, dark }: { byMetric: Series; t0: number; dark: boolean }) {
  const [all, setAll] = useState(false);
  const keyCharts = KEY_CHARTS.filter((c) => c.lines.some((l) => l.axis !== 1 && byMetric.has(l.metric) && informative(byMetric.get(l.metric)!)));
  const inKey = new Set(keyCharts.flatMap((c) => c.lines.map((l) => l.metric)));
  const rest = [...byMetric.entries()].filter(([m]) => !inKey.has(m)).sort(([a], [b]) => metricOrder(a, b));
  const shown = rest.filter(([, s]) => informative(s));
  const hidden = rest.filter(([, s]) => !informative(s)).map(([m]) => m);
  return (
    <>
      <div class="grid2" data-testid="key-charts">
        {keyCharts.map((c) => <KeyMetricChart key={c.id} spec={c} byMetric={byMetric} t0={t0} dark={dark} />)}
      </div>
      <Panel title="All metrics" testId="all-metrics" extra={
        <button data-testid="all-metrics-toggle" aria-expanded={all} onClick={() => setAll(!all)}>{all ? "hide" : `show ${shown.length}`}</button>}>
        {hidden.length ? (
          <div class="muted" data-testid="hidden-metrics" data-metrics={hidden.join(",")}>
            Not shown, always zero or unsupported on this GPU: {hidden.map(metricLabel).join(", ")}
          </div>
        ) : null}
        {all ? <div class="grid2">{shown.map(([m, s]) => <MetricChart key={m} metric={m} series={s} t0={t0} dark={dark} />)}</div> : null}
      </Panel>
    </>
  );
}

type Matrix = { labels: string[]; rows: string[][] };

/** {labels, matrix, gpus, legend} as tb_gpuprof.nvml.topology records it (a few older shapes too). */
export function topologyMatrix(topo: unknown): Matrix | null {
  if (!topo || typeof topo !== "object") return null;
  const t = topo as Record<string, unknown>;
  const m = t.matrix;
  if (!Array.isArray(m) || !m.every(Array.isArray)) return null;
  const labels = Array.isArray(t.labels) ? t.labels.map(String) : m.map((_, i) => `GPU${i}`);
  return { labels, rows: (m as unknown[][]).map((r) => r.map((c) => fmtValue(c))) };
}

function Topology({ topo }: { topo: unknown }) {
  const m = topologyMatrix(topo);
  if (!m) return <pre data-testid="topology-raw">{JSON.stringify(topo, null, 2)}</pre>;
  const t = topo as Record<string, unknown>;
  const gpus = (Array.isArray(t.gpus) ? t.gpus : []) as Record<string, unknown>[];
  const legend = t.legend && typeof t.legend === "object" ? Object.entries(t.legend as Record<string, unknown>) : [];
  return (
    <>
      <div class="tablewrap">
        <table class="topo" data-testid="topology">
          <thead>
            <tr>
              <th />
              {m.labels.map((l) => <th key={l}>{l}</th>)}
              {gpus.length ? <><th>CPU affinity</th><th>NUMA node</th><th>in this job</th></> : null}
            </tr>
          </thead>
          <tbody>
            {m.rows.map((r, i) => (
              <tr key={m.labels[i]}>
                <th>{m.labels[i]}</th>
                {r.map((c, j) => <td key={j}>{c}</td>)}
                {gpus.length ? (
                  <>
                    <td>{fmtValue(gpus[i]?.cpu_affinity ?? "N/A")}</td>
                    <td>{fmtValue(gpus[i]?.numa_node ?? "N/A")}</td>
                    <td>{gpus[i]?.job ? "yes" : "no"}</td>
                  </>
                ) : null}
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {legend.length ? <KeyValues rows={legend.map(([k, v]) => [k, fmtValue(v)])} /> : null}
    </>
  );
}

interface TelemetrySummary {
  samples?: number;
  interval_s?: number;
  duration_s?: number;
  driver_version?: string | null;
  unavailable_reason?: string | null;
  gpus?: { gpu: number; name?: string; samples?: number; mean?: Record<string, number>; max?: Record<string, number> }[];
  [k: string]: unknown;
}

/** report.telemetry (NVML over the profiled window): mean (max) per metric and GPU. */
function WindowSummary({ summary }: { summary: TelemetrySummary }) {
  const gpus = Array.isArray(summary.gpus) ? summary.gpus : [];
  const metrics = [...new Set(gpus.flatMap((g) => Object.keys(g.mean ?? {})))].sort(metricOrder);
  return (
    <Panel title="Profiled window (NVML)" testId="telemetry-window">
      <div class="muted">
        {fmtNum(summary.samples)} samples every {fmtValue(summary.interval_s)} s over {fmtValue(summary.duration_s)} s
        {summary.driver_version ? ` · driver ${summary.driver_version}` : ""}
        {summary.unavailable_reason ? ` · ${summary.unavailable_reason}` : ""}
      </div>
      {metrics.length ? (
        <div class="tablewrap">
          <table data-testid="telemetry-window-table">
            <thead><tr><th>metric (mean / max)</th>{gpus.map((g) => <th key={g.gpu} class="num">GPU{g.gpu}{g.name ? ` · ${g.name}` : ""}</th>)}</tr></thead>
            <tbody>
              {metrics.map((m) => (
                <tr key={m}>
                  <td>{metricLabel(m)}{unitOf(m) ? ` (${unitOf(m)})` : ""}</td>
                  {gpus.map((g) => <td key={g.gpu} class="num">{fmtNum(g.mean?.[m], 1)} / {fmtNum(g.max?.[m], 1)}</td>)}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
    </Panel>
  );
}

export function GpuView({ run, report, dark }: { run: string; report: Report | null; dark: boolean }) {
  const tel = useAsync(() => api.telemetry(run), [run]);
  const byMetric = useMemo(() => {
    const groups = new Map<string, [string, Point[]][]>();
    for (const [key, pts] of Object.entries(tel.data?.series ?? {})) {
      const [dev, metric] = splitKey(key);
      if (!groups.has(metric)) groups.set(metric, []);
      groups.get(metric)!.push([dev, pts]);
    }
    for (const list of groups.values()) list.sort(([a], [b]) => byDevice(a, b));
    return groups;
  }, [tel.data]);
  // x axis: seconds since the run's first NVML sample
  const t0 = useMemo(() => Math.min(...Object.values(tel.data?.series ?? {}).flatMap((pts) => (pts.length ? [pts[0][1]] : []))), [tel.data]);
  if (tel.error) return <ErrorBox what="telemetry" error={tel.error} />;
  if (tel.loading && !tel.data) return <Loading />;
  const summary = report?.telemetry as TelemetrySummary | null | undefined;
  const topo = tel.data?.topology;
  return (
    <div data-testid="view-gpu">
      {!byMetric.size && !topo ? <Empty>no NVML telemetry recorded for this run</Empty> : null}
      {summary ? <WindowSummary summary={summary} /> : null}
      {byMetric.size ? <Curated byMetric={byMetric} t0={t0} dark={dark} /> : null}
      {topo ? <Panel title="Topology" testId="panel-topology"><Topology topo={topo} /></Panel> : null}
    </div>
  );
}
