// The overview: summary cards, iteration-time chart, top kernels, Tensor Core pie, GPU time
// breakdown, recommendations and the recorded system configuration.
import { useMemo, useState } from "preact/hooks";
import { api, storageTag } from "../api";
import { COLORS, Chart } from "../charts";
import { Card, Empty, ErrorBox, KeyValues, Loading, Panel, useAsync } from "../components";
import { DASH, fmtMs, fmtNum, fmtPct, fmtUs, fmtValue, humanize } from "../format";
import { KernelTable, TOP_COLUMNS } from "../kernelTable";
import { Evidence, type OpenKernels } from "../evidence";
import type { Bottleneck, Num, Recommendation, Report, RunInfo } from "../types";

interface Props {
  run: RunInfo;
  step: number | null;
  report: Report;
  dark: boolean;
  openKernels?: OpenKernels;
}

const num = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);

/** GPU utilization: NVML's average when a hook sampled it, else GPU-busy time over wall time. */
export function gpuUtilization(report: Report): { value: number | null; how: string } {
  // report.telemetry.gpus[].mean.sm_util_pct: NVML's "GPU utilization" averaged over the window
  const gpus = (report.telemetry as { gpus?: { mean?: Record<string, unknown> }[] } | null)?.gpus;
  const utils = (Array.isArray(gpus) ? gpus : []).map((g) => num(g.mean?.sm_util_pct)).filter((v): v is number => v !== null);
  if (utils.length) return { value: utils.reduce((a, b) => a + b, 0) / utils.length, how: `NVML average${utils.length > 1 ? ` of ${utils.length} GPUs` : ""}` };
  const b = report.breakdown ?? {};
  const busy = num(b.gpu_busy_us);
  const wall = num(b.wall_us);
  if (busy !== null && wall) return { value: (100 * busy) / wall, how: "GPU busy / wall time" };
  return { value: null, how: "not recorded" };
}

// The bottleneck classes in display order, with the words the verdict uses.
export const BOUND_PARTS: [string, string, string][] = [
  ["gpu", "GPU kernels", COLORS.tc],
  ["copy", "Copies", COLORS.memory],
  ["communication", "Communication", COLORS.communication],
  ["dispatch", "Op dispatch", COLORS.nonTc],
  ["host", "Host work outside ops", COLORS.layout],
  ["data_wait", "Data loader", COLORS.eligibleNotTc],
  ["sync", "Synchronization", COLORS.idle],
];

/** The fix for the run's framework: TensorFlow runs take the Keras fix; else the first one given. */
export function preferredFix(rec: Recommendation, framework: string): [string, string] | null {
  const fix = rec.fix ?? {};
  const want = framework === "tensorflow" ? "keras" : framework;
  const key = fix[want] ? want : FRAMEWORKS.map(([k]) => k).find((k) => fix[k]) ?? Object.keys(fix)[0];
  return key && fix[key] ? [key, fix[key]] : null;
}

const frameworkLabel = (key: string): string => FRAMEWORKS.find(([k]) => k === key)?.[1] ?? key;

function savingText(rec: Recommendation): string {
  const parts: string[] = [];
  if (rec.estimated_saving_ms != null) parts.push(`saves ~${fmtMs(rec.estimated_saving_ms)}${rec.estimated_saving_pct != null ? ` (${fmtPct(rec.estimated_saving_pct, 0)})` : ""} per iteration`);
  if (rec.estimated_range_pct) parts.push(`(range ${fmtPct(rec.estimated_range_pct[0], 0)}–${fmtPct(rec.estimated_range_pct[1], 0)})`);
  return parts.join(" ");
}

/** What bounds the iteration, first: the verdict and the shares as one bar. */
function Verdict({ bn, report }: { bn: Bottleneck; report: Report }) {
  const pct = bn.corrected_pct ?? bn.mean_pct;
  const ms = bn.corrected_ms ?? bn.mean_ms;
  const parts = BOUND_PARTS.filter(([k]) => (pct[k] ?? 0) >= 0.5);
  const it = report.iterations ?? {};
  return (
    <div class="verdict" data-testid="verdict" data-bound={bn.bound}>
      <div class="verdict-text" data-testid="verdict-text">{bn.verdict}</div>
      <div class="share-bar" data-testid="share-bar" role="img" aria-label="share of each iteration by bottleneck">
        {parts.map(([k, label, color]) => (
          <span key={k} data-share={k} title={`${label}: ${fmtPct(pct[k])} (${fmtMs(ms[k])})`} style={{ width: `${pct[k]}%`, background: color }} />
        ))}
      </div>
      <div class="share-legend">
        {parts.map(([k, label, color]) => (
          <span key={k}><span class="legend-dot" style={{ background: color }} />{label} {fmtPct(pct[k])} ({fmtMs(ms[k])})</span>
        ))}
      </div>
      <div class="muted">
        {bn.basis === "unprofiled" && it.unprofiled_median_ms != null
          ? `on the un-profiled ${fmtMs(it.unprofiled_median_ms)} iteration (the profiler slowed the window ${fmtNum(it.profiler_overhead_ratio, 2)}x)`
          : bn.note ?? ""}
      </div>
    </div>
  );
}

