// Usage charts (uPlot): GPU-hours per day (or month) stacked by project or tenant, on the usage pages.
//
// `<div data-usage-chart data-source="<json_script id>" data-unit="GPU-hours">`: the figures come embedded in
// the page, `{bucket, x: [bucket starts, epoch seconds], series: [{label, values}]}`, the largest group first
// (the page's table beside the chart holds the same figures). Bars are stacked: the largest group at the
// bottom; the legend and the cursor read each group's own figure, not the stack's height.
//
// uPlot comes from the vendored uPlot.iife.min.js (a classic script the page loads first).

import { pageData } from "./live.js";

const HEIGHT = 240;
// gpuchart.js's palette: mid-lightness hues that keep their contrast on Pico's light and dark backgrounds.
const PALETTE = ["#3b82f6", "#f97316", "#10b981", "#e11d48", "#a855f7", "#eab308", "#06b6d4", "#ec4899"];
const OTHER = "#9ca3af";

function themeColour(name, fallback) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
}

function formatHours(value) {
  if (value == null) return "—";
  return value >= 100 ? value.toFixed(0) : value.toFixed(value >= 10 ? 1 : 2);
}

/** Return the running sums of `series` (arrays of equal length): the top of each group's part of the stack. */
function stackTops(series) {
  const tops = [];
  let below = null;
  for (const values of series) {
    const top = values.map((value, i) => value + (below ? below[i] : 0));
    tops.push(top);
    below = top;
  }
  return tops;
}

class UsageChart {
  constructor(root) {
    this.root = root;
    this.data = pageData(root.dataset.source, { x: [], series: [] });
    this.unit = root.dataset.unit || "";
    this.chart = null;
    if (!this.data.x.length || !this.data.series.length) return;
    this.draw();
    new ResizeObserver(() => this.chart?.setSize({ width: this.width(), height: HEIGHT })).observe(root);
  }

  width() {
    return Math.max(this.root.clientWidth, 240);
  }

  draw() {
    const { x, series } = this.data;
    const tops = stackTops(series.map((group) => group.values));
    // uPlot draws its series in order, later over earlier: the whole stack first, the bottom group last.
    const order = series.map((_, i) => i).reverse();
    const text = themeColour("--pico-muted-color", "#7b8495");
    const grid = themeColour("--pico-muted-border-color", "#d5d9e0");
    const axis = { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
    const highest = Math.max(0, ...tops[tops.length - 1]);
    const monthly = this.data.bucket === "month";
    const options = {
      width: this.width(),
      height: HEIGHT,
      legend: { live: true },
      // The buckets are UTC days and months: read them in UTC, whatever the browser's time zone.
      tzDate: (seconds) => window.uPlot.tzDate(new Date(seconds * 1000), "Etc/UTC"),
      cursor: { points: { show: false } },
      scales: {
        x: { time: true, range: (u, min, max) => this.xRange(min, max) },
        y: { range: [0, highest > 0 ? highest * 1.08 : 1] },
      },
      axes: [
        { ...axis, values: monthly ? "{MMM} {YYYY}" : "{D} {MMM}" },
        { ...axis, size: 56, label: this.unit, values: (u, values) => values.map(formatHours) },
      ],
      series: [
        { label: monthly ? "Month" : "Day", value: monthly ? "{MMMM} {YYYY}" : "{WWW} {D} {MMM}" },
        ...order.map((i) => {
          const colour = series[i].label === "other" ? OTHER : PALETTE[i % PALETTE.length];
          return {
            label: series[i].label,
            stroke: colour,
            fill: colour,
            width: 0,
            points: { show: false },
            paths: window.uPlot.paths.bars({ size: [0.75, 48] }),
            value: (u, value, seriesIndex, index) => (index == null ? "—" : formatHours(series[i].values[index])),
          };
        }),
      ],
    };
    this.chart = new window.uPlot(options, [x, ...order.map((i) => tops[i])], this.root);
  }

  // Half a bucket either side, so the first and last bars show whole.
  xRange(min, max) {
    const half = this.data.x.length > 1 ? (this.data.x[1] - this.data.x[0]) / 2 : 43200;
    return [min - half, max + half];
  }
}

for (const root of document.querySelectorAll("[data-usage-chart]")) new UsageChart(root);
