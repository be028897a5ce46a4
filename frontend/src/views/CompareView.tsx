// Side-by-side runs (/compare): iteration time and Tensor Core share as bars, a summary table and
// the kernel diff against the first selected run (appeared / vanished / changed / same).
import { useMemo, useState } from "preact/hooks";
import { api } from "../api";
import { COLORS, Chart } from "../charts";
import { Empty, ErrorBox, Loading, Panel, Trunc, useAsync } from "../components";
import { DASH, fmtMs, fmtNum, fmtPct, fmtUs } from "../format";
import type { CompareAnswer, RunInfo } from "../types";

const STATUSES = ["appeared", "vanished", "changed", "same"];
const ROWS = 50;

function Bars({ data, dark }: { data: CompareAnswer; dark: boolean }) {
  const names = data.runs.map((r) => r.run);
  const mk = (title: string, values: (number | null)[], color: string, fmt: (v: number) => string) => ({
    grid: { left: 56, right: 16, top: 30, bottom: 60 },
    tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: fmt },
    xAxis: { type: "category", data: names, axisLabel: { interval: 0, rotate: names.length > 3 ? 20 : 0, width: 140, overflow: "truncate" } },
    yAxis: { type: "value", name: title },
    series: [{ type: "bar", name: title, color, data: values.map((v) => v ?? 0), label: { show: true, position: "top", formatter: (p: { value: number }) => fmt(p.value) } }],
  });
  const iter = useMemo(() => mk("ms / iteration", data.runs.map((r) => r.iterations?.mean_ms ?? null), COLORS.nonTc, fmtMs), [data]);
  const tc = useMemo(() => mk("% GPU time on TC", data.runs.map((r) => r.tensor_cores?.tc_pct ?? null), COLORS.tc, (v) => fmtPct(v)), [data]);
  return (
    <div class="grid2">
      <Panel title="Iteration time"><Chart option={iter} dark={dark} label="mean iteration time per run" testId="compare-iter" /></Panel>
      <Panel title="Tensor Core share"><Chart option={tc} dark={dark} label="share of GPU time on Tensor Cores per run" testId="compare-tc" /></Panel>
    </div>
  );
}

function Summary({ data }: { data: CompareAnswer }) {
  const base = data.runs[0]?.iterations?.mean_ms;
  return (
    <div class="tablewrap">
      <table data-testid="compare-summary">
        <thead>
          <tr>
            <th>Run</th><th class="num">Step</th><th class="num">Mean iteration</th><th class="num">Median</th><th class="num">Iterations</th>
            <th class="num">Speed-up</th><th class="num">GPU time</th><th class="num">On TC</th><th class="num">TC efficiency</th>
          </tr>
        </thead>
        <tbody>
          {data.runs.map((r) => {
            const mean = r.iterations?.mean_ms;
            return (
              <tr key={r.run} data-run={r.run}>
                <td><Trunc narrow text={r.run} />{r.error ? <span class="warn"> {r.error}</span> : null}</td>
                <td class="num">{r.step ?? DASH}</td>
                <td class="num">{fmtMs(mean)}</td>
                <td class="num">{fmtMs(r.iterations?.median_ms)}</td>
                <td class="num">{fmtNum(r.iterations?.count)}</td>
                <td class="num">{base && mean ? `${fmtNum(base / mean, 2)}×` : DASH}</td>
                <td class="num">{fmtUs(r.gpu_time_us)}</td>
                <td class="num">{fmtPct(r.tensor_cores?.tc_pct)}</td>
                <td class="num">{fmtPct(r.tensor_cores?.tc_kernel_efficiency_pct)}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

function KernelDiff({ data }: { data: CompareAnswer }) {
  const [status, setStatus] = useState("");
  const [rows, setRows] = useState(ROWS);
  const names = data.runs.map((r) => r.run);
  const shown = data.kernels.filter((k) => !status || k.status === status);
  const counts = Object.fromEntries(STATUSES.map((s) => [s, data.kernels.filter((k) => k.status === s).length]));
  return (
    <>
      <div class="toolbar">
        <label>Status{" "}
          <select value={status} onChange={(e) => { setStatus((e.target as HTMLSelectElement).value); setRows(ROWS); }} data-testid="compare-status">
            <option value="">all ({fmtNum(data.kernels.length)})</option>
            {STATUSES.map((s) => <option key={s} value={s}>{s} ({fmtNum(counts[s])})</option>)}
          </select>
        </label>
        <span class="muted">compared with {names[0] ?? DASH}; changed = time moved by more than 10%</span>
      </div>
      {shown.length ? (
        <div class="tablewrap">
          <table data-testid="compare-kernels">
            <thead>
              <tr>
                <th>Kernel</th><th>Status</th>
                {names.map((n) => <th key={n} class="num" title={n}>{n.length > 24 ? `${n.slice(0, 23)}…` : n}</th>)}
              </tr>
            </thead>
            <tbody>
              {shown.slice(0, rows).map((k, i) => (
                <tr key={`${i}:${k.name}`} data-status={k.status}>
                  <td><Trunc text={k.name} /></td>
                  <td class={`status-${k.status}`}>{k.status}</td>
                  {names.map((n) => {
                    const v = k.per_run[n];
                    return <td key={n} class="num">{v ? `${fmtUs(v.total_us)} (${fmtPct(v.pct)})` : DASH}</td>;
                  })}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : <Empty>no kernels with this status</Empty>}
      {shown.length > rows ? <button onClick={() => setRows(rows + ROWS)}>show {fmtNum(Math.min(ROWS, shown.length - rows))} more of {fmtNum(shown.length - rows)}</button> : null}
    </>
  );
}

export function CompareView({ runs, dark, initial }: { runs: RunInfo[]; dark: boolean; initial: string[] }) {
  const usable = runs.filter((r) => r.reports.length);
  const [picked, setPicked] = useState<string[]>(initial.filter((n) => usable.some((r) => r.run === n && !r.error)));
  const key = picked.join("\u0000");
  const cmp = useAsync(() => (picked.length ? api.compare(picked) : null), [key]);
  const toggle = (run: string) => setPicked(picked.includes(run) ? picked.filter((r) => r !== run) : [...picked, run]);
  return (
    <div data-testid="view-compare">
      <Panel title="Runs to compare" extra={<span class="muted">the first one picked is the baseline</span>}>
        <div class="runlist" data-testid="compare-runs">
          {usable.map((r) => (
            <label key={r.run} title={r.error ? `${r.run}: ${r.error}` : r.run} class={r.error ? "muted" : undefined}>
              <input type="checkbox" checked={picked.includes(r.run)} onChange={() => toggle(r.run)} value={r.run} disabled={!!r.error && !picked.includes(r.run)} />
              <Trunc narrow text={r.run} />
              {picked.includes(r.run) ? <span class="muted">#{picked.indexOf(r.run) + 1}</span> : null}
            </label>
          ))}
        </div>
      </Panel>
      {!picked.length ? <Empty>pick runs to compare</Empty> : null}
      {cmp.error ? <ErrorBox what="compare" error={cmp.error} /> : null}
      {cmp.loading && !cmp.data && picked.length ? <Loading /> : null}
      {cmp.data && picked.length ? (
        <div aria-busy={cmp.loading}>
          <Bars data={cmp.data} dark={dark} />
          <Panel title="Summary"><Summary data={cmp.data} /></Panel>
          <Panel title="Kernels"><KernelDiff data={cmp.data} /></Panel>
        </div>
      ) : null}
    </div>
  );
}