/** The top recommendation with its saving, its range and its fix for the run's framework. */
function TopFix({ top, framework, more, openRecs }: { top: Recommendation | undefined; framework: string; more: number; openRecs: () => void }) {
  if (!top) return <div class="verdict-fix top-fix" data-testid="verdict-fix">No rule found a fix worth making in this window.</div>;
  const fix = preferredFix(top, framework);
  return (
    <div class="verdict-fix top-fix" data-testid="verdict-fix">
      <div>
        <span class="muted">Top fix: </span><strong data-testid="top-fix-title">{top.title}</strong>
        {" "}<span class="saving-strong" data-testid="top-fix-saving">{savingText(top)}</span>
      </div>
      {fix ? (
        <>
          <div class="muted small">Fix for {frameworkLabel(fix[0])}:</div>
          <pre data-testid="top-fix-code" data-framework={fix[0]}>{fix[1]}</pre>
        </>
      ) : null}
      <a href="#recommendations" data-testid="all-recs-link" onClick={(e) => { e.preventDefault(); openRecs(); }}>
        {more > 0 ? `why, and ${more} more ${more === 1 ? "recommendation" : "recommendations"} below` : "why: evidence below"}
      </a>
    </div>
  );
}

/** Share of the window's wall time in which some kernel, copy or collective ran. */
export function gpuBusy(report: Report): number | null {
  const b = report.breakdown ?? {};
  const busy = num(b.gpu_busy_us);
  const wall = num(b.wall_us);
  return busy !== null && wall ? (100 * busy) / wall : null;
}

/** The throughput fields the MFU card reads (reports stored before peak_precision and the
 *  precision's utilisation existed lack them: their MFU was against their own precision). */
interface MfuFields {
  achieved_tflops?: Num;
  peak_tflops?: Num;
  peak_precision?: string | null;
  precision?: string | null;
  precision_peak_tflops?: Num;
  precision_utilization_pct?: Num;
}

/** "250 TFLOP/s of the 990 dense BF16 peak · 25.2% of the bf16 peak": MFU's basis, then the
 *  utilisation of the precision in use, which is not comparable across precisions. */
function mfuSub(throughput: unknown): string {
  const tp = throughput as MfuFields | null | undefined;
  if (tp?.achieved_tflops == null) return "no FLOPs counted";
  const peak = num(tp.peak_tflops);
  const of = peak === null ? "unknown peak"
    : tp.peak_precision ? `the ${fmtNum(peak, 0)} dense ${tp.peak_precision.toUpperCase()} peak` : `${fmtNum(peak, 0)} peak`;
  const own = num(tp.precision_utilization_pct);
  const mine = own !== null && tp.precision && tp.precision !== tp.peak_precision ? ` · ${fmtPct(own)} of the ${tp.precision} peak` : "";
  return `${fmtNum(num(tp.achieved_tflops), 1)} TFLOP/s of ${of}${mine}`;
}

