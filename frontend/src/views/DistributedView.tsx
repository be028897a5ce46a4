// Multi-process runs (/distributed): per-rank iteration time, compute vs communication and
// overlap, the straggler, and the cross-rank recommendations. Each rank's own report,
// telemetry and topology are one click away (its run in the other tabs).
import { useMemo } from "preact/hooks";
import { api } from "../api";
import { COLORS, Chart } from "../charts";
import { Card, Empty, ErrorBox, Loading, Panel, useAsync } from "../components";
import { DASH, fmtMs, fmtNum, fmtPct } from "../format";
import type { DistributedAnswer, RankRow } from "../types";
import { RecommendationCard } from "./DashboardView";

const STRAGGLER_COLOR = "#cc3311";
const num = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) ? v : 0);

interface Props {
  run: string;
  step: number | null;
  dark: boolean;
  /** Show another run (a rank's sub-run) in another tab. */
  open: (run: string, tab: "dashboard" | "gpu") => void;
}

function IterationBars({ d, dark }: { d: DistributedAnswer; dark: boolean }) {
  const slow = d.straggler?.significant ? d.straggler.rank : null;
  const option = useMemo(
    () => ({
      grid: { left: 56, right: 16, top: 28, bottom: 40 },
      legend: { top: 0 },
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: (v: number) => fmtMs(v) },
      xAxis: { type: "category", name: "rank", nameLocation: "middle", nameGap: 26, data: d.ranks.map((r) => String(r.rank)) },
      yAxis: { type: "value", name: "ms" },
      series: [
        { type: "bar", name: "iteration (mean)", color: COLORS.nonTc, data: d.ranks.map((r) => ({ value: num(r.iteration_ms), itemStyle: { color: r.rank === slow ? STRAGGLER_COLOR : COLORS.nonTc } })) },
        { type: "bar", name: "working (not waiting in collectives)", color: COLORS.memory, data: d.ranks.map((r) => num(r.working_ms)) },
      ],
    }),
    [d],
  );
  return <Chart option={option} dark={dark} height={260} label="iteration time per rank" testId="dist-iter-chart" />;
}

function CommunicationBars({ d, dark }: { d: DistributedAnswer; dark: boolean }) {
  const option = useMemo(
    () => ({
      grid: { left: 56, right: 16, top: 28, bottom: 40 },
      legend: { top: 0 },
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, valueFormatter: (v: number) => fmtMs(v) },
      xAxis: { type: "category", name: "rank", nameLocation: "middle", nameGap: 26, data: d.ranks.map((r) => String(r.rank)) },
      yAxis: { type: "value", name: "ms / iteration" },
      series: [
        { type: "bar", name: "compute", stack: "t", color: COLORS.nonTc, data: d.ranks.map((r) => num(r.compute_ms)) },
        { type: "bar", name: "communication, overlapped", stack: "c", color: COLORS.tc, data: d.ranks.map((r) => num(r.overlap_ms)) },
        { type: "bar", name: "communication, exposed", stack: "c", color: COLORS.communication, data: d.ranks.map((r) => num(r.exposed_ms)) },
      ],
    }),
    [d],
  );
  return <Chart option={option} dark={dark} height={260} label="compute and communication per rank" testId="dist-comm-chart" />;
}

