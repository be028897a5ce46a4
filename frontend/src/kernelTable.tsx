// Kernel table used by the Dashboard (top 10) and the Kernels view (every column, server-sorted).
import type { JSX } from "preact";
import { Trunc } from "./components";
import { DASH, fmtBool, fmtBytes, fmtDims, fmtNum, fmtPct, fmtSi, fmtUs } from "./format";
import type { Kernel } from "./types";

export interface Column {
  key: string; // the kernel field the backend sorts by
  label: string;
  numeric?: boolean;
  title?: string;
  cell: (k: Kernel) => JSX.Element | string;
}

function tcCell(k: Kernel): JSX.Element | string {
  if (k.uses_tensor_cores === true) return <span class="badge tc">TC</span>;
  return fmtBool(k.uses_tensor_cores);
}

export const NAME_COLUMN: Column = {
  key: "name",
  label: "Kernel",
  cell: (k) => <Trunc text={k.name} title={k.demangled && k.demangled !== k.name ? `${k.name}\n\n${k.demangled}` : k.name} />,
};

export const TOP_COLUMNS: Column[] = [
  NAME_COLUMN,
  { key: "total_us", label: "Time", numeric: true, cell: (k) => fmtUs(k.total_us) },
  { key: "pct", label: "% GPU", numeric: true, cell: (k) => fmtPct(k.pct) },
  { key: "count", label: "Calls", numeric: true, cell: (k) => fmtNum(k.count) },
  { key: "uses_tensor_cores", label: "TC", cell: tcCell },
  { key: "precision", label: "Precision", cell: (k) => k.precision ?? DASH },
  { key: "category", label: "Category", cell: (k) => k.category ?? DASH },
];

export const ALL_COLUMNS: Column[] = [
  ...TOP_COLUMNS.slice(0, 4),
  { key: "mean_us", label: "Mean", numeric: true, cell: (k) => fmtUs(k.mean_us) },
  { key: "min_us", label: "Min", numeric: true, cell: (k) => fmtUs(k.min_us) },
  { key: "max_us", label: "Max", numeric: true, cell: (k) => fmtUs(k.max_us) },
  ...TOP_COLUMNS.slice(4),
  { key: "tc_eligible", label: "TC eligible", cell: (k) => fmtBool(k.tc_eligible) },
  { key: "ops", label: "Ops", cell: (k) => <Trunc narrow text={(k.ops ?? []).join(", ")} /> },
  { key: "source", label: "Source", cell: (k) => <Trunc narrow text={k.source} /> },
  { key: "grid", label: "Grid", cell: (k) => fmtDims(k.grid) },
  { key: "block", label: "Block", cell: (k) => fmtDims(k.block) },
  { key: "registers", label: "Regs", numeric: true, title: "registers per thread", cell: (k) => fmtNum(k.registers) },
  { key: "shared_mem", label: "Shared mem", numeric: true, cell: (k) => fmtBytes(k.shared_mem) },
  { key: "occupancy_pct", label: "Occupancy", numeric: true, cell: (k) => fmtPct(k.occupancy_pct) },
  { key: "flops", label: "FLOPs", numeric: true, cell: (k) => fmtSi(k.flops, "FLOP") },
  { key: "bytes", label: "Bytes", numeric: true, cell: (k) => fmtBytes(k.bytes) },
  { key: "tflops", label: "TFLOP/s", numeric: true, cell: (k) => fmtNum(k.tflops, 1) },
  {
    key: "pct_of_sol", label: "% of speed of light", numeric: true,
    title: "time at the GPU's ceilings (FLOPs / peak or bytes / bandwidth, the slower) over the kernel's time; a lower bound (docs/roofline.md)",
    cell: (k) => fmtPct(k.pct_of_sol),
  },
];

interface TableProps {
  kernels: Kernel[];
  columns: Column[];
  sort?: string;
  order?: "asc" | "desc";
  onSort?: (key: string) => void;
  testId?: string;
}

export function KernelTable({ kernels, columns, sort, order, onSort, testId }: TableProps) {
  return (
    <div class="tablewrap">
      <table data-testid={testId}>
        <thead>
          <tr>
            {columns.map((c) => {
              const sorted = sort === c.key ? (order === "asc" ? "ascending" : "descending") : undefined;
              return (
                <th
                  key={c.key}
                  class={(c.numeric ? "num " : "") + (onSort ? "sortable" : "")}
                  aria-sort={sorted}
                  title={c.title ?? (onSort ? `sort by ${c.label.toLowerCase()}` : undefined)}
                  data-col={c.key}
                  onClick={onSort ? () => onSort(c.key) : undefined}
                >
                  {c.label}
                </th>
              );
            })}
          </tr>
        </thead>
        <tbody>
          {kernels.map((k, i) => (
            <tr key={`${i}:${k.name}`}>
              {columns.map((c) => (
                <td key={c.key} class={c.numeric ? "num" : undefined} data-col={c.key}>
                  {c.cell(k)}
                </td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
