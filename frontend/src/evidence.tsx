// A recommendation's evidence as words and small tables: human labels with units, kernel lists
// as links into the Kernels view (filtered to that kernel), never raw JSON.
import { DASH, fmtMs, fmtNum, fmtPct, fmtUs, humanize } from "./format";

/** Opens the Kernels view filtered to kernels whose name, op or source contains `q`. */
export type OpenKernels = (q: string) => void;

// Labels of the keys the rules write (tb_gpuprof/analysis/rules/); others are humanized.
const LABELS: Record<string, string> = {
  fp32_eligible_pct: "GPU time in FP32 math that could use Tensor Cores",
  fp32_eligible_us: "FP32 math that could use Tensor Cores",
  top_fp32_kernels: "Largest FP32 kernels",
  flags: "Framework settings",
  fp32_family_pct: "GPU time in FP32/TF32 matrix math",
  tf32_pct: "GPU time in TF32 on Tensor Cores",
  fp32_simt_pct: "GPU time in FP32 on CUDA cores",
  half_tc_pct: "GPU time in FP16/BF16 on Tensor Cores",
  layout_pct: "GPU time in layout transforms",
  layout_us: "Layout transforms",
  conv_pct: "GPU time in convolutions",
  layout_kernels: "Layout transform kernels",
  data_loader_wait_ms: "Waiting for the data loader, per iteration",
  host_outside_ops_ms: "Host work outside ops, per iteration",
  hook_data_wait_ms: "Data wait measured by the hook, per iteration",
  copy_ms: "Copies, per iteration",
  input_bound_pct: "Iteration spent waiting for input",
  pageable_copy_ms: "Pageable host-to-device copies, per iteration",
  pageable_copy_pct: "Iteration in pageable copies",
  pageable_gbps: "Pageable copy bandwidth",
  pinned_estimate_ms: "Same copies from pinned memory (estimate)",
  blocked_ms: "Host blocked on the GPU, per iteration",
  refill_ms: "GPU idle after each sync, per iteration",
  exposed_host_ms: "Host time the GPU waits for, per iteration",
  syncs_per_iteration: "Host-GPU syncs per iteration",
  sites: "Where the host synchronizes",
  gpu_busy_pct: "GPU busy",
  memory_used_pct: "GPU memory used",
  dispatch_pct: "Iteration the GPU waits for op dispatch",
  dispatch_ms: "Op dispatch the GPU waits for, per iteration",
  gpu_ms: "GPU work, per iteration",
  small_kernel_pct: "GPU time in small elementwise/reduction/norm kernels",
  kernels_per_iteration: "Kernels per iteration",
  steps_per_execution: "Keras steps_per_execution",
  // columns of "sites"
  op: "Op",
  source: "Source",
  count_per_iteration: "Times per iteration",
  blocked_ms_per_iteration: "Blocked per iteration",
};

export const evidenceLabel = (key: string): string => LABELS[key] ?? humanize(key).replace(/ \((%|µs|ms)\)$/, "");

/** One scalar by the unit its key names. */
export function evidenceValue(key: string, v: unknown): string {
  if (v === null || v === undefined) return DASH;
  if (typeof v === "boolean") return v ? "on" : "off";
  if (typeof v === "number") {
    if (key.endsWith("_pct")) return fmtPct(v);
    if (key.endsWith("_ms") || key.endsWith("_ms_per_iteration")) return fmtMs(v);
    if (key.endsWith("_us")) return fmtUs(v);
    if (key.endsWith("_gbps")) return `${fmtNum(v, 1)} GB/s`;
    return Number.isInteger(v) ? fmtNum(v) : fmtNum(v, 2);
  }
  return String(v);
}

const isKernelList = (key: string, v: unknown): v is string[] =>
  /kernels$/.test(key) && Array.isArray(v) && v.every((x) => typeof x === "string");

function KernelLinks({ names, open }: { names: string[]; open?: OpenKernels }) {
  if (!names.length) return <span>{DASH}</span>;
  if (!open) return <span>{names.join(", ")}</span>;
  return (
    <ul class="kernel-links" data-testid="kernel-links">
      {names.map((n) => (
        <li key={n}>
          <a href="#" title={`show ${n} in the Kernels view`} data-kernel={n} onClick={(e) => { e.preventDefault(); open(n); }}>
            <span class="trunc">{n}</span>
          </a>
        </li>
      ))}
    </ul>
  );
}

function RowsTable({ rows }: { rows: Record<string, unknown>[] }) {
  const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  return (
    <table class="evidence-table" data-testid="evidence-table">
      <thead><tr>{cols.map((c) => <th key={c}>{evidenceLabel(c)}</th>)}</tr></thead>
      <tbody>
        {rows.map((r, i) => (
          <tr key={i}>{cols.map((c) => <td key={c}>{evidenceText(c, r[c])}</td>)}</tr>
        ))}
      </tbody>
    </table>
  );
}

/** Nested values as words: objects as "label: value" pairs, lists joined. */
function evidenceText(key: string, v: unknown): string {
  if (Array.isArray(v)) return v.map((x) => evidenceText(key, x)).join(", ") || DASH;
  if (v && typeof v === "object") {
    const parts = Object.entries(v).filter(([, x]) => x !== null && x !== undefined);
    return parts.length ? parts.map(([k, x]) => `${evidenceLabel(k)}: ${evidenceText(k, x)}`).join(" · ") : DASH;
  }
  return evidenceValue(key, v);
}

function EvidenceValue({ k, v, open }: { k: string; v: unknown; open?: OpenKernels }) {
  if (isKernelList(k, v)) return <KernelLinks names={v} open={open} />;
  if (Array.isArray(v) && v.length && v.every((x) => x && typeof x === "object" && !Array.isArray(x))) {
    return <RowsTable rows={v as Record<string, unknown>[]} />;
  }
  if (v && typeof v === "object" && !Array.isArray(v)) {
    const entries = Object.entries(v);
    if (!entries.length) return <span>{DASH}</span>;
    return (
      <table class="evidence-table" data-testid="evidence-table">
        <tbody>{entries.map(([sk, sv]) => <tr key={sk}><td>{evidenceLabel(sk)}</td><td>{evidenceText(sk, sv)}</td></tr>)}</tbody>
      </table>
    );
  }
  return <span>{evidenceText(k, v)}</span>;
}

export function Evidence({ evidence, open }: { evidence: Record<string, unknown>; open?: OpenKernels }) {
  const rows = Object.entries(evidence).filter(([, v]) => v !== null && v !== undefined);
  if (!rows.length) return null;
  return (
    <dl class="kv evidence" data-testid="evidence">
      {rows.map(([k, v]) => [
        <dt key={`k${k}`} data-key={k}>{evidenceLabel(k)}</dt>,
        <dd key={`v${k}`}><EvidenceValue k={k} v={v} open={open} /></dd>,
      ])}
    </dl>
  );
}