function RankTable({ d, open }: { d: DistributedAnswer; open: Props["open"] }) {
  const slow = d.straggler?.significant ? d.straggler.rank : null;
  const cols: [string, string, (r: RankRow) => string][] = [
    ["iteration_ms", "Iteration (mean)", (r) => fmtMs(r.iteration_ms)],
    ["iteration_median_ms", "Median", (r) => fmtMs(r.iteration_median_ms)],
    ["working_ms", "Working", (r) => fmtMs(r.working_ms)],
    ["compute_ms", "Compute", (r) => fmtMs(r.compute_ms)],
    ["communication_ms", "Communication", (r) => fmtMs(r.communication_ms)],
    ["overlap_pct", "Overlapped", (r) => fmtPct(r.overlap_pct)],
    ["exposed_ms", "Exposed", (r) => fmtMs(r.exposed_ms)],
  ];
  return (
    <div class="tablewrap">
      <table data-testid="dist-ranks">
        <thead>
          <tr>
            <th>Rank</th>
            {cols.map(([k, label]) => <th key={k} class="num">{label}</th>)}
            <th>Backend</th>
            <th>GPU</th>
            <th>Run</th>
          </tr>
        </thead>
        <tbody>
          {d.ranks.map((r) => (
            <tr key={r.rank} data-rank={r.rank} class={r.rank === slow ? "straggler" : undefined}>
              <td data-col="rank">
                {r.rank}
                {r.rank === slow ? <span class="badge high" data-testid="straggler-badge" style={{ marginLeft: "6px" }}>straggler</span> : null}
              </td>
              {cols.map(([k, , f]) => <td key={k} class="num" data-col={k}>{f(r)}</td>)}
              <td data-col="backend">{r.backend ?? DASH}</td>
              <td data-col="gpu_name">{r.gpu_name ?? DASH}</td>
              <td data-col="run">
                {r.run ? (
                  <>
                    <button data-testid="open-report" onClick={() => open(r.run!, "dashboard")} title={`report of run ${r.run}`}>report</button>{" "}
                    <button data-testid="open-gpu" onClick={() => open(r.run!, "gpu")} title={`NVML telemetry and topology of run ${r.run}`}>GPU</button>
                  </>
                ) : DASH}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function DistributedView({ run, step, dark, open }: Props) {
  const ans = useAsync(() => api.distributed(run, step), [run, step]);
  if (ans.error) return <ErrorBox what={`run “${run}”`} error={ans.error} />;
  if (!ans.data) return <Loading what="Loading ranks" />;
  const d = ans.data;
  if (d.world_size <= 1 && d.ranks.length <= 1) {
    return (
      <div data-testid="view-distributed">
        <Empty>
          run “{d.run}” is a single process: no other ranks to compare. Under torch.distributed (torchrun, DDP, FSDP) every rank records its window with the
          same hook and logdir; rank 0 writes into the run, rank r into the sub-run “rank r” (docs/distributed.md).
        </Empty>
      </div>
    );
  }
  const s = d.straggler;
  return (
    <div data-testid="view-distributed">
      {d.missing_ranks.length ? (
        <div class="warn" data-testid="missing-ranks">⚠ no report at step {d.step} from rank(s) {d.missing_ranks.join(", ")} of {d.world_size}</div>
      ) : null}
      <div class="cards" data-testid="dist-cards">
        <Card testId="card-world" label="Ranks" value={`${fmtNum(d.ranks.length)} of ${fmtNum(d.world_size)}`} sub={`window ending at step ${d.step}`} />
        <Card testId="card-iter-range" label="Iteration time" value={fmtMs(d.iteration_ms?.median)} sub={`ranks: ${fmtMs(d.iteration_ms?.min)} – ${fmtMs(d.iteration_ms?.max)}`} />
        <Card
          testId="card-straggler"
          label="Straggler"
          value={s?.significant ? `rank ${s.rank}` : "none"}
          sub={s ? `slowest rank ${s.rank}: +${fmtMs(s.slower_by_ms)} (${fmtPct(s.slower_by_pct)}) working time vs the others' median` : DASH}
        />
        <Card testId="card-imbalance" label="Load imbalance" value={d.load_imbalance != null ? `${fmtNum(d.load_imbalance, 2)}×` : DASH} sub="max / mean compute per rank" />
      </div>
      <div class="grid2">
        <Panel title="Iteration time per rank" testId="panel-dist-iter">
          <IterationBars d={d} dark={dark} />
        </Panel>
        <Panel title="Compute vs communication per rank" testId="panel-dist-comm">
          <CommunicationBars d={d} dark={dark} />
        </Panel>
      </div>
      <Panel title="Ranks" testId="panel-dist-ranks" extra={<span class="muted">per iteration, means over the window; each rank's telemetry and topology are in its run's GPU tab</span>}>
        <RankTable d={d} open={open} />
      </Panel>
      <Panel title="Recommendations across ranks" testId="panel-dist-recommendations">
        {d.recommendations.length ? d.recommendations.map((r) => <RecommendationCard key={r.id} rec={r} preferred="pytorch" />) : <Empty>no distributed recommendations</Empty>}
      </Panel>
    </div>
  );
}
