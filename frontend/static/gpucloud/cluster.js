// The operators' cluster heatmap: one cell per GPU, grouped by pool then node (or by the tenant
// holding it), coloured by utilization and marked with the workload that holds it.
//
// The grid is server-rendered from the database (`<div data-heatmap data-ws="/ws/cluster/">`);
// this keeps it current from the socket:
// - `cluster`: the nodes, their states and GPUs (nodes that appeared are added, gone ones removed);
// - `utilization`: per reporting node, one value per GPU in index order (the order of its cells);
// - `holders`: per node whose holders changed, one workload id (or null) per GPU, and those workloads.
// A model per node (its cells, values, holders, idle marks) mirrors the grid, so an update is one pass
// over arrays that writes a cell only where its value or its idle mark changed: no cell is rebuilt
// and nothing is read back from the DOM. Cells out of view are written when they come into view
// (an IntersectionObserver), so an update costs what is on screen, not the fleet. Tooltips are
// written when the pointer reaches a cell.

import { LiveSocket, pageData } from "./live.js";

const root = document.querySelector("[data-heatmap]");
const poolsView = root.querySelector("[data-heatmap-pools]");
const tenantsView = root.querySelector("[data-heatmap-tenants]");
const detail = root.querySelector("[data-heatmap-detail]");
const stateLabels = pageData("node-state-labels", {});
const workloads = new Map(Object.entries(pageData("heatmap-holders", {})));
const IDLE_BELOW = Number(root.dataset.idleBelow);
const ZOOM_KEY = "gpucloud.heatmap.cell";
let nodes = readNodes();
let grouping = "pool";
let updates = 0;

/** Return the model of each node drawn in the pool view, by name: its block and per GPU cell, value, holder. */
function readNodes() {
  const found = new Map();
  for (const block of poolsView.querySelectorAll(".hm-node[data-node]")) {
    const cells = [...block.querySelectorAll("[data-gpu]")];
    const shown = cells.map((cell) => cell.dataset.util);
    found.set(block.dataset.node, {
      name: block.dataset.node,
      block,
      cells,
      shown,
      util: shown.map((value) => (value === "" ? null : Number(value))),
      holder: cells.map((cell) => cell.dataset.w ?? null),
      idle: cells.map((cell) => cell.classList.contains("hm-idle")),
      visible: 0, // blocks of the node in view (its own, or its tenant-view parts)
      stale: false, // the model changed while no block was in view
    });
  }
  return found;
}

let seen = new WeakSet();
const inView = new IntersectionObserver(
  (entries) => {
    for (const entry of entries) {
      const node = nodes.get(entry.target.dataset.node ?? entry.target.dataset.nodeRef);
      if (!node || entry.isIntersecting === seen.has(entry.target)) continue;
      if (entry.isIntersecting) seen.add(entry.target);
      else seen.delete(entry.target);
      node.visible += entry.isIntersecting ? 1 : -1;
      if (node.visible > 0 && node.stale) paintNode(node);
    }
  },
  { rootMargin: "300px 0px" },
);

// (Re)observe the blocks of the layout shown; the observer reports each one's state afresh.
function watch() {
  inView.disconnect();
  seen = new WeakSet();
  for (const node of nodes.values()) node.visible = 0;
  for (const block of root.querySelectorAll(".hm-node[data-node], .hm-node[data-node-ref]")) inView.observe(block);
}

function paintNode(node) {
  node.stale = false;
  for (let i = 0; i < node.cells.length; i++) paint(node, i);
}

function isIdle(holder, value) {
  return holder != null && workloads.get(holder)?.state === "running" && value != null && value < IDLE_BELOW;
}

// Write cell `i` of `node` from the model, touching the DOM only where something changed.
function paint(node, i) {
  const cell = node.cells[i];
  const value = node.util[i];
  const shown = value == null ? "" : String(Math.round(value));
  if (node.shown[i] !== shown) {
    node.shown[i] = shown;
    cell.dataset.util = shown;
    if (shown === "") {
      cell.style.removeProperty("--u");
      cell.classList.add("hm-none");
    } else {
      cell.style.setProperty("--u", shown);
      cell.classList.remove("hm-none");
    }
  }
  const idle = isIdle(node.holder[i], value);
  if (node.idle[i] !== idle) {
    node.idle[i] = idle;
    cell.classList.toggle("hm-idle", idle);
  }
}

