// In-place updates of the workloads list and the queue from `/ws/t/<tenant>/events/`.
//
// `<div data-live-rows="workloads|queue" data-ws="...">` wraps the page's tables. A row is
// `<tr data-workload=id data-pool=name>`; its cells are found by column (COLUMNS). An event names a workload's
// id, state, reason and queue position: its row's badge, reason and position change where it is;
// on the queue a workload moves between "waiting" and "scheduled and running", and leaves once it
// ended. A workload the page does not show yet is counted in a "new workloads — show" notice
// rather than inserted (the server decides where it belongs: its page, its filters).
//
// The server-rendered page works without any of this.

import { LiveSocket, pageData } from "./live.js";

// Mirrors jobs/choices.py: the queue shows waiting and active work only.
const WAITING = new Set(["pending"]);
const ACTIVE = new Set(["scheduled", "starting", "running"]);
const REASON_CHARS = 140;
// Column of each cell this script reads or writes, per table (the templates' column order).
const COLUMNS = {
  workloads: { state: 4 },
  waiting: { pool: 0, position: 1, name: 2, project: 3, owner: 4, gpus: 5, why: 6, start: 7 },
  active: { name: 0, project: 1, owner: 2, state: 3, where: 4 },
};

const root = document.querySelector("[data-live-rows]");
const kind = root.dataset.liveRows;
const labels = pageData("workload-state-labels", {});
const reasonLabels = pageData("workload-reason-labels", {});
const newIds = new Set();
const firstRendered = Math.max(0, ...[...root.querySelectorAll("tr[data-workload]")].map((r) => Number(r.dataset.workload)));

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function truncated(text) {
  return text.length > REASON_CHARS ? `${text.slice(0, REASON_CHARS - 1)}…` : text;
}

function badge(state) {
  return element("span", `state wstate-${state}`, labels[state] ?? state);
}

/** Return a reason code as the templates' `reason` filter draws it: its words, the code in the title. */
function reasonLabel(code) {
  const words = element("span", "reason-code", reasonLabels[code] ?? code);
  words.title = code;
  words.dataset.reasonCode = code;
  const strong = element("strong");
  strong.append(words);
  return strong;
}

function reasonNodes(event, className) {
  const reason = element("small", className);
  reason.append(reasonLabel(event.reason_code), ": ", truncated(event.reason ?? ""));
  return reason;
}

/** Return the nodes of frontend/_workload_state.html for `event` (`pool` names the row's pool). */
function stateNodes(event, pool) {
  const nodes = [badge(event.state)];
  if (event.state === "pending") {
    if (event.queue_position) nodes.push(" ", element("small", "muted", `#${event.queue_position} in ${pool}`));
    nodes.push(element("br"));
    if (event.reason_code) nodes.push(reasonNodes(event, "reason"));
    else nodes.push(element("small", "reason muted", "not looked at yet"));
  } else if (event.reason_code && event.state !== "running") {
    nodes.push(element("br"), reasonNodes(event, "muted reason"));
  }
  return nodes;
}

function cellOf(row, name) {
  return row.cells[COLUMNS[row.closest("table").id][name]];
}

function setCell(row, name, nodes) {
  cellOf(row, name).replaceChildren(...nodes);
}

function markChanged(row, event) {
  row.dataset.state = event.state;
  row.dataset.updatedAt = event.updated_at ?? "";
}

function rowOf(id) {
  return root.querySelector(`tr[data-workload="${CSS.escape(String(id))}"]`);
}

function showNew() {
  const notice = root.querySelector("[data-new-workloads]");
  notice.hidden = newIds.size === 0;
  notice.querySelector("[data-new-count]").textContent =
    `${newIds.size} new workload${newIds.size === 1 ? "" : "s"}`;
}

// --- the workloads list --------------------------------------------------------------------------

function listMatches(event) {
  const { filterState, filterKind, firstPage } = root.dataset;
  return firstPage === "true" && (!filterState || filterState === event.state) && (!filterKind || filterKind === event.kind);
}

