// The plugin page: run/window selectors, tabs, and the view of the selected run.
import { useEffect, useState } from "preact/hooks";
import { api, clearCache } from "./api";
import { Empty, ErrorBox, Loading, useAsync } from "./components";
import type { Report, RunInfo } from "./types";
import { CompareView } from "./views/CompareView";
import { DashboardView } from "./views/DashboardView";
import { DistributedView } from "./views/DistributedView";
import { GpuView } from "./views/GpuView";
import { IterationsView } from "./views/IterationsView";
import { KernelsView } from "./views/KernelsView";
import { MemoryView } from "./views/MemoryView";
import { RooflineView } from "./views/RooflineView";
import { TimelineView } from "./views/TimelineView";

const TABS = ["dashboard", "kernels", "roofline", "iterations", "timeline", "memory", "gpu", "distributed", "compare"] as const;
type Tab = (typeof TABS)[number];
const TAB_LABELS: Record<Tab, string> = { dashboard: "Dashboard", kernels: "Kernels", roofline: "Roofline", iterations: "Iterations", timeline: "Timeline", memory: "Memory", gpu: "GPU", distributed: "Distributed", compare: "Compare" };

/** Dark when the OS asks for it or TensorBoard's own dark mode (body.dark-mode of the parent page) is on. */
function useDarkMode(): boolean {
  const detect = () => {
    let tb = false;
    try {
      tb = !!window.parent?.document?.body?.classList.contains("dark-mode");
    } catch {
      // parent not same-origin: only the media query counts
    }
    return tb || window.matchMedia?.("(prefers-color-scheme: dark)").matches === true;
  };
  const [dark, setDark] = useState(detect);
  useEffect(() => {
    const update = () => setDark(detect());
    const mq = window.matchMedia?.("(prefers-color-scheme: dark)");
    mq?.addEventListener?.("change", update);
    let mo: MutationObserver | null = null;
    try {
      const body = window.parent !== window ? window.parent.document.body : null;
      if (body) {
        mo = new MutationObserver(update);
        mo.observe(body, { attributes: true, attributeFilter: ["class"] });
      }
    } catch {
      mo = null;
    }
    return () => {
      mq?.removeEventListener?.("change", update);
      mo?.disconnect();
    };
  }, []);
  useEffect(() => {
    document.body.classList.toggle("gp-dark-body", dark);
  }, [dark]);
  return dark;
}

// The last run looked at (per TensorBoard origin): selected again on the next visit, and its
// report is requested at once, in parallel with /runs, so the first paint waits for one round trip.
const LAST_RUN_KEY = "tb_gpuprof.run";

function storage(): Storage | null {
  try {
    return window.localStorage;
  } catch {
    return null; // storage disabled (privacy settings)
  }
}

export function prefetchLastRun(): void {
  const run = storage()?.getItem(LAST_RUN_KEY);
  if (run) api.report(run, null).catch(() => undefined);
}

/** The run whose latest report was written last (the one the story starts from), among the
 * runs whose report saw GPU work when there are any (a CPU-only run has no GPU story); ties by
 * name. */
export function mostRecentRun(runs: RunInfo[]): string | null {
  const withGpu = runs.filter((r) => r.gpu_work === true);
  return latestOf(withGpu) ?? latestOf(runs) ?? runs[0]?.run ?? null;
}

function latestOf(runs: RunInfo[]): string | null {
  let best: RunInfo | null = null;
  let bestTime = -Infinity;
  for (const r of runs) {
    if (!r.reports.length || r.error) continue;
    const t = Math.max(...r.reports.map((x) => x.wall_time));
    if (t > bestTime) {
      best = r;
      bestTime = t;
    }
  }
  return best?.run ?? null;
}

interface PanelProps {
  run: RunInfo;
  step: number | null;
  tab: Tab;
  dark: boolean;
  open: (run: string, tab: Tab) => void;
  kernelQuery: string;
  openKernels: (q: string) => void;
  runs: RunInfo[];
}

function RunPanel({ run, step, tab, dark, open, kernelQuery, openKernels, runs }: PanelProps) {
  const needsReport = tab !== "gpu" && tab !== "distributed" && run.reports.length > 0;
  const report = useAsync<Report>(() => (needsReport || (tab === "gpu" && run.reports.length) ? api.report(run.run, step) : null), [run.run, step, needsReport]);
  if (tab === "gpu") return <GpuView run={run.run} report={report.data} dark={dark} />;
  if (tab === "distributed" && run.reports.length) return <DistributedView run={run.run} step={step} dark={dark} open={open} />;
  if (!run.reports.length) {
    return <Empty>run “{run.run}” has gpuprof scalars but no profiled window yet{run.error ? `: ${run.error}` : ""}</Empty>;
  }
  if (report.error) return <ErrorBox what={`run “${run.run}”`} error={report.error} />;
  if (!report.data) return <Loading what="Loading report" />;
  const r = report.data;
  return (
    <>
      {r.refreshed ? <RefreshedNotice refreshed={r.refreshed} /> : null}
      <ReportView run={run} step={step} tab={tab} dark={dark} report={r} kernelQuery={kernelQuery} openKernels={openKernels} runs={runs} />
    </>
  );
}

/** Says that the report on screen was rebuilt from the run's raw trace by the installed
 * analysis (the stored one was made by another version), as text: names are never HTML. */
