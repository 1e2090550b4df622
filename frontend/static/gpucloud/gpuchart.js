// Live GPU charts (uPlot): utilization and memory used per GPU, on a workload's page and a node's.
//
// `<div data-gpu-chart data-ws="/ws/.../metrics/" data-gpus="<json_script id>">`: the GPUs the page
// already knows (so a held GPU keeps its label after it was released), then the socket's messages:
// `allocations` or `node` (the GPUs), `history` (per-minute rollups, drawn before the live points)
// and `gpus` (a sample per GPU about every second). Points are kept for an hour; the chart shows
// the last five minutes, or the hour. `data-points` counts the live samples received.
//
// uPlot comes from the vendored uPlot.iife.min.js (a classic script the page loads first).

import { LiveSocket, pageData } from "./live.js";

const KEEP_SECONDS = 3600 + 60;
const HEIGHT = 190;
// Mid-lightness hues that keep their contrast on Pico's light and dark backgrounds.
const PALETTE = ["#3b82f6", "#f97316", "#10b981", "#e11d48", "#a855f7", "#eab308", "#06b6d4", "#ec4899"];

/** Return the index of the first element of the ascending `values` that is >= `x`. */
function lowerBound(values, x) {
  let low = 0;
  let high = values.length;
  while (low < high) {
    const middle = (low + high) >> 1;
    if (values[middle] < x) low = middle + 1;
    else high = middle;
  }
  return low;
}

function themeColour(name, fallback) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
}

function formatPercent(value) {
  return value == null ? "—" : `${value.toFixed(0)}%`;
}

function formatMemory(mib) {
  if (mib == null) return "—";
  const gib = mib / 1024;
  return `${gib.toFixed(gib < 10 ? 1 : 0)} GiB`;
}

class GpuChart {
  constructor(root) {
    this.root = root;
    this.window = 300;
    this.gpus = []; // [{uuid, label}] in series order
    this.xs = [];
    this.util = new Map();
    this.memory = new Map();
    this.memoryTotal = 0;
    this.points = 0;
    this.serverTime = null; // [server epoch seconds of the latest sample, performance.now() when it came]
    this.charts = [];
    this.frame = 0;
    this.nodeMode = root.dataset.scope === "node";
    this.utilTarget = root.querySelector("[data-chart-util]");
    this.memoryTarget = root.querySelector("[data-chart-memory]");
    this.empty = root.querySelector("[data-chart-empty]");
    root.querySelector("[data-chart-toolbar]").hidden = false;
    for (const button of root.querySelectorAll("[data-window]")) {
      button.addEventListener("click", () => this.setWindow(Number(button.dataset.window)));
    }
    if (root.dataset.gpus) this.addGpus(pageData(root.dataset.gpus, []));
    new ResizeObserver(() => this.resize()).observe(root);
    window.setInterval(() => this.schedule(), 1000); // the window slides even while no sample comes
    this.socket = new LiveSocket({
      path: root.dataset.ws,
      onmessage: (message) => this.receive(message),
      badge: root.querySelector("[data-live-badge]"),
    });
  }

  receive(message) {
    if (message.type === "allocations" || message.type === "node") {
      this.addGpus(message.gpus);
      this.root.dataset.synced = "true";
    } else if (message.type === "history") {
      for (const [uuid, rows] of Object.entries(message.gpus)) {
        for (const [at, average, , memoryMax] of rows) this.put(at, uuid, average, memoryMax);
      }
    } else if (message.type === "gpus") {
      this.samples(message);
    }
    this.schedule();
  }

  samples(message) {
    this.serverTime = [message.at, performance.now()];
    for (const sample of message.gpus) {
      if (!this.util.has(sample.uuid)) this.addGpus([{ ...sample, node: message.node }]);
      this.put(message.at, sample.uuid, sample.utilization_gpu, sample.memory_used_mib);
      this.memoryTotal = Math.max(this.memoryTotal, sample.memory_total_mib ?? 0);
      this.points += 1;
    }
    this.root.dataset.points = String(this.points);
    this.trim();
  }

