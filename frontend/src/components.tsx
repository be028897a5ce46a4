// Small shared pieces. All text goes through Preact's text nodes/attributes (escaped by the DOM).
import type { ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";
import { DASH } from "./format";

export interface Async<T> {
  data: T | null;
  error: string | null;
  loading: boolean;
}

/** Runs `load` whenever `deps` change; drops answers that arrive after a newer request started. */
export function useAsync<T>(load: () => Promise<T> | null, deps: unknown[]): Async<T> {
  const [state, setState] = useState<Async<T>>({ data: null, error: null, loading: true });
  useEffect(() => {
    let live = true;
    const p = load();
    if (!p) {
      setState({ data: null, error: null, loading: false });
      return;
    }
    setState((s) => ({ data: s.data, error: null, loading: true }));
    p.then(
      (data) => live && setState({ data, error: null, loading: false }),
      (e: unknown) => live && setState({ data: null, error: e instanceof Error ? e.message : String(e), loading: false }),
    );
    return () => {
      live = false;
    };
  }, deps);
  return state;
}

export function ErrorBox({ error, what }: { error: string; what?: string }) {
  return (
    <div class="error" role="alert" data-testid="error">
      {what ? `${what}: ` : ""}
      {error}
    </div>
  );
}

export function Loading({ what = "Loading" }: { what?: string }) {
  return <div class="muted" aria-busy="true">{what}…</div>;
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <div class="empty" data-testid="empty">{children}</div>;
}

/** Long names (templated CUDA kernels) truncate with an ellipsis; the full text is the tooltip. */
export function Trunc({ text, title, narrow }: { text: string | null | undefined; title?: string; narrow?: boolean }) {
  if (!text) return <span>{DASH}</span>;
  return (
    <span class={narrow ? "trunc narrow" : "trunc"} title={title ?? text}>
      {text}
    </span>
  );
}

export function Card({ label, value, sub, testId }: { label: string; value: string; sub?: string; testId?: string }) {
  return (
    <div class="card" data-testid={testId}>
      <div class="label">{label}</div>
      <div class="value">{value}</div>
      {sub ? <div class="sub">{sub}</div> : null}
    </div>
  );
}

export function Panel({ title, children, testId, extra }: { title: string; children: ComponentChildren; testId?: string; extra?: ComponentChildren }) {
  return (
    <section class="panel" data-testid={testId}>
      <div style={{ display: "flex", alignItems: "baseline", gap: "8px" }}>
        <h2>{title}</h2>
        {extra}
      </div>
      {children}
    </section>
  );
}

export function KeyValues({ rows, testId }: { rows: [string, string][]; testId?: string }) {
  return (
    <dl class="kv" data-testid={testId}>
      {rows.map(([k, v]) => [<dt key={`k${k}`}>{k}</dt>, <dd key={`v${k}`}>{v}</dd>])}
    </dl>
  );
}
