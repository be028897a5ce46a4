// ECharts, tree-shaken: only the charts/components the views use, canvas renderer only.
// Every option passes through safeOption(): tooltips render as canvas rich text, never HTML,
// so a kernel or run name like `<img onerror=...>` can only ever be drawn as text.
import { BarChart, LineChart, PieChart } from "echarts/charts";
import {
  DataZoomInsideComponent,
  DataZoomSliderComponent,
  GridComponent,
  LegendComponent,
  MarkAreaComponent,
  TooltipComponent,
} from "echarts/components";
import * as echarts from "echarts/core";
import { CanvasRenderer } from "echarts/renderers";
import { useEffect, useRef } from "preact/hooks";

echarts.use([
  BarChart,
  LineChart,
  PieChart,
  GridComponent,
  LegendComponent,
  TooltipComponent,
  MarkAreaComponent,
  DataZoomInsideComponent,
  DataZoomSliderComponent,
  CanvasRenderer,
]);

const axisDark = { axisLine: { lineStyle: { color: "#777" } }, splitLine: { lineStyle: { color: "#3a3a3a" } }, axisLabel: { color: "#ccc" } };
echarts.registerTheme("tbdark", {
  backgroundColor: "transparent",
  textStyle: { color: "#ddd" },
  legend: { textStyle: { color: "#ddd" } },
  categoryAxis: axisDark,
  valueAxis: axisDark,
  timeAxis: axisDark,
  logAxis: axisDark,
});

/** TensorBoard's palette: orange accent, then its scalar-chart colors. */
export const COLORS = {
  tc: "#f57c00",
  nonTc: "#1976d2",
  eligibleNotTc: "#cc3311",
  other: "#1976d2",
  memory: "#009988",
  communication: "#ee3377",
  layout: "#9c27b0",
  idle: "#9e9e9e",
};
export const PALETTE = ["#f57c00", "#1976d2", "#009988", "#cc3311", "#33bbee", "#ee3377", "#9c27b0", "#bbbbbb"];

type Option = Record<string, unknown>;

function safeTooltip(t: unknown): unknown {
  if (Array.isArray(t)) return t.map(safeTooltip);
  if (t && typeof t === "object") return { ...(t as Option), renderMode: "richText" };
  return t;
}

export function safeOption(option: Option, dark = false): Option {
  const out: Option = { color: PALETTE, animation: false, ...option, aria: { enabled: false } };
  out.tooltip = option.tooltip === undefined ? { show: false, renderMode: "richText" } : safeTooltip(option.tooltip);
  if (dark && Array.isArray(option.series)) {
    // ECharts outlines outside labels with a light halo meant for white backgrounds
    out.series = option.series.map((s: Option) => ({ ...s, label: { color: "#ddd", ...(s.label as Option), textBorderWidth: 0 } }));
  }
  return out;
}

interface ChartProps {
  option: Option;
  dark: boolean;
  height?: number;
  label: string; // accessible name of the figure
  testId?: string;
}

export function Chart({ option, dark, height = 260, label, testId }: ChartProps) {
  const el = useRef<HTMLDivElement>(null);
  const chart = useRef<ReturnType<typeof echarts.init> | null>(null);

  useEffect(() => {
    if (!el.current) return;
    const c = echarts.init(el.current, dark ? "tbdark" : undefined, { renderer: "canvas" });
    chart.current = c;
    const ro = new ResizeObserver(() => c.resize());
    ro.observe(el.current);
    return () => {
      ro.disconnect();
      c.dispose();
      chart.current = null;
    };
  }, [dark]);

  useEffect(() => {
    chart.current?.setOption(safeOption(option, dark), true);
  }, [option, dark]);

  return <div class="chart" ref={el} style={{ height: `${height}px` }} role="img" aria-label={label} data-testid={testId} />;
}