  // GPUs are only ever added: one released meanwhile keeps its line until it slides out.
  addGpus(gpus) {
    const fresh = gpus.filter((gpu) => !this.util.has(gpu.uuid));
    if (!fresh.length) return;
    for (const gpu of fresh) {
      this.util.set(gpu.uuid, new Array(this.xs.length).fill(null));
      this.memory.set(gpu.uuid, new Array(this.xs.length).fill(null));
      this.gpus.push({ uuid: gpu.uuid, node: gpu.node ?? "", index: gpu.index ?? "?" });
    }
    this.gpus.sort((a, b) => (a.node === b.node ? a.index - b.index : a.node < b.node ? -1 : 1));
    const nodes = new Set(this.gpus.map((gpu) => gpu.node));
    for (const gpu of this.gpus) {
      gpu.label = this.nodeMode || nodes.size < 2 ? `GPU ${gpu.index}` : `${gpu.node} GPU ${gpu.index}`;
    }
    this.rebuild();
  }

  put(at, uuid, utilization, memoryUsed) {
    if (!this.util.has(uuid)) return;
    let column = this.xs.length;
    if (column === 0 || this.xs[column - 1] < at) {
      this.xs.push(at);
      for (const values of [...this.util.values(), ...this.memory.values()]) values.push(null);
    } else {
      column = lowerBound(this.xs, at);
      if (this.xs[column] !== at) {
        this.xs.splice(column, 0, at);
        for (const values of [...this.util.values(), ...this.memory.values()]) values.splice(column, 0, null);
      }
    }
    this.util.get(uuid)[column] = utilization ?? null;
    this.memory.get(uuid)[column] = memoryUsed ?? null;
  }

  trim() {
    const oldest = lowerBound(this.xs, this.now() - KEEP_SECONDS);
    if (oldest === 0) return;
    this.xs.splice(0, oldest);
    for (const values of [...this.util.values(), ...this.memory.values()]) values.splice(0, oldest);
  }

  // Server time now, so a browser clock that is off does not push the points out of the window.
  now() {
    if (!this.serverTime) return this.xs.length ? this.xs[this.xs.length - 1] : Date.now() / 1000;
    const [at, received] = this.serverTime;
    return at + (performance.now() - received) / 1000;
  }

  setWindow(seconds) {
    this.window = seconds;
    for (const button of this.root.querySelectorAll("[data-window]")) {
      button.setAttribute("aria-pressed", String(Number(button.dataset.window) === seconds));
    }
    this.schedule();
  }

  options(unit) {
    const text = themeColour("--pico-muted-color", "#7b8495");
    const grid = themeColour("--pico-muted-border-color", "#d5d9e0");
    const percent = unit === "percent";
    const format = percent ? formatPercent : formatMemory;
    const axis = { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
    return {
      width: this.width(),
      height: HEIGHT,
      cursor: { sync: { key: this.root.id || "gpu-chart" } },
      legend: { live: true },
      scales: {
        x: { time: true, range: () => [this.now() - this.window, this.now()] },
        y: { range: percent ? [0, 100] : (u, min, max) => [0, Math.max(this.memoryTotal, max ?? 0, 1024)] },
      },
      axes: [axis, { ...axis, size: 64, values: (u, values) => values.map(format) }],
      series: [
        {},
        ...this.gpus.map((gpu, i) => ({
          label: gpu.label,
          stroke: PALETTE[i % PALETTE.length],
          width: 1.5,
          spanGaps: true,
          points: { show: false },
          value: (u, value) => format(value),
        })),
      ],
    };
  }

  data(series) {
    return [this.xs, ...this.gpus.map((gpu) => series.get(gpu.uuid))];
  }

  rebuild() {
    for (const chart of this.charts) chart.destroy();
    this.charts = [];
    this.empty.hidden = this.gpus.length > 0;
    if (!this.gpus.length) return;
    this.charts = [
      new window.uPlot(this.options("percent"), this.data(this.util), this.utilTarget),
      new window.uPlot(this.options("memory"), this.data(this.memory), this.memoryTarget),
    ];
  }

  schedule() {
    if (!this.frame) this.frame = window.requestAnimationFrame(() => this.draw());
  }

  draw() {
    this.frame = 0;
    if (this.charts.length !== 2) return;
    this.charts[0].setData(this.data(this.util));
    this.charts[1].setData(this.data(this.memory));
    // Away from the pointer, the legends read the latest values.
    const latest = this.xs.length - 1;
    for (const chart of this.charts) {
      if (latest >= 0 && !(chart.cursor.left >= 0)) chart.setLegend({ idx: latest });
    }
  }

  width() {
    return Math.max(this.root.clientWidth, 240);
  }

  resize() {
    for (const chart of this.charts) chart.setSize({ width: this.width(), height: HEIGHT });
  }
}

for (const root of document.querySelectorAll("[data-gpu-chart]")) new GpuChart(root);
