// JSON shapes of docs/report-schema.md and docs/plugin-routes.md. Every field the backend may
// leave null is typed as such: the UI shows "—" rather than guessing.

export type Num = number | null | undefined;

export interface Kernel {
  name: string;
  demangled?: string | null;
  count: number;
  total_us: number;
  mean_us?: Num;
  min_us?: Num;
  max_us?: Num;
  pct: Num;
  uses_tensor_cores: boolean | null;
  precision: string | null;
  category: string | null;
  tc_eligible?: boolean | null;
  ops?: string[] | null;
  grid?: number[] | null;
  block?: number[] | null;
  registers?: Num;
  shared_mem?: Num;
  occupancy_pct?: Num;
  flops?: Num;
  bytes?: Num;
  tflops?: Num;
  source?: string | null;
}

export interface IterationItem {
  step: number | null;
  start_us?: Num;
  wall_ms: Num;
  gpu_busy_ms?: Num;
  breakdown_ms?: Record<string, Num> | null;
}

export interface Recommendation {
  id: string;
  severity: string;
  title: string;
  problem: string;
  evidence?: Record<string, unknown> | null;
  fix?: Record<string, string> | null;
  estimated_saving_ms?: Num;
  estimated_saving_pct?: Num;
  estimated_range_pct?: [number, number] | null;
  predicted_iteration_ms?: Num;
  estimate_basis?: string | null;
}

export interface Report {
  schema_version: number;
  generator?: string;
  source?: { path?: string; format?: string; events?: number } | null;
  system?: Record<string, unknown> | null;
  iterations?: {
    method?: string;
    key?: string | null;
    count?: Num;
    range?: [number, number] | null;
    mean_ms?: Num;
    median_ms?: Num;
    min_ms?: Num;
    max_ms?: Num;
    p95_ms?: Num;
    gpu_busy_mean_ms?: Num;
    unprofiled_median_ms?: Num;
    unprofiled_source?: string | null;
    profiler_overhead_ratio?: Num;
    items?: IterationItem[];
  } | null;
  bottleneck?: Bottleneck | null;
  throughput?: { flops_per_iteration?: Num; achieved_tflops?: Num; peak_tflops?: Num; peak_source?: string | null; mfu_pct?: Num } | null;
  gpu_time_us?: Num;
  kernels?: Kernel[];
  kernels_total?: Num;
  tensor_cores?: Record<string, Num> | null;
  precision_us?: Record<string, Num> | null;
  category_us?: Record<string, Num> | null;
  breakdown?: (Record<string, unknown> & { idle_attribution_us?: Record<string, Num> }) | null;
  phases?: Record<string, unknown> | null;
  telemetry?: Record<string, unknown> | null;
  recommendations?: Recommendation[];
  warnings?: string[];
}

export interface Bottleneck {
  bound: string;
  verdict: string;
  basis: "unprofiled" | "profiled";
  mean_ms: Record<string, number>;
  mean_pct: Record<string, number>;
  corrected_ms: Record<string, number> | null;
  corrected_pct: Record<string, number> | null;
  items: ({ step: number | null } & Record<string, number | null>)[];
  sync_sites?: { op: string; source: string | null; count_per_iteration: number; blocked_ms_per_iteration: number }[];
  glue_max_us?: number;
  note?: string | null;
}

export interface RunInfo {
  run: string;
  reports: { step: number; wall_time: number }[];
  scalar_tags: string[];
  has_trace: boolean;
  has_telemetry: boolean;
  error: string | null;
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