function RefreshedNotice({ refreshed }: { refreshed: NonNullable<Report["refreshed"]> }) {
  return (
    <div class="notice" role="status" data-testid="refreshed-notice">
      ↻ Refreshed report: {refreshed.reason}
    </div>
  );
}

function ReportView({ run, step, tab, dark, report: r, kernelQuery, openKernels, runs }: Omit<PanelProps, "open"> & { report: Report }) {
  if (tab === "kernels") return <KernelsView key={`${run.run}@${step}@${kernelQuery}`} run={run.run} step={step} report={r} initialQuery={kernelQuery} />;
  if (tab === "roofline") return <RooflineView report={r} openKernels={openKernels} />;
  if (tab === "iterations") return <IterationsView report={r} dark={dark} />;
  if (tab === "memory") return <MemoryView run={run} step={step} runs={runs} report={r} dark={dark} />;
  if (tab === "timeline") return <TimelineView run={run.run} step={step} report={r} hasTrace={run.has_trace} dark={dark} />;
  return <DashboardView run={run} step={step} report={r} dark={dark} openKernels={openKernels} />;
}

export function App() {
  const dark = useDarkMode();
  const [reloads, setReloads] = useState(0);
  const runs = useAsync(() => api.runs(), [reloads]);
  const [runName, setRunName] = useState<string | null>(null);
  const [step, setStep] = useState<number | null>(null);
  const [tab, setTabState] = useState<Tab>("dashboard");
  // What the Kernels view opens filtered to (a kernel linked from a recommendation's evidence).
  const [kernelQuery, setKernelQuery] = useState("");
  const setTab = (t: Tab) => {
    setKernelQuery("");
    setTabState(t);
  };
  const openKernels = (q: string) => {
    setKernelQuery(q);
    setTabState("kernels");
  };

  const list = runs.data?.runs ?? [];
  // A rank's sub-run, opened from the Distributed view: same window, another tab.
  const openRun = (name: string, t: Tab) => {
    setRunName(name);
    setTab(t);
  };
  const run = list.find((r) => r.run === runName) ?? null;
  useEffect(() => {
    if (runs.data && !run) {
      const last = storage()?.getItem(LAST_RUN_KEY);
      // A run the user picked between this render and this effect wins over the remembered one.
      setRunName((cur) => (cur && list.some((r) => r.run === cur) ? cur
        : list.some((r) => r.run === last && !r.error) ? last! : mostRecentRun(list)));
      setStep(null);
    }
  }, [runs.data]);
  useEffect(() => {
    if (runName) storage()?.setItem(LAST_RUN_KEY, runName);
  }, [runName]);

  // One entry per window (a distributed run stores one report per rank at the same step).
  const reports = run ? [...new Map(run.reports.map((r) => [r.step, r])).values()].sort((a, b) => a.step - b.step) : [];
  return (
    <div class={dark ? "gp dark" : "gp"} data-testid="gpuprof-root">
      <header>
        <label>Run{" "}
          <select data-testid="run-select" value={runName ?? ""} onChange={(e) => { setRunName((e.target as HTMLSelectElement).value); setStep(null); }} disabled={!list.length}>
            {list.map((r) => <option key={r.run} value={r.run}>{r.error ? `${r.run} (unreadable)` : r.run}</option>)}
          </select>
        </label>
        {reports.length > 1 && tab !== "compare" ? (
          <label>Window{" "}
            <select data-testid="step-select" value={step === null ? "" : String(step)} onChange={(e) => { const v = (e.target as HTMLSelectElement).value; setStep(v === "" ? null : Number(v)); }}>
              <option value="">latest (step {reports[reports.length - 1].step})</option>
              {reports.map((r) => <option key={r.step} value={String(r.step)}>step {r.step} · {new Date(r.wall_time * 1000).toLocaleString()}</option>)}
            </select>
          </label>
        ) : null}
        {run?.has_trace && reports.length ? <a href={api.traceUrl(run.run, step)} download data-testid="trace-link">raw trace</a> : null}
        <button onClick={() => { clearCache(); setReloads(reloads + 1); }} title="reload runs and reports">Reload</button>
        <nav class="tabs" role="tablist">
          {TABS.map((t) => (
            <button key={t} role="tab" aria-selected={tab === t} data-tab={t} onClick={() => setTab(t)}>{TAB_LABELS[t]}</button>
          ))}
        </nav>
      </header>
      <main>
        {runs.error ? <ErrorBox what="runs" error={runs.error} /> : null}
        {runs.loading && !runs.data ? <Loading what="Loading runs" /> : null}
        {runs.data && !list.length ? (
          <Empty>No gpuprof data in this log directory yet. Record some with the PyTorch hook or Keras callback, or import a trace: tb-gpuprof import TRACE --logdir LOGDIR</Empty>
        ) : null}
        {tab === "compare" && list.length ? (
          <CompareView runs={list} dark={dark} initial={runName ? [runName] : []} />
        ) : run ? (
          <>
            {run.error && tab !== "gpu" ? <ErrorBox what={`run “${run.run}”`} error={run.error} /> : null}
            {!run.error || tab === "gpu" || step !== null ? <RunPanel key={`${run.run}@${step}`} run={run} step={step} tab={tab} dark={dark} open={openRun} kernelQuery={kernelQuery} openKernels={openKernels} runs={list} /> : null}
          </>
        ) : null}
      </main>
    </div>
  );
}
