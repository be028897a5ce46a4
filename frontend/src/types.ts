// JSON shapes of docs/report-schema.md (generated) and docs/plugin-routes.md (by hand). Every field the backend may
// leave null is typed as such: the UI shows "—" rather than guessing.

export type Num = number | null | undefined;

// The report and its sections are generated from the backend's schema (report.gen.ts, from
// tb_gpuprof/analysis/schema.py): they cannot drift from what build_report writes. Fields
// added within schema version 1 are optional there, since stored reports may predate them.
import type * as Gen from "./report.gen";

// Views index a few sections by computed keys (`${part}_us`); those sections also take a
// string index here. (Indexing with `keyof` in the views would let these go.)
type Indexed<T, V = Num> = T & Record<string, V>;
export type IterationItem = Omit<Gen.IterationItem, "breakdown_ms"> & {
  breakdown_ms: Indexed<Gen.IterationBreakdown>;
};
export type Report = Omit<Gen.Report, "tensor_cores" | "breakdown" | "iterations"> & {
  tensor_cores: Indexed<Gen.TensorCores>;
  breakdown: Indexed<Gen.Breakdown, unknown>;
  iterations: Omit<Gen.Iterations, "items"> & { items: IterationItem[] };
};
export type Kernel = Gen.Kernel;
export type Recommendation = Gen.Recommendation;
export type Bottleneck = Gen.Bottleneck;
export type Throughput = Gen.Throughput;
export type Telemetry = Gen.Telemetry;
export type Distributed = Gen.Distributed;

export interface RunInfo {
  run: string;
  reports: { step: number; wall_time: number; rank: number | null }[];
  scalar_tags: string[];
  has_trace: boolean;
  has_telemetry: boolean;
  error: string | null;
  /** whether the latest report saw GPU work (null: no readable report) */
  gpu_work: boolean | null;
  wall_time: number | null;
}

// Tag names the dashboard reads, as the server names them (tb_gpuprof/store/layout.py
// DASHBOARD_TAGS, sent with /runs): the frontend spells none of them itself.
export interface StorageTags {
  iteration_time: string;
  host_step_time: string;
  gpu_step_time: string;
  data_wait: string;
  model_tflops: string;
  mfu: string;
  topology: string;
}

export interface RunsAnswer {
  runs: RunInfo[];
  tags: StorageTags;
}

export type Point = [number, number, number]; // step, wall_time, value

export interface KernelsPage {
  total: number;
  offset: number;
  limit: number;
  kernels: Kernel[];
}

export interface CompareRun {
  run: string;
  step: number | null;
  iterations: { mean_ms: Num; median_ms: Num; count: Num } | null;
  gpu_time_us: Num;
  tensor_cores: Record<string, Num> | null;
  top_kernels: Kernel[];
  error?: string | null;
}

export interface CompareKernel {
  name: string;
  per_run: Record<string, { total_us: number; pct: Num; count: number } | null>;
  status: "appeared" | "vanished" | "changed" | "same" | string;
}

export interface CompareAnswer {
  runs: CompareRun[];
  kernels: CompareKernel[];
  kernels_total: number;
}

/** /memory: a device's allocator series over a range of the window, from the raw trace. */
export interface MemoryRangeAnswer {
  run: string;
  step: number;
  device: string;
  start_ms: number;
  end_ms: number;
  series: Gen.MemorySeries;
}

/** /oom: the run's out-of-memory reports (tb_gpuprof/analysis/oom.py; docs/report-schema.md),
 * the fields the Memory view shows. Written by the hook, not by the report schema's code. */
export interface OomAdvice {
  fix: string;
  predicted_saving_bytes: number | null;
  fits: boolean | null;
  detail: string;
  largest_batch_size?: number;
}

export interface OomReport {
  step: number | null;
  device: string | null;
  batch_size: number | null;
  largest_part: string | null;
  error: { type: string; message: string };
  allocator: { allocated_bytes: number | null; reserved_bytes: number | null };
  last_peak: { source: string; parts: { part: string; bytes: number }[] } | null;
  advice: OomAdvice[];
  notes: string[];
}

export interface OomAnswer {
  run: string;
  reports: OomReport[];
}

export interface TelemetryAnswer {
  series: Record<string, Point[]>;
  topology: unknown;
}

export interface RankRow {
  rank: number;
  run: string | null;
  iterations: Num;
  iteration_ms: Num;
  iteration_median_ms: Num;
  iteration_times_ms: Num[];
  compute_ms: Num;
  communication_ms: Num;
  overlap_ms: Num;
  exposed_ms: Num;
  overlap_pct: Num;
  exposed_pct: Num;
  working_ms: Num;
  backend: string | null;
  gpu_name: string | null;
}

export interface DistributedAnswer {
  run: string;
  step: number;
  world_size: number;
  ranks: RankRow[];
  missing_ranks: number[];
  iteration_ms: { min: number; max: number; median: number } | null;
  straggler: { rank: number; working_ms: number; others_median_ms: number; slower_by_ms: number; slower_by_pct: number; significant: boolean } | null;
  load_imbalance: Num;
  recommendations: Recommendation[];
}
