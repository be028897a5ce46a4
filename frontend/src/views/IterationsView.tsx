// Per-iteration stacked bars of report.iterations.items[].breakdown_ms.
import { useMemo } from "preact/hooks";
import { Chart } from "../charts";
import { Empty, KeyValues, Panel } from "../components";
import { fmtMs, fmtNum } from "../format";
import type { Report } from "../types";
import { BREAKDOWN_PARTS } from "./DashboardView";

type Iterations = Report["iterations"] | null | undefined;

/** " (steps 20–22)" when the window's iterations carry step numbers. */
function windowSteps(it: Iterations): string {
  const r = it?.range;
  return r && it?.range_kind !== "index" ? ` (steps ${r[0]}–${r[1]})` : "";
}

/** These bars are the window as the report measures it, under the profiler: say how that
 *  compares with the iterations outside it, which the always-on chart draws. */
function unprofiledNote(it: Iterations): string {
  const outside = it?.unprofiled_median_ms;
  if (outside == null || it?.median_ms == null) return "";
  return ` · median ${fmtMs(it.median_ms)} here, ${fmtMs(outside)} outside the window`;
}

export function IterationsView({ report, dark }: { report: Report; dark: boolean }) {
  const it = report.iterations;
  const items = it?.items ?? [];
  const label = (i: number) => (items[i].step !== null && items[i].step !== undefined ? String(items[i].step) : `#${i + 1}`);
  const option = useMemo(
    () => ({
      grid: { left: 56, right: 16, top: 36, bottom: 40 },
      legend: { top: 0, type: "scroll" },
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: (v: number) => fmtMs(v) },
      xAxis: { type: "category", name: "step", nameLocation: "middle", nameGap: 26, data: items.map((_, i) => label(i)) },
      yAxis: { type: "value", name: "ms" },
      dataZoom: items.length > 50 ? [{ type: "inside" }, { type: "slider", height: 16, bottom: 0 }] : undefined,
      series: BREAKDOWN_PARTS.map(([key, name, color]) => ({
        type: "bar",
        stack: "iteration",
        name,
        color,
        data: items.map((i) => i.breakdown_ms?.[key] ?? 0),
      })),
    }),
    [items],
  );
  if (!items.length) return <Empty>no iterations recorded in this window</Empty>;
  const phases = report.phases as Record<string, unknown> | null | undefined;
  return (
    <div data-testid="view-iterations">
      <Panel title="Time per iteration" extra={<span class="muted">{fmtNum(items.length)} iterations of the profiled window{windowSteps(it)}, found by {it?.method ?? "?"}{it?.key ? ` (${it.key})` : ""}{unprofiledNote(it)}</span>}>
        <Chart option={option} dark={dark} height={320} label="per-iteration time breakdown" testId="iterations-chart" />
      </Panel>
      {phases ? (
        <Panel title="Phases (mean per iteration)">
          <KeyValues rows={[["forward", fmtMs(phases.forward_ms as number)], ["backward", fmtMs(phases.backward_ms as number)], ["optimizer", fmtMs(phases.optimizer_ms as number)], ["found by", String(phases.method ?? "")]]} />
        </Panel>
      ) : null}
      <Panel title="Iterations">
        <div class="tablewrap">
          <table data-testid="iterations-table">
            <thead>
              <tr>
                <th>Step</th>
                <th class="num">Wall</th>
                <th class="num">GPU busy</th>
                {BREAKDOWN_PARTS.map(([k, name]) => <th key={k} class="num">{name}</th>)}
              </tr>
            </thead>
            <tbody>
              {items.map((i, idx) => (
                <tr key={idx}>
                  <td>{label(idx)}</td>
                  <td class="num">{fmtMs(i.wall_ms)}</td>
                  <td class="num">{fmtMs(i.gpu_busy_ms)}</td>
                  {BREAKDOWN_PARTS.map(([k]) => <td key={k} class="num">{fmtMs(i.breakdown_ms?.[k])}</td>)}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </Panel>
    </div>
  );
}