function updateListRow(event) {
  const row = rowOf(event.id);
  if (!row) {
    if (event.id > firstRendered && listMatches(event)) newIds.add(event.id);
    return;
  }
  setCell(row, "state", stateNodes(event, row.dataset.pool));
  markChanged(row, event);
}

// --- the queue -----------------------------------------------------------------------------------

function emptyRow(table) {
  return table.querySelector("tr[data-empty]");
}

function syncEmpty(table) {
  const empty = emptyRow(table);
  if (empty) empty.hidden = table.querySelector("tr[data-workload]") !== null;
}

function waitingCells(row, event) {
  const position = event.queue_position ? String(event.queue_position) : "—";
  setCell(row, "position", [position]);
  if (event.reason_code !== row.dataset.reasonCode) {
    row.dataset.reasonCode = event.reason_code ?? "";
    const why = event.reason_code
      ? [reasonLabel(event.reason_code), ": ", event.reason ?? ""]
      : [element("span", "muted", "not looked at yet")];
    setCell(row, "why", why);
  }
  row.dataset.position = String(event.queue_position ?? "");
}

// A row carries its name, project, owner and GPUs from one table to the other; the other cells are new.
function movedRow(row, event, to) {
  const moved = element("tr");
  Object.assign(moved.dataset, { workload: row.dataset.workload, pool: row.dataset.pool, gpus: row.dataset.gpus });
  const cells = Object.keys(COLUMNS[to.id]).map(() => moved.insertCell());
  const fill = (name, nodes) => cells[COLUMNS[to.id][name]].append(...nodes);
  for (const name of ["name", "project", "owner"]) {
    fill(name, [...cellOf(row, name).childNodes].map((node) => node.cloneNode(true)));
  }
  to.tBodies[0].append(moved);
  if (to.id === "waiting") {
    fill("pool", [element("code", "", row.dataset.pool)]);
    fill("gpus", [row.dataset.gpus]);
    waitingCells(moved, event);
  } else {
    fill("state", [badge(event.state)]);
    fill("where", [element("small", "muted", "placed: reload to see where")]);
  }
  return moved;
}

function sortWaiting(table) {
  const body = table.tBodies[0];
  const rows = [...body.querySelectorAll("tr[data-workload]")];
  const position = (row) => Number(row.dataset.position) || Number.MAX_SAFE_INTEGER;
  rows.sort((a, b) => a.dataset.pool.localeCompare(b.dataset.pool) || position(a) - position(b));
  body.append(...rows);
}

function updateQueueRow(event) {
  const waiting = root.querySelector("#waiting");
  const active = root.querySelector("#active");
  let row = rowOf(event.id);
  const wantIn = WAITING.has(event.state) ? waiting : ACTIVE.has(event.state) ? active : null;
  if (!row) {
    if (wantIn) newIds.add(event.id);
    return;
  }
  const table = row.closest("table");
  if (wantIn === null) {
    row.remove();
  } else if (table !== wantIn) {
    const moved = movedRow(row, event, wantIn);
    row.remove();
    row = moved;
  } else if (wantIn === waiting) {
    waitingCells(row, event);
  } else {
    setCell(row, "state", [badge(event.state)]);
  }
  if (row.isConnected) markChanged(row, event);
  sortWaiting(waiting);
  syncEmpty(waiting);
  syncEmpty(active);
}

// --- messages ------------------------------------------------------------------------------------

const update = kind === "queue" ? updateQueueRow : updateListRow;

function snapshot(rows) {
  const current = new Set(rows.map((row) => String(row.id)));
  rows.forEach(update);
  // On the queue, a row the snapshot lacks ended while nothing listened.
  if (kind === "queue") {
    for (const row of root.querySelectorAll("tr[data-workload]")) {
      if (!current.has(row.dataset.workload)) update({ id: Number(row.dataset.workload), state: "ended" });
    }
  }
}

new LiveSocket({
  path: root.dataset.ws,
  onmessage: (message) => {
    if (message.type === "snapshot") {
      snapshot(message.workloads);
      root.dataset.synced = "true";
    }
    else if (message.type === "workload") update(message);
    showNew();
  },
  badge: root.querySelector("[data-live-badge]"),
});