/** The four numbers of the first screen: iteration time, GPU busy, Tensor Core share, MFU. */
function KeyCards({ report }: { report: Report }) {
  const it = report.iterations ?? {};
  const tc = report.tensor_cores ?? {};
  const tp = report.throughput;
  const b = report.breakdown ?? {};
  const unprofiled = num(it.unprofiled_median_ms);
  return (
    <div class="key-cards" data-testid="key-cards">
      {unprofiled !== null ? (
        <Card testId="card-iter" label="Iteration time" value={fmtMs(unprofiled)} sub={`un-profiled median · ${fmtMs(it.median_ms)} while profiled`} />
      ) : (
        <Card testId="card-iter" label="Avg iteration time" value={fmtMs(it.mean_ms)} sub={`profiled · median ${fmtMs(it.median_ms)} · p95 ${fmtMs(it.p95_ms)}`} />
      )}
      <Card testId="card-busy" label="GPU busy" value={fmtPct(gpuBusy(report))} sub={`${fmtUs(num(b.gpu_busy_us))} of ${fmtUs(num(b.wall_us))} wall time`} />
      <Card testId="card-tc" label="GPU time on Tensor Cores" value={fmtPct(tc.tc_pct)} sub={`Tensor Core kernels run at ${fmtPct(tc.tc_kernel_efficiency_pct)} efficiency`} />
      <Card testId="card-mfu" label="MFU" value={fmtPct(num(tp?.mfu_pct))} sub={mfuSub(tp)} />
    </div>
  );
}

/** The rest of the summary numbers, small, below the first screen. */
function SummaryCards({ report }: { report: Report }) {
  const it = report.iterations ?? {};
  const util = gpuUtilization(report);
  const numbered = (it.items ?? []).some((i) => i.step !== null && i.step !== undefined);
  const range = [it.range && numbered ? `steps ${it.range[0]}–${it.range[1]}` : "", it.method ? `by ${it.method}` : ""].filter(Boolean).join(" · ");
  return (
    <div class="cards small-cards" data-testid="summary-cards">
      <Card testId="card-count" label="Iterations profiled" value={fmtNum(it.count)} sub={range} />
      <Card testId="card-profiled" label="Profiled iteration" value={fmtMs(it.mean_ms)} sub={`mean · median ${fmtMs(it.median_ms)} · p95 ${fmtMs(it.p95_ms)}`} />
      {util.how.startsWith("NVML") ? <Card testId="card-util" label="GPU utilization" value={fmtPct(util.value)} sub={util.how} /> : null /* else it is GPU busy, shown above */}
      <Card testId="card-gputime" label="GPU time" value={fmtUs(report.gpu_time_us)} sub={`${fmtNum(report.kernels_total ?? report.kernels?.length)} distinct kernels`} />
    </div>
  );
}

function IterationChart({ run, report, dark }: { run: RunInfo; report: Report; dark: boolean }) {
  const iterTag = storageTag("iteration_time"); // the server names the tag (store/layout.py)
  const hasScalars = iterTag !== null && run.scalar_tags.includes(iterTag);
  const scalars = useAsync(() => (hasScalars && iterTag ? api.scalars(run.run, iterTag) : null), [run.run, hasScalars, iterTag]);
  const items = report.iterations?.items ?? [];
  const range = report.iterations?.range;
  const rangeKind = report.iterations?.range_kind;
  const windowMs = report.iterations?.median_ms;
  const option = useMemo(() => {
    const fromScalars = scalars.data?.points?.length ? scalars.data.points.map((p) => [p[0], p[2]]) : null;
    // Without scalars the chart is the profiled window itself: no band to mark; unnumbered
    // iterations are counted from 1.
    const data = fromScalars ?? items.map((it, i) => [it.step ?? i + 1, it.wall_ms]);
    // The hook's wall time of a step inside the profiled window is not what the report
    // measures for that step (issue 36: 43 ms drawn where the report measured 243 ms): the
    // band says what the report measures, and the report's steps are drawn beside the hook's.
    const band = fromScalars && range && rangeKind !== "index";
    const markArea = band
      ? { silent: true, itemStyle: { color: "rgba(245,124,0,0.15)" }, label: { show: true, position: "insideTop", color: COLORS.tc, formatter: () => `profiled window: report measures ${fmtMs(windowMs)}` }, data: [[{ xAxis: range[0] }, { xAxis: range[1] }]] }
      : undefined;
    const measured = band ? items.filter((it) => it.step !== null && it.step !== undefined).map((it) => [it.step, it.wall_ms]) : [];
    // Warm-up iterations (cuDNN autotuning, compilation) can be 100x the rest and flatten the
    // curve: cap the axis at 4x the median and say how many points lie above it.
    const values = data.map((p) => p[1] as number).filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
    const median = values.length ? values[Math.floor(values.length / 2)] : 0;
    // (never below what the report measures for the window: those points must stay readable)
    const measuredMax = Math.max(0, ...measured.map((p) => p[1] as number).filter((v) => Number.isFinite(v)));
    const cap = median > 0 && values[values.length - 1] > Math.max(4 * median, measuredMax) ? Math.ceil(Math.max(4 * median, measuredMax * 1.1)) : undefined;
    return {
      clipped: cap === undefined ? 0 : values.filter((v) => v > cap).length,
      cap,
      grid: { left: 56, right: 16, top: measured.length ? 40 : 24, bottom: 40 },
      tooltip: { trigger: "axis", valueFormatter: (v: number) => fmtMs(v) },
      xAxis: { type: "value", name: fromScalars ? "step" : "iteration", nameLocation: "middle", nameGap: 26, min: "dataMin", max: "dataMax", minInterval: 1 },
      yAxis: { type: "value", name: "ms", scale: true, max: cap },
      dataZoom: [{ type: "inside" }],
      legend: measured.length ? { top: 0, right: 0 } : undefined,
      series: [
        { type: "line", name: fromScalars ? "iteration time (hook)" : "iteration time", data, showSymbol: data.length < 60, color: COLORS.nonTc, markArea },
        ...(measured.length ? [{ type: "line", name: "as the report measures it", data: measured, color: COLORS.tc, showSymbol: true, symbolSize: 7, lineStyle: { type: "dashed" } }] : []),
      ],
    };
  }, [scalars.data, items, range, rangeKind, windowMs]);
  if (hasScalars && scalars.error) return <ErrorBox what="iteration-time scalars" error={scalars.error} />;
  if (hasScalars && scalars.loading && !scalars.data) return <Loading />;
  if (!hasScalars && !items.length) return <Empty>no iteration times recorded for this run</Empty>;
  return (
    <>
      {!hasScalars ? <div class="muted">no {iterTag ?? "iteration-time"} scalars recorded; showing the profiled iterations</div> : null}
      <Chart option={option} dark={dark} label="iteration time per step" testId="iter-chart" />
      {option.clipped ? (
        <div class="muted" data-testid="iter-clipped">
          {option.clipped} warm-up {option.clipped === 1 ? "iteration" : "iterations"} above {fmtMs(option.cap)} not drawn to scale (hover for the value)
        </div>
      ) : null}
    </>
  );
}