function utilization(message) {
  for (const name in message.nodes) {
    const node = nodes.get(name);
    if (!node) continue;
    const values = message.nodes[name];
    const count = Math.min(values.length, node.cells.length);
    for (let i = 0; i < count; i++) node.util[i] = values[i];
    if (node.visible > 0) paintNode(node);
    else node.stale = true;
  }
  showTotals();
  updates += 1;
  root.dataset.updates = String(updates);
}

function holders(message) {
  let restated = false;
  for (const [id, workload] of Object.entries(message.workloads)) {
    restated ||= workloads.has(id) && workloads.get(id).state !== workload.state;
    workloads.set(id, workload);
  }
  let moved = false;
  for (const [name, ids] of Object.entries(message.nodes)) {
    const node = nodes.get(name);
    if (!node) continue;
    ids.forEach((id, i) => {
      const holder = id == null ? null : String(id);
      if (i >= node.cells.length || node.holder[i] === holder) return;
      node.holder[i] = holder;
      const cell = node.cells[i];
      if (holder == null) delete cell.dataset.w;
      else cell.dataset.w = holder;
      cell.classList.toggle("hm-held", holder != null);
      node.stale = true;
      moved = true;
    });
  }
  for (const node of nodes.values()) {
    // A holder that started running (or stopped) may make its GPUs idle, or no longer.
    if (restated) node.stale = true;
    if (node.stale && node.visible > 0) paintNode(node);
  }
  if (moved && grouping === "tenant") regroup();
  showTotals();
}

const totalsShown = {};
function showTotals() {
  let gpus = 0;
  let held = 0;
  let idle = 0;
  let sum = 0;
  let sampled = 0;
  for (const node of nodes.values()) {
    for (let i = 0; i < node.cells.length; i++) {
      gpus += 1;
      if (node.holder[i] != null) held += 1;
      if (isIdle(node.holder[i], node.util[i])) idle += 1;
      if (node.util[i] != null) {
        sum += node.util[i];
        sampled += 1;
      }
    }
  }
  const figures = { gpus, held, idle, average: sampled ? `${Math.round(sum / sampled)}%` : "—" };
  for (const [name, value] of Object.entries(figures)) {
    if (totalsShown[name] === String(value)) continue;
    totalsShown[name] = String(value);
    root.querySelector(`[data-total="${name}"]`).textContent = String(value);
  }
}

// --- the layout: nodes that appear or go ---------------------------------------------------------

function cell(gpu) {
  const element = document.createElement("i");
  element.className = "hm-cell hm-none";
  element.dataset.gpu = gpu.uuid;
  element.dataset.util = "";
  element.title = `GPU ${gpu.index} · ${gpu.model} · no recent sample`;
  return element;
}

function nodeLink(name) {
  const link = document.createElement("a");
  link.href = `${root.dataset.nodeBase}${encodeURIComponent(name)}/`;
  link.textContent = name;
  return link;
}

function simBadge() {
  const badge = document.createElement("span");
  badge.className = "badge badge-sim";
  badge.dataset.nodeSim = "";
  badge.title = "A simulated node: no agent, no real GPUs";
  badge.textContent = "sim";
  return badge;
}

function nodeBlock(node) {
  const block = document.createElement("div");
  block.className = "hm-node";
  block.dataset.node = node.name;
  const title = document.createElement("div");
  title.className = "hm-node-name";
  const state = document.createElement("span");
  state.dataset.nodeState = "";
  title.append(nodeLink(node.name), " ", state);
  const gpus = document.createElement("div");
  gpus.className = "hm-gpus";
  gpus.append(...[...node.gpus].sort((a, b) => a.index - b.index).map(cell));
  block.append(title, gpus);
  return block;
}

function poolSection(name) {
  let section = poolsView.querySelector(`[data-pool="${CSS.escape(name)}"]`);
  if (section) return section;
  section = document.createElement("section");
  section.className = "hm-pool";
  section.dataset.pool = name;
  const heading = document.createElement("h3");
  heading.textContent = name;
  const grid = document.createElement("div");
  grid.className = "hm-nodes";
  section.append(heading, grid);
  poolsView.append(section);
  return section;
}

function setState(block, node) {
  const badge = block.querySelector("[data-node-state]");
  badge.className = `state state-${node.state}`;
  badge.textContent = stateLabels[node.state] ?? node.state;
  block.dataset.state = node.state;
  const sim = block.querySelector("[data-node-sim]");
  if (node.simulated && !sim) badge.after(" ", simBadge());
  if (!node.simulated && sim) sim.remove();
  block.toggleAttribute("data-sim", Boolean(node.simulated));
}

