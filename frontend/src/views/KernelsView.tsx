// Every kernel of the window, paged, sorted and filtered by the backend (/kernels), so a report
// with thousands of kernels never has to be rendered at once.
import { useEffect, useState } from "preact/hooks";
import { api } from "../api";
import { Empty, ErrorBox, Loading, useAsync } from "../components";
import { fmtNum } from "../format";
import { ALL_COLUMNS, KernelTable } from "../kernelTable";
import type { Report } from "../types";

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
          <KernelTable kernels={shown} columns={ALL_COLUMNS} sort={sort} order={order} onSort={onSort} testId="kernels-table" />
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
