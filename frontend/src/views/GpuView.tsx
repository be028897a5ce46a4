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

function MetricChart({ metric, series, dark }: { metric: string; series: [string, Point[]][]; dark: boolean }) {
  const unit = unitOf(metric);
  const option = useMemo(
    () => ({
      grid: { left: 56, right: 16, top: 28, bottom: 56 },
      legend: series.length > 1 ? { top: 0 } : undefined,
      tooltip: { trigger: "axis", valueFormatter: (v: number) => `${fmtNum(v, 1)} ${unit}` },
      xAxis: { type: "time" },
      yAxis: { type: "value", name: unit, scale: unit !== "%", max: unit === "%" ? 100 : undefined },
      dataZoom: [{ type: "inside" }, { type: "slider", height: 16, bottom: 8 }],
      series: series.map(([dev, pts]) => ({ type: "line", name: dev || metric, showSymbol: false, data: pts.map((p) => [p[1] * 1000, p[2]]) })),
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

/** Accepts {devices|labels|gpus: [...], matrix: [[...]]} or {"GPU0": {"GPU1": "NV18", ...}, ...}. */
export function topologyMatrix(topo: unknown): Matrix | null {
  if (!topo || typeof topo !== "object") return null;
  const t = topo as Record<string, unknown>;
  const m = t.matrix;
  const names = (t.labels ?? t.devices ?? t.gpus) as unknown;
  if (Array.isArray(m) && m.every(Array.isArray)) {
    const labels = Array.isArray(names) ? names.map((n) => (typeof n === "object" && n ? String((n as Record<string, unknown>).name ?? fmtValue(n)) : String(n))) : m.map((_, i) => `GPU${i}`);
    return { labels, rows: (m as unknown[][]).map((r) => r.map((c) => fmtValue(c))) };
  }
  const keys = Object.keys(t).filter((k) => t[k] && typeof t[k] === "object" && !Array.isArray(t[k]));
  if (keys.length && keys.every((k) => keys.every((j) => j in (t[k] as object) || j === k))) {
    return { labels: keys, rows: keys.map((k) => keys.map((j) => (j === k ? "X" : fmtValue((t[k] as Record<string, unknown>)[j])))) };
  }
  return null;
}

function Topology({ topo }: { topo: unknown }) {
  const m = topologyMatrix(topo);
  if (!m) return <pre data-testid="topology-raw">{JSON.stringify(topo, null, 2)}</pre>;
  const extra = (topo as Record<string, unknown>).affinity ?? (topo as Record<string, unknown>).cpu_affinity;
  return (
    <>
      <div class="tablewrap">
        <table class="topo" data-testid="topology">
          <thead><tr><th />{m.labels.map((l) => <th key={l}>{l}</th>)}</tr></thead>
          <tbody>
            {m.rows.map((r, i) => (
              <tr key={m.labels[i]}><th>{m.labels[i]}</th>{r.map((c, j) => <td key={j}>{c}</td>)}</tr>
            ))}
          </tbody>
        </table>
      </div>
      {extra ? <pre>{JSON.stringify(extra, null, 2)}</pre> : null}
      <div class="muted">X = self, NV# = NVLink (# links), PIX/PXB = PCIe switch(es), PHB = host bridge, NODE = same NUMA node, SYS = across NUMA nodes</div>
    </>
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
    return [...groups.entries()].sort(([a], [b]) => a.localeCompare(b));
  }, [tel.data]);
  if (tel.error) return <ErrorBox what="telemetry" error={tel.error} />;
  if (tel.loading && !tel.data) return <Loading />;
  const averages = report?.telemetry ? Object.entries(report.telemetry) : [];
  const topo = tel.data?.topology;
  return (
    <div data-testid="view-gpu">
      {!byMetric.length && !topo ? <Empty>no NVML telemetry recorded for this run</Empty> : null}
      {averages.length ? (
        <Panel title="Profiled window averages (NVML)">
          <KeyValues rows={averages.map(([k, v]) => [humanize(k), fmtValue(v)])} />
        </Panel>
      ) : null}
      <div class="grid2">
        {byMetric.map(([metric, series]) => <MetricChart key={metric} metric={metric} series={series} dark={dark} />)}
      </div>
      {topo ? <Panel title="Topology" testId="panel-topology"><Topology topo={topo} /></Panel> : null}
    </div>
  );
}