// Brings the grid in line with the nodes the server has now; values and holders already shown stay.
function cluster(message) {
  if (grouping === "tenant") sendHome();
  const seen = new Set();
  for (const node of message.nodes) {
    seen.add(node.name);
    let block = poolsView.querySelector(`[data-node="${CSS.escape(node.name)}"]`);
    const uuids = [...node.gpus].sort((a, b) => a.index - b.index).map((gpu) => gpu.uuid).join(" ");
    const drawn = block && [...block.querySelectorAll("[data-gpu]")].map((c) => c.dataset.gpu).join(" ");
    if (!block || drawn !== uuids || block.closest("[data-pool]").dataset.pool !== node.pool) {
      block?.remove();
      block = nodeBlock(node);
      poolSection(node.pool).querySelector(".hm-nodes").append(block);
    }
    setState(block, node);
  }
  for (const block of poolsView.querySelectorAll("[data-node]")) {
    if (!seen.has(block.dataset.node)) block.remove();
  }
  for (const section of poolsView.querySelectorAll("[data-pool]")) {
    if (!section.querySelector("[data-node]")) section.remove();
  }
  nodes = readNodes();
  if (grouping === "tenant") regroup();
  else watch();
  showTotals();
  root.querySelector("[data-heatmap-empty]").hidden = nodes.size > 0;
  root.querySelector("[data-heatmap-controls]").hidden = nodes.size === 0;
watch();
  root.dataset.synced = "true";
}

// --- grouping by tenant: the same cells, moved (never copied) into one section per tenant -------------

// Put every cell back into its node's block, in index order.
function sendHome() {
  for (const node of nodes.values()) node.block.querySelector(".hm-gpus").append(...node.cells);
}

function tenantOf(holder) {
  return holder == null ? null : (workloads.get(holder)?.tenant ?? "?");
}

// Lay the cells out by tenant, then pool and node: one section per tenant holding GPUs, free ones last.
function regroup() {
  sendHome();
  const groups = new Map();
  for (const node of nodes.values()) {
    node.cells.forEach((element, i) => {
      const tenant = tenantOf(node.holder[i]);
      if (!groups.has(tenant)) groups.set(tenant, new Map());
      const byNode = groups.get(tenant);
      if (!byNode.has(node)) byNode.set(node, []);
      byNode.get(node).push(element);
    });
  }
  const order = [...groups.keys()].sort((a, b) => (a == null) - (b == null) || String(a).localeCompare(String(b)));
  tenantsView.replaceChildren(...order.map((tenant) => tenantSection(tenant, groups.get(tenant))));
  watch();
}

function tenantSection(tenant, byNode) {
  const section = document.createElement("section");
  section.className = "hm-pool";
  section.dataset.tenant = tenant ?? "";
  const heading = document.createElement("h3");
  const count = [...byNode.values()].reduce((sum, cells) => sum + cells.length, 0);
  heading.textContent = tenant ?? "Not allocated";
  const small = document.createElement("small");
  small.className = "muted";
  small.textContent = ` ${count} GPU${count === 1 ? "" : "s"} on ${byNode.size} node${byNode.size === 1 ? "" : "s"}`;
  heading.append(small);
  const grid = document.createElement("div");
  grid.className = "hm-nodes";
  for (const [node, cells] of byNode) {
    const block = document.createElement("div");
    block.className = "hm-node";
    block.dataset.nodeRef = node.name;
    const title = document.createElement("div");
    title.className = "hm-node-name";
    title.append(nodeLink(node.name));
    if (node.block.hasAttribute("data-sim")) title.append(" ", simBadge());
    const gpus = document.createElement("div");
    gpus.className = "hm-gpus";
    gpus.append(...cells);
    block.append(title, gpus);
    grid.append(block);
  }
  section.append(heading, grid);
  return section;
}

function setGrouping(value) {
  grouping = value;
  if (grouping === "tenant") regroup();
  else {
    sendHome();
    tenantsView.replaceChildren();
  }
  poolsView.hidden = grouping === "tenant";
  tenantsView.hidden = grouping !== "tenant";
  watch();
}

// --- what a GPU is: its tooltip and the detail panel ------------------------------------------------

function locate(target) {
  const block = target.closest("[data-node], [data-node-ref]");
  const node = block && nodes.get(block.dataset.node ?? block.dataset.nodeRef);
  const i = node ? node.cells.indexOf(target) : -1;
  return i < 0 ? null : { node, i };
}

