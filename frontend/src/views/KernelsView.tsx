// Every kernel of the window, paged, sorted and filtered by the backend (/kernels), so a report
// with thousands of kernels never has to be rendered at once.
import { useEffect, useState } from "preact/hooks";
import { api } from "../api";
import { Empty, ErrorBox, Loading, useAsync } from "../components";
import { DASH, fmtNum, fmtSi } from "../format";
import { ALL_COLUMNS, type Column, KernelTable } from "../kernelTable";
import type { Kernel, Report } from "../types";

// What a row's FLOPs are (kernels[].flops_basis, docs/report-schema.md#kernels-flops): only
// "counted" FLOPs are the kernel's work, so only they have a rate (the backend leaves tflops
// null for the others) and a place on the roofline.
const BASIS_NOTE: Record<string, { tag: string; why: string }> = {
  direct_conv_equivalent: {
    tag: "direct-conv equiv.",
    why: "FFT/Winograd convolution: the FLOPs a direct convolution would do, not the work this kernel did (that depends on transform sizes cuDNN does not record); no TFLOP/s, not on the roofline",
  },
  over_pipe_peak: {
    tag: "not its work",
    why: "its op's FLOPs would put this kernel above the peak of the pipe it runs on, so they are not its work; no TFLOP/s, not on the roofline",
  },
};

function flopsCell(k: Kernel) {
  const note = BASIS_NOTE[k.flops_basis ?? ""];
  if (!note) return fmtSi(k.flops, "FLOP");
  return (
    <span title={note.why} data-basis={k.flops_basis}>
      {fmtSi(k.flops, "FLOP")} <span class="muted">{note.tag}</span>
    </span>
  );
}

function tflopsCell(k: Kernel) {
  const note = BASIS_NOTE[k.flops_basis ?? ""];
  return note ? <span class="muted" title={note.why}>{DASH}</span> : fmtNum(k.tflops, 1);
}

const KERNEL_COLUMNS: Column[] = ALL_COLUMNS.map((c) => {
  if (c.key === "flops") return { ...c, title: "FLOPs of the ops that launched it, split over their kernels by time", cell: flopsCell };
  if (c.key === "tflops") return { ...c, title: "FLOPs it executed per second of its time; never above the peak of its pipe (Tensor Cores of its precision, or CUDA cores)", cell: tflopsCell };
  return c;
});

const TEXT_COLUMNS = new Set(["name", "precision", "category", "ops", "source"]);
const PAGE_SIZES = [50, 100, 250];

interface Props {
  run: string;
  step: number | null;
  report: Report;
  /** Search text to open with (a kernel name linked from the dashboard). */
  initialQuery?: string;
}

export function KernelsView({ run, step, report, initialQuery = "" }: Props) {
  const [sort, setSort] = useState("total_us");
  const [order, setOrder] = useState<"asc" | "desc">("desc");
  const [text, setText] = useState(initialQuery);
  const [q, setQ] = useState(initialQuery.trim());
  const [category, setCategory] = useState("");
  const [tc, setTc] = useState("");
  const [precision, setPrecision] = useState("");
  const [offset, setOffset] = useState(0);
  const [limit, setLimit] = useState(50);

  // Debounce typing so each keystroke does not cost a request.
  useEffect(() => {
    const t = setTimeout(() => {
      if (text.trim() !== q) {
        setQ(text.trim());
        setOffset(0);
      }
    }, 200);
    return () => clearTimeout(t);
  }, [text]);
  // Any change of filter/sort/page size starts again at the first page (the view remounts per run/step).
  const resetting = <T,>(set: (v: T) => void) => (v: T) => {
    set(v);
    setOffset(0);
  };

  const page = useAsync(
    () => api.kernels({ run, step, sort, order, q, category, tc, precision, offset, limit }),
    [run, step, sort, order, q, category, tc, precision, offset, limit],
  );

  const onSort = (key: string) => {
    setOffset(0);
    if (key === sort) setOrder(order === "asc" ? "desc" : "asc");
    else {
      setSort(key);
      setOrder(TEXT_COLUMNS.has(key) ? "asc" : "desc");
    }
  };
  const categories = Object.keys(report.category_us ?? {}).sort();
  const precisions = Object.keys(report.precision_us ?? {}).sort();
  const total = page.data?.total ?? 0;
  const shown = page.data?.kernels ?? [];

  return (
    <div data-testid="view-kernels">
      <div class="toolbar">
        <input type="search" placeholder="Search name, op, source…" aria-label="search kernels" value={text}
          onInput={(e) => setText((e.target as HTMLInputElement).value)} data-testid="kernel-search" />
        <label>Category{" "}
          <select value={category} onChange={(e) => resetting(setCategory)((e.target as HTMLSelectElement).value)} data-testid="filter-category">
            <option value="">all</option>
            {categories.map((c) => <option key={c} value={c}>{c}</option>)}
          </select>
        </label>
        <label>Tensor Cores{" "}
          <select value={tc} onChange={(e) => resetting(setTc)((e.target as HTMLSelectElement).value)} data-testid="filter-tc">
            <option value="">all</option>
            <option value="true">using TC</option>
            <option value="false">not using TC</option>
          </select>
        </label>
        <label>Precision{" "}
          <select value={precision} onChange={(e) => resetting(setPrecision)((e.target as HTMLSelectElement).value)} data-testid="filter-precision">
            <option value="">all</option>
            {precisions.map((p) => <option key={p} value={p}>{p}</option>)}
          </select>
        </label>
        <span class="muted" data-testid="kernel-total" data-total={page.data ? total : undefined}>
          {page.data ? `${fmtNum(total)} kernels match` : ""}
          {report.kernels_total && report.kernels && report.kernels_total > report.kernels.length
            ? ` (report stores ${fmtNum(report.kernels.length)} of ${fmtNum(report.kernels_total)})` : ""}
        </span>
      </div>
      {page.error ? <ErrorBox what="kernels" error={page.error} /> : null}
      {page.loading && !page.data ? <Loading /> : null}
      {page.data && !shown.length ? <Empty>no kernel matches these filters</Empty> : null}
      {shown.length ? (
        <div aria-busy={page.loading}>
          <KernelTable kernels={shown} columns={KERNEL_COLUMNS} sort={sort} order={order} onSort={onSort} testId="kernels-table" />
        </div>
      ) : null}
      {page.data ? (
        <div class="pager">
          <button onClick={() => setOffset(Math.max(0, offset - limit))} disabled={offset === 0} data-testid="page-prev">‹ Prev</button>
          <span data-testid="page-range">{total ? `${fmtNum(offset + 1)}–${fmtNum(Math.min(offset + limit, total))} of ${fmtNum(total)}` : "0"}</span>
          <button onClick={() => setOffset(offset + limit)} disabled={offset + limit >= total} data-testid="page-next">Next ›</button>
          <label class="muted">rows{" "}
            <select value={String(limit)} onChange={(e) => resetting(setLimit)(Number((e.target as HTMLSelectElement).value))}>
              {PAGE_SIZES.map((n) => <option key={n} value={String(n)}>{n}</option>)}
            </select>
          </label>
        </div>
      ) : null}
    </div>
  );
}
