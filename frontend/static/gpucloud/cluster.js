// The operators' cluster heatmap: one cell per GPU, grouped by pool then node, coloured by utilization.
//
// The grid is server-rendered from the database (`<div data-heatmap data-ws="/ws/cluster/">`);
// this keeps it current from the socket: `cluster` (the nodes, their states and GPUs: nodes that
// appeared are added, gone ones removed) and `utilization` (per reporting node, one value per GPU
// in index order, the order of a node's cells). A cell's colour is its `--u` custom property
// (0-100): an update writes a cell only when its value changed, and its tooltip when the pointer
// reaches it, so a fleet of 8,000 GPUs costs little per second.

import { LiveSocket, pageData } from "./live.js";

const root = document.querySelector("[data-heatmap]");
const stateLabels = pageData("node-state-labels", {});
let nodes = cellsByNode();
let updates = 0;

/** Return each node's cells by node name, in GPU index order. */
function cellsByNode() {
  const found = new Map();
  for (const node of root.querySelectorAll("[data-node]")) found.set(node.dataset.node, [...node.querySelectorAll("[data-gpu]")]);
  return found;
}

function setUtilization(cell, value) {
  const shown = value == null ? "" : String(Math.round(value));
  if (cell.dataset.util === shown) return;
  cell.dataset.util = shown;
  if (shown === "") {
    cell.style.removeProperty("--u");
    cell.classList.add("hm-none");
  } else {
    cell.style.setProperty("--u", shown);
    cell.classList.remove("hm-none");
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

function cell(gpu) {
  const element = document.createElement("i");
  element.className = "hm-cell hm-none";
  element.dataset.gpu = gpu.uuid;
  element.dataset.util = "";
  element.title = `GPU ${gpu.index} · ${gpu.model} · no recent sample`;
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
  gpus.append(...[...node.gpus].sort((a, b) => a.index - b.index).map(cell));
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
    const uuids = [...node.gpus].sort((a, b) => a.index - b.index).map((gpu) => gpu.uuid).join(" ");
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

// The tooltip's last part is the reading: rewritten from the cell's current value.
root.addEventListener("mouseover", (event) => {
  const target = event.target.closest("[data-gpu]");
  if (!target) return;
  const reading = target.dataset.util === "" ? "no recent sample" : `${target.dataset.util}% utilization`;
  target.title = `${target.title.slice(0, target.title.lastIndexOf(" · "))} · ${reading}`;
});

new LiveSocket({
  path: root.dataset.ws,
  onmessage: (message) => {
    if (message.type === "cluster") cluster(message);
    else if (message.type === "utilization") utilization(message);
  },
  badge: root.querySelector("[data-live-badge]"),
});