function workloadUrl(holder, workload) {
  return root.dataset.workloadUrl.replace("__tenant__", encodeURIComponent(workload.tenant)).replace(/\/0\/$/, `/${holder}/`);
}

/** Return what is known of cell `i` of `node`: [GPU and model, reading, holder or "free", idle?, simulated?]. */
function describe(node, i) {
  const cell = node.cells[i];
  cell.dataset.label ??= cell.title.split(" · ").slice(0, 2).join(" · ");
  const value = node.util[i];
  const holder = node.holder[i];
  const workload = holder == null ? null : workloads.get(holder);
  return {
    gpu: `${node.name} · ${cell.dataset.label}`,
    reading: value == null ? "no recent sample" : `${Math.round(value)}% utilization`,
    holder: workload ? `${workload.tenant} / ${workload.project} / ${workload.name} (${workload.state}, ${workload.owner})` : "free",
    workload,
    idle: isIdle(holder, value),
    simulated: node.block.hasAttribute("data-sim"),
  };
}

root.addEventListener("mouseover", (event) => {
  const target = event.target.closest("[data-gpu]");
  const found = target && locate(target);
  if (!found) return;
  const about = describe(found.node, found.i);
  const notes = [about.idle && "allocated but idle", about.simulated && "simulated node"].filter(Boolean);
  target.title = [about.gpu, about.reading, about.holder, ...notes].join(" · ");
});

function showDetail(node, i) {
  const about = describe(node, i);
  root.querySelector(".hm-cell[data-selected]")?.removeAttribute("data-selected");
  node.cells[i].dataset.selected = "";
  const line = (text) => Object.assign(document.createElement("p"), { textContent: text });
  const heading = line(`${about.gpu} · ${about.reading}`);
  heading.className = "hm-detail-title";
  if (about.simulated) heading.append(" ", simBadge());
  const links = document.createElement("p");
  const toNode = nodeLink(node.name);
  toNode.textContent = `Open node ${node.name}`;
  toNode.setAttribute("role", "button");
  toNode.className = "outline small";
  links.append(toNode);
  if (about.workload) {
    const toWorkload = document.createElement("a");
    toWorkload.href = workloadUrl(node.holder[i], about.workload);
    toWorkload.textContent = `Open workload ${about.workload.name}`;
    toWorkload.setAttribute("role", "button");
    toWorkload.className = "small";
    links.append(" ", toWorkload);
  }
  const held = line(about.workload ? `Held by ${about.holder}` : "Free: no workload holds it.");
  if (about.idle) held.append(" ", Object.assign(document.createElement("span"), { className: "badge badge-warn", textContent: "allocated but idle" }));
  const close = Object.assign(document.createElement("button"), { type: "button", textContent: "Close" });
  close.className = "secondary outline small";
  close.addEventListener("click", () => {
    detail.hidden = true;
    node.cells[i].removeAttribute("data-selected");
  });
  links.append(" ", close);
  detail.replaceChildren(heading, held, links);
  detail.hidden = false;
}

root.addEventListener("click", (event) => {
  const target = event.target.closest("[data-gpu]");
  const found = target && locate(target);
  if (found) showDetail(found.node, found.i);
});

// --- controls: grouping, cell size, only idle -----------------------------------------------------

function setZoom(px) {
  root.style.setProperty("--hm-cell", `${px}px`);
  root.dataset.zoom = px >= 24 ? "text" : px <= 8 ? "dense" : "";
  root.querySelector("[data-heatmap-zoom-value]").textContent = `${px} px`;
}

const zoom = root.querySelector("[data-heatmap-zoom]");
zoom.value = window.localStorage?.getItem(ZOOM_KEY) ?? zoom.value;
setZoom(Number(zoom.value));
zoom.addEventListener("input", () => {
  setZoom(Number(zoom.value));
  window.localStorage?.setItem(ZOOM_KEY, zoom.value);
});
root.querySelector("[data-heatmap-group]").addEventListener("change", (event) => setGrouping(event.target.value));
root.querySelector("[data-heatmap-only-idle]").addEventListener("change", (event) => {
  root.toggleAttribute("data-only-idle", event.target.checked);
});
root.querySelector("[data-heatmap-controls]").hidden = nodes.size === 0;
watch();

new LiveSocket({
  path: root.dataset.ws,
  onmessage: (message) => {
    if (message.type === "cluster") cluster(message);
    else if (message.type === "utilization") utilization(message);
    else if (message.type === "holders") holders(message);
  },
  badge: root.querySelector("[data-live-badge]"),
});
