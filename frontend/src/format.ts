// Number formatting. null/undefined/NaN always render as "—": fields the backend could not derive.
import type { Num } from "./types";

export const DASH = "\u2014";

const ok = (v: Num): v is number => typeof v === "number" && Number.isFinite(v);

export function fmtNum(v: Num, digits = 0): string {
  if (!ok(v)) return DASH;
  return v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

/** A duration given in milliseconds, with sensible precision. */
export function fmtMs(v: Num): string {
  if (!ok(v)) return DASH;
  if (v === 0) return "0 ms";
  if (Math.abs(v) >= 1000) return `${fmtNum(v / 1000, 2)} s`;
  if (Math.abs(v) >= 100) return `${fmtNum(v, 0)} ms`;
  if (Math.abs(v) >= 1) return `${fmtNum(v, 1)} ms`;
  return `${fmtNum(v * 1000, 1)} µs`;
}

export function fmtUs(v: Num): string {
  return ok(v) ? fmtMs(v / 1000) : DASH;
}

export function fmtPct(v: Num, digits = 1): string {
  return ok(v) ? `${fmtNum(v, digits)}%` : DASH;
}

const SI = [
  [1e15, "P"],
  [1e12, "T"],
  [1e9, "G"],
  [1e6, "M"],
  [1e3, "k"],
] as const;

export function fmtSi(v: Num, unit: string, digits = 1): string {
  if (!ok(v)) return DASH;
  for (const [scale, prefix] of SI) if (Math.abs(v) >= scale) return `${fmtNum(v / scale, digits)} ${prefix}${unit}`;
  return `${fmtNum(v, digits)} ${unit}`;
}

export function fmtBytes(v: Num): string {
  if (!ok(v)) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let x = v;
  let i = 0;
  while (Math.abs(x) >= 1024 && i < units.length - 1) {
    x /= 1024;
    i++;
  }
  return `${fmtNum(x, i ? 1 : 0)} ${units[i]}`;
}

export function fmtDims(v: number[] | null | undefined): string {
  return Array.isArray(v) && v.length ? v.join("\u00d7") : DASH;
}

export function fmtBool(v: boolean | null | undefined): string {
  return v === true ? "yes" : v === false ? "no" : DASH;
}

/** Any JSON value as short text (system flags, evidence). */
export function fmtValue(v: unknown): string {
  if (v === null || v === undefined) return DASH;
  if (typeof v === "number") return Number.isInteger(v) ? fmtNum(v) : fmtNum(v, 2);
  if (typeof v === "boolean") return v ? "true" : "false";
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

export function humanize(key: string): string {
  return key
    .replace(/_(us|ms|pct)$/, (_m, u: string) => ` (${u === "pct" ? "%" : u === "us" ? "µs" : "ms"})`)
    .replace(/_/g, " ");
}
