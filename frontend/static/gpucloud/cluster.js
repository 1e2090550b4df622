// The operators' cluster heatmap: one cell per GPU, grouped by pool then node, coloured by utilization.
//
// The grid is server-rendered from the database (`<div data-heatmap data-ws="/ws/cluster/">`);
// this keeps it current from the socket: `cluster` (the nodes, their states and GPUs: nodes that
// appeared are added, gone ones removed) and `utilization` (per reporting node, one value per GPU
// in index order). A cell's colour is its `--u` custom property (0-100), so an update is one
// style write per cell; its tooltip is written when the pointer reaches it.

import { LiveSocket, pageData } from "./live.js";

const root = document.querySelector("[data-heatmap]");

/** Return the cells of each node by name, in GPU index order (the order `utilization` lists). */
function cellsByNode() {
  const nodes = new Map();
  for (const node of root.querySelectorAll("[data-node]")) {
    const cells = [...node.querySelectorAll("[data-gpu]")];
    cells.sort((a, b) => Number(a.dataset.index) - Number(b.dataset.index));
    nodes.set(node.dataset.node, cells);
  }
  return nodes;
}

let nodes = cellsByNode();
let updates = 0;
const stateLabels = pageData("node-state-labels", {});

function setUtilization(cell, value) {
  if (value == null) {
    cell.style.removeProperty("--u");
    cell.classList.add("hm-none");
    delete cell.dataset.util;
  } else {
    cell.style.setProperty("--u", String(Math.round(value)));
    cell.classList.remove("hm-none");
    cell.dataset.util = String(Math.round(value));
  }
}

function utilization(message) {
  for (const [name, values] of Object.entries(message.nodes)) {
    const cells = nodes.get(name);
    if (!cells) continue;
    values.forEach((value, i) => cells[i] && setUtilization(cells[i], value));
  }
  updates += 1;
  root.dataset.updates = String(updates);
}

function cell(gpu, node) {
  const element = document.createElement("span");
  element.className = "hm-cell hm-none";
  element.dataset.gpu = gpu.uuid;
  element.dataset.index = gpu.index;
  element.dataset.model = gpu.model;
  element.dataset.nodeName = node.name;
  return element;
}

function nodeBlock(node) {
  const block = document.createElement("div");
  block.className = "hm-node";
  block.dataset.node = node.name;
  const title = document.createElement("div");
  title.className = "hm-node-name";
  const link = document.createElement("a");
  link.href = `${root.dataset.nodeBase}${encodeURIComponent(node.name)}/`;
  link.textContent = node.name;
  const state = document.createElement("span");
  state.dataset.nodeState = "";
  title.append(link, " ", state);
  const gpus = document.createElement("div");
  gpus.className = "hm-gpus";
  gpus.append(...node.gpus.map((gpu) => cell(gpu, node)));
  block.append(title, gpus);
  return block;
}

function poolSection(name) {
  let section = root.querySelector(`[data-pool="${CSS.escape(name)}"]`);
  if (section) return section;
  section = document.createElement("section");
  section.className = "hm-pool";
  section.dataset.pool = name;
  const heading = document.createElement("h3");
  heading.textContent = name;
  const grid = document.createElement("div");
  grid.className = "hm-nodes";
  section.append(heading, grid);
  root.querySelector("[data-heatmap-pools]").append(section);
  return section;
}

function setState(block, state) {
  const badge = block.querySelector("[data-node-state]");
  badge.className = `state state-${state}`;
  badge.textContent = stateLabels[state] ?? state;
  block.dataset.state = state;
}

// Brings the grid in line with the nodes the server has now; utilizations already shown stay.
function cluster(message) {
  const seen = new Set();
  for (const node of message.nodes) {
    seen.add(node.name);
    let block = root.querySelector(`[data-node="${CSS.escape(node.name)}"]`);
    const uuids = node.gpus.map((gpu) => gpu.uuid).join(" ");
    const drawn = block && [...block.querySelectorAll("[data-gpu]")].map((c) => c.dataset.gpu).join(" ");
    if (!block || drawn !== uuids || block.closest("[data-pool]").dataset.pool !== node.pool) {
      block?.remove();
      block = nodeBlock(node);
      poolSection(node.pool).querySelector(".hm-nodes").append(block);
    }
    setState(block, node.state);
  }
  for (const block of root.querySelectorAll("[data-node]")) {
    if (!seen.has(block.dataset.node)) block.remove();
  }
  for (const section of root.querySelectorAll("[data-pool]")) {
    if (!section.querySelector("[data-node]")) section.remove();
  }
  nodes = cellsByNode();
  root.querySelector("[data-heatmap-empty]").hidden = nodes.size > 0;
  root.dataset.synced = "true";
}

root.addEventListener("mouseover", (event) => {
  const target = event.target.closest("[data-gpu]");
  if (!target) return;
  const node = target.closest("[data-node]").dataset.node;
  const util = target.dataset.util === undefined ? "no sample" : `${target.dataset.util}% utilization`;
  target.title = `${node} · GPU ${target.dataset.index} · ${target.dataset.model} · ${util}`;
});

new LiveSocket({
  path: root.dataset.ws,
  onmessage: (message) => {
    if (message.type === "cluster") cluster(message);
    else if (message.type === "utilization") utilization(message);
  },
  badge: root.querySelector("[data-live-badge]"),
});