const pieRows = (tc: Record<string, Num>) => [
  { name: "Using Tensor Cores", value: tc.tc_us ?? 0, pct: tc.tc_pct, color: COLORS.tc },
  { name: "Eligible, not using TC", value: tc.eligible_not_tc_us ?? 0, pct: tc.eligible_not_tc_pct, color: COLORS.eligibleNotTc },
  { name: "Other compute", value: tc.other_us ?? 0, pct: tc.other_pct, color: COLORS.other },
  { name: "Memory", value: tc.memory_us ?? 0, pct: tc.memory_pct, color: COLORS.memory },
];

function TensorCorePie({ report, dark }: { report: Report; dark: boolean }) {
  const tc = report.tensor_cores;
  const option = useMemo(() => {
    const rows = pieRows(tc ?? {});
    return {
      tooltip: { trigger: "item", formatter: (p: { name: string; value: number; percent: number }) => `${p.name}: ${fmtUs(p.value)} (${fmtPct(p.percent)})` },
      legend: { bottom: 0, type: "scroll" },
      series: [{ type: "pie", radius: ["40%", "68%"], center: ["50%", "44%"], label: { formatter: (p: { percent: number }) => fmtPct(p.percent) },
        // empty slices would only stack "0.0%" labels on each other; the table lists them
        data: rows.filter((r) => r.value > 0).map((r) => ({ name: r.name, value: r.value, itemStyle: { color: r.color } })) }],
    };
  }, [tc]);
  if (!tc) return <Empty>no Tensor Core data</Empty>;
  return (
    <>
      <Chart option={option} dark={dark} label="GPU time by Tensor Core use" testId="tc-pie" />
      <table data-testid="tc-table">
        <tbody>
          {pieRows(tc).map((r) => (
            <tr key={r.name}>
              <td><span class="legend-dot" style={{ background: r.color }} />{r.name}</td>
              <td class="num">{fmtUs(r.value)}</td>
              <td class="num">{fmtPct(r.pct)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}

export const BREAKDOWN_PARTS: [string, string, string][] = [
  ["tc_compute", "Tensor Core compute", COLORS.tc],
  ["non_tc_compute", "Other compute", COLORS.nonTc],
  ["memory", "Memory", COLORS.memory],
  ["communication", "Communication", COLORS.communication],
  ["layout", "Layout", COLORS.layout],
  ["idle", "Idle", COLORS.idle],
];

function Breakdown({ report, dark }: { report: Report; dark: boolean }) {
  const b = report.breakdown;
  const option = useMemo(() => {
    const parts = BREAKDOWN_PARTS.map(([k, label, color]) => ({ label, color, us: num(b?.[`${k}_us`]) ?? 0 }));
    return {
      grid: { left: 130, right: 60, top: 8, bottom: 24 },
      tooltip: { trigger: "item", formatter: (p: { name: string; value: number }) => `${p.name}: ${fmtUs(p.value)}` },
      xAxis: { type: "value", axisLabel: { formatter: (v: number) => fmtUs(v) } },
      yAxis: { type: "category", inverse: true, data: parts.map((p) => p.label) },
      series: [{ type: "bar", data: parts.map((p) => ({ value: p.us, itemStyle: { color: p.color } })),
        label: { show: true, position: "right", formatter: (p: { value: number }) => fmtUs(p.value) } }],
    };
  }, [b]);
  if (!b) return <Empty>no breakdown</Empty>;
  const idle = b.idle_attribution_us ?? {};
  const wall = num(b.wall_us);
  return (
    <>
      <div class="muted">wall {fmtUs(wall)} · GPU busy {fmtUs(num(b.gpu_busy_us))}</div>
      <Chart option={option} dark={dark} height={220} label="GPU time breakdown" testId="breakdown-chart" />
      {Object.keys(idle).length ? (
        <KeyValues testId="idle-attribution" rows={Object.entries(idle).map(([k, v]) => [`idle: ${humanize(k)}`, fmtUs(v)])} />
      ) : null}
    </>
  );
}

const FRAMEWORKS: [string, string][] = [["pytorch", "PyTorch"], ["keras", "Keras"], ["jax", "JAX"]];

/** Predicted · verified: the replay's estimate beside what the training loop itself measured. */
function VerifiedLine({ rec }: { rec: Recommendation }) {
  const v = rec.verified;
  if (!v) return null;
  const predicted = rec.estimated_saving_pct != null ? fmtPct(rec.estimated_saving_pct, 0) : "not estimated";
  const cost = `${v.iterations} iterations, ${fmtMs((v.seconds ?? 0) * 1000)}${v.warmup_seconds != null ? ` + ${fmtMs(v.warmup_seconds * 1000)} warm-up` : ""}`;
  return (
    <p class="muted" data-testid="predicted-verified">
      Predicted {predicted} · verified in the training loop: {v.verdict} ({cost}){v.reason ? `: ${v.reason}` : ""}.
    </p>
  );
}

export function RecommendationCard({ rec, preferred, openKernels }: { rec: Recommendation; preferred: string; openKernels?: OpenKernels }) {
  const fixes = FRAMEWORKS.filter(([k]) => rec.fix?.[k]);
  const extra = Object.keys(rec.fix ?? {}).filter((k) => !FRAMEWORKS.some(([f]) => f === k)).map((k): [string, string] => [k, k]);
  const all = [...fixes, ...extra];
  const [tab, setTab] = useState(preferredFix(rec, preferred)?.[0] ?? "");
  const severity = ["high", "medium", "low"].includes(rec.severity) ? rec.severity : "medium";
  const evidence = Object.entries(rec.evidence ?? {});
  return (
    <div class={`rec ${severity}`} data-testid="recommendation" data-rec-id={rec.id}>
      <div class="head">
        <span class={`badge ${severity}`}>{rec.severity}</span>
        <h3>{rec.title}</h3>
        <span class="saving" data-testid="saving" title={rec.estimate_basis ?? ""}>
          {rec.estimated_saving_ms != null ? `saves ~${fmtMs(rec.estimated_saving_ms)}` : ""}
          {rec.estimated_saving_pct != null ? ` (${fmtPct(rec.estimated_saving_pct, 0)})` : ""}
          {rec.estimated_range_pct ? ` · range ${fmtPct(rec.estimated_range_pct[0], 0)}–${fmtPct(rec.estimated_range_pct[1], 0)}` : ""}
          {rec.verified ? <> · <span class={`verified ${rec.verified.status}`} data-testid="verified">verified: {rec.verified.verdict}</span></> : null}
        </span>
      </div>
      {rec.verified ? <VerifiedLine rec={rec} /> : null}
      <p>{rec.problem}</p>
      {rec.estimate_basis ? <p class="muted" data-testid="estimate-basis">Estimate: {rec.estimate_basis}.</p> : null}
      {evidence.length ? <Evidence evidence={rec.evidence ?? {}} open={openKernels} /> : null}
      {all.length ? (
        <>
          <div class="subtabs" role="tablist">
            {all.map(([k, label]) => (
              <button key={k} role="tab" aria-selected={tab === k} onClick={() => setTab(k)}>{label}</button>
            ))}
          </div>
          <pre data-testid="fix">{rec.fix?.[tab] ?? ""}</pre>
        </>
      ) : null}
    </div>
  );
}

const SYSTEM_LABELS: Record<string, string> = {
  gpu_name: "GPU", compute_capability: "Compute capability", num_sms: "SMs", gpu_memory_bytes: "GPU memory",
  cuda_runtime: "CUDA runtime", cuda_driver: "CUDA driver", driver_version: "Driver", cudnn: "cuDNN", cudnn_version: "cuDNN",
  framework: "Framework", framework_version: "Framework version", gpu_count: "GPUs",
};

export function systemRows(system: Record<string, unknown>): [string, string][] {
  const rows: [string, string][] = [];
  for (const [k, v] of Object.entries(system)) {
    if (k === "flags" || k === "distributed") continue;
    const text = k === "gpu_memory_bytes" && typeof v === "number" ? `${fmtNum(v / 2 ** 30, 1)} GiB` : fmtValue(v);
    rows.push([SYSTEM_LABELS[k] ?? humanize(k), text]);
  }
  const dist = system.distributed as Record<string, unknown> | null | undefined;
  if (dist && typeof dist === "object") rows.push(["Distributed", Object.entries(dist).map(([k, v]) => `${k}=${fmtValue(v)}`).join(", ")]);
  const flags = system.flags as Record<string, unknown> | null | undefined;
  if (flags && typeof flags === "object") for (const [k, v] of Object.entries(flags)) rows.push([`flag: ${k}`, fmtValue(v)]);
  return rows;
}

export function DashboardView({ run, step, report, dark, openKernels }: Props) {
  const top = (report.kernels ?? []).slice(0, 10);
  const recs = report.recommendations ?? [];
  const framework = String(report.system?.framework ?? "pytorch").toLowerCase();
  const openRecs = () => document.querySelector("[data-testid=panel-recommendations]")?.scrollIntoView({ behavior: "smooth" });
  return (
    <div data-testid="view-dashboard">
      <div class="first-screen" data-testid="first-screen">
        <div class="first-main">
          {report.bottleneck ? <Verdict bn={report.bottleneck} report={report} /> : null}
          <TopFix top={recs[0]} framework={framework} more={recs.length - 1} openRecs={openRecs} />
        </div>
        <KeyCards report={report} />
      </div>
      {(report.warnings ?? []).map((w) => <div class="warn" key={w}>⚠ {w}</div>)}
      <SummaryCards report={report} />
      <Panel title="Recommendations" testId="panel-recommendations">
        {recs.length ? recs.map((r) => <RecommendationCard key={r.id} rec={r} preferred={framework} openKernels={openKernels} />) : <Empty>no recommendations: nothing obvious to change</Empty>}
      </Panel>
      <Panel title="Iteration time" testId="panel-iterations">
        <IterationChart run={run} report={report} dark={dark} />
      </Panel>
      <Panel title="Top 10 kernels" testId="panel-top-kernels" extra={<span class="muted">by GPU time{step !== null ? `, step ${step}` : ""}</span>}>
        {top.length ? <KernelTable kernels={top} columns={TOP_COLUMNS} testId="top-kernels" /> : <Empty>no kernels in this window</Empty>}
      </Panel>
      <div class="grid2">
        <Panel title="Tensor Core usage" testId="panel-tc"><TensorCorePie report={report} dark={dark} /></Panel>
        <Panel title="GPU time breakdown" testId="panel-breakdown"><Breakdown report={report} dark={dark} /></Panel>
      </div>
      <Panel title="System" testId="panel-system">
        {report.system ? <KeyValues testId="system" rows={systemRows(report.system)} /> : <Empty>{DASH}</Empty>}
        {report.source ? <div class="muted" style={{ marginTop: "8px" }}>source: {report.source.path ?? DASH} ({report.source.format ?? "?"}, {fmtNum(report.source.events)} events) · {report.generator ?? ""}</div> : null}
      </Panel>
    </div>
  );
}
