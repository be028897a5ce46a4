// Route client. URLs are relative: TensorBoard's plugin_entry.html sets <base href="plugin/gpuprof/">,
// so "runs" resolves to /data/plugin/gpuprof/runs (also behind a --path_prefix).
import type { CompareAnswer, DistributedAnswer, KernelsPage, MemoryRangeAnswer, OomAnswer, Point, Report, RunsAnswer, StorageTags, TelemetryAnswer } from "./types";

export class ApiError extends Error {
  constructor(public status: number, message: string) {
    super(message);
  }
}

type Params = Record<string, string | number | boolean | null | undefined>;

function query(params: Params): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : "";
}

const cache = new Map<string, Promise<unknown>>();

/** GET a JSON route; non-2xx answers become an ApiError carrying the backend's one-line `error`. */
export async function getJson<T>(route: string, params: Params = {}, useCache = true): Promise<T> {
  const url = route + query(params);
  if (useCache && cache.has(url)) return cache.get(url) as Promise<T>;
  const p = (async () => {
    let resp: Response;
    try {
      resp = await fetch(url, { headers: { Accept: "application/json" } });
    } catch (e) {
      throw new ApiError(0, `cannot reach TensorBoard (${String(e)})`);
    }
    let body: unknown = null;
    try {
      body = await resp.json();
    } catch {
      if (resp.ok) throw new ApiError(resp.status, `${route}: the answer is not JSON`);
    }
    if (!resp.ok) {
      const msg = body && typeof body === "object" && "error" in body ? String((body as { error: unknown }).error) : resp.statusText;
      throw new ApiError(resp.status, `${msg} (HTTP ${resp.status})`);
    }
    return body as T;
  })();
  if (useCache) {
    cache.set(url, p);
    p.catch(() => cache.delete(url)); // let a retry (reload) ask again
  }
  return p;
}

export function clearCache(): void {
  cache.clear();
}

let serverTags: StorageTags | null = null;

/** A tag name as the server's last /runs answer gave it (null before the first answer). */
export function storageTag(name: keyof StorageTags): string | null {
  return serverTags ? serverTags[name] : null;
}

export const api = {
  runs: async () => {
    const answer = await getJson<RunsAnswer>("runs", {}, false);
    serverTags = answer.tags ?? null;
    return answer;
  },
  report: (run: string, step: number | null) => getJson<Report>("report", { run, step }),
  scalars: (run: string, tag: string) =>
    getJson<{ run: string; tag: string; points: Point[] }>("scalars", { run, tag }),
  kernels: (p: Params) => getJson<KernelsPage>("kernels", p),
  compare: (runs: string[]) => getJson<CompareAnswer>("compare", { runs: runs.join(",") }),
  telemetry: (run: string) => getJson<TelemetryAnswer>("telemetry", { run }),
  distributed: (run: string, step: number | null) => getJson<DistributedAnswer>("distributed", { run, step }),
  memory: (run: string, step: number | null, device: string, startMs: number, endMs: number) =>
    getJson<MemoryRangeAnswer>("memory", { run, step, device, start_ms: startMs, end_ms: endMs }),
  oom: (run: string) => getJson<OomAnswer>("oom", { run }),
  traceUrl: (run: string, step: number | null) => "trace" + query({ run, step }),
};
