// NVML telemetry: one zoomable time-series chart per metric (lines per GPU), the window averages
// stored in the report, and the topology matrix like `nvidia-smi topo -m`.
import { useMemo } from "preact/hooks";
import { api } from "../api";
import { Chart } from "../charts";
import { Empty, ErrorBox, KeyValues, Loading, Panel, useAsync } from "../components";
import { fmtNum, fmtValue, humanize } from "../format";
import type { Point, Report } from "../types";

const UNITS: [RegExp, string][] = [[/_pct$/, "%"], [/_w$/, "W"], [/_c$/, "°C"], [/_mhz$/, "MHz"], [/_mb$/, "MB"], [/_mib$/, "MiB"], [/_bytes$/, "B"], [/_gbps$/, "GB/s"]];

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

function MetricChart({ metric, series, t0, dark }: { metric: string; series: [string, Point[]][]; t0: number; dark: boolean }) {
  const unit = unitOf(metric);
  const option = useMemo(
    () => ({
      grid: { left: 56, right: 16, top: 28, bottom: 56 },
      legend: series.length > 1 ? { top: 0 } : undefined,
      tooltip: { trigger: "axis", valueFormatter: (v: number) => `${fmtNum(v, 1)} ${unit}` },
      xAxis: { type: "value", name: "s", min: "dataMin", max: "dataMax", axisLabel: { hideOverlap: true, formatter: (v: number) => fmtNum(v, v >= 100 ? 0 : 1) } },
      yAxis: { type: "value", name: unit, scale: unit !== "%", max: unit === "%" ? 100 : undefined },
      dataZoom: [{ type: "inside" }, { type: "slider", height: 16, bottom: 8 }],
      series: series.map(([dev, pts]) => ({ type: "line", name: dev || metric, showSymbol: false, data: pts.map((p) => [p[1] - t0, p[2]]) })),
    }),
    [series],
  );
  return (
    <Panel title={humanize(metric)} testId={`telemetry-${metric}`}>
      <Chart option={option} dark={dark} height={220} label={`${metric} over time`} />
    </Panel>
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
                  <td>{humanize(m)}</td>
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
    return [...groups.entries()].sort(([a], [b]) => metricOrder(a, b));
  }, [tel.data]);
  // x axis: seconds since the run's first NVML sample
  const t0 = useMemo(() => Math.min(...Object.values(tel.data?.series ?? {}).flatMap((pts) => (pts.length ? [pts[0][1]] : []))), [tel.data]);
  if (tel.error) return <ErrorBox what="telemetry" error={tel.error} />;
  if (tel.loading && !tel.data) return <Loading />;
  const summary = report?.telemetry as TelemetrySummary | null | undefined;
  const topo = tel.data?.topology;
  return (
    <div data-testid="view-gpu">
      {!byMetric.length && !topo ? <Empty>no NVML telemetry recorded for this run</Empty> : null}
      {summary ? <WindowSummary summary={summary} /> : null}
      <div class="grid2">
        {byMetric.map(([metric, series]) => <MetricChart key={metric} metric={metric} series={series} t0={t0} dark={dark} />)}
      </div>
      {topo ? <Panel title="Topology" testId="panel-topology"><Topology topo={topo} /></Panel> : null}
    </div>
  );
}
