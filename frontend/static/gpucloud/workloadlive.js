// The workload page stays current: `<div data-workload-live data-ws=... data-workload=id data-fragment=url>`.
//
// It listens on its tenant's events stream (`/ws/t/<tenant>/events/?project=<slug>`), which sends a row
// whenever a workload's state, reason, queue position, launch steps or GPUs change. For a row of this
// workload (and for each snapshot, so a reconnection catches up on what it missed) it fetches the
// page's live parts again (`?part=live`) and swaps each `[data-live-part]` element for the new one
// of the same id: state, reasons, launch steps, actions, times, GPUs, replicas and timeline come from
// the same templates as the first render, so nothing is drawn twice in two languages.
//
// Between changes the relative times ("3 minutes ago") and the current step's "for 12 s" tick here.
//
// A notebook launched from the Launch page opens JupyterLab by itself once it is ready (seen live,
// never on a later visit): in a new tab like the button, or here where the browser blocks tabs not
// opened by a click.
//
// Without JavaScript the page shows what the server rendered.

import { LiveSocket } from "./live.js";

const root = document.querySelector("[data-workload-live]");
const workloadId = Number(root.dataset.workload);
const autoOpenKey = `gpucloud.open-lab.${workloadId}`;
const REFRESH_DELAY_MS = 100;
const TICK_MS = 1000;

let timer = 0;
let fetching = false;
let again = false;

function head() {
  return document.getElementById("workload-head");
}

/** Ask for the live parts soon; changes that come together (a pass, a start) cost one request. */
function scheduleRefresh() {
  if (timer) return;
  timer = window.setTimeout(refresh, REFRESH_DELAY_MS);
}

async function refresh() {
  timer = 0;
  if (fetching) {
    again = true;
    return;
  }
  fetching = true;
  const wasReady = labLink() !== null;
  try {
    const response = await fetch(root.dataset.fragment, { headers: { Accept: "text/html" }, credentials: "same-origin" });
    if (response.ok) swap(await response.text());
  } catch {
    // The next change or reconnection fetches again.
  } finally {
    fetching = false;
  }
  root.dataset.refreshed = String(Number(root.dataset.refreshed || 0) + 1);
  if (!wasReady && labLink() !== null) openLabIfLaunchedHere();
  if (again) {
    again = false;
    scheduleRefresh();
  }
}

function swap(html) {
  const incoming = document.createElement("template");
  incoming.innerHTML = html;
  for (const part of incoming.content.querySelectorAll("[data-live-part][id]")) {
    const current = document.getElementById(part.id);
    if (current) current.replaceWith(document.importNode(part, true));
  }
  tick();
  document.dispatchEvent(new CustomEvent("gpucloud:workload-refreshed", { detail: { id: workloadId } }));
}

function labLink() {
  return document.querySelector("#open-notebook[data-open-lab][href]");
}

// --- opening JupyterLab once, for the person who launched it ------------------------------------------

/** True only on the first load after the Launch form: a reload or Back keeps the referrer, so it must not count. */
function arrivedFromLaunch() {
  const [navigation] = performance.getEntriesByType("navigation");
  if (navigation?.type !== "navigate") return false;
  try {
    return document.referrer !== "" && new URL(document.referrer).pathname === root.dataset.launchPath;
  } catch {
    return false;
  }
}

const STARTING_STATES = new Set(["pending", "scheduled", "starting"]);

function rememberLaunch() {
  const state = head()?.dataset;
  if (state?.kind === "notebook" && STARTING_STATES.has(state.state) && labLink() === null && arrivedFromLaunch()) {
    window.sessionStorage.setItem(autoOpenKey, "1");
  }
}

function openLabIfLaunchedHere() {
  if (window.sessionStorage.getItem(autoOpenKey) !== "1") return;
  window.sessionStorage.removeItem(autoOpenKey);
  const href = labLink().href;
  root.dataset.openedLab = href;
  const tab = window.open(href, "_blank");
  if (tab) tab.opener = null;
  else window.location.assign(href); // the browser blocks tabs that no click opened: open it here instead
}

// --- relative times ----------------------------------------------------------------------------------

const UNITS = [
  ["year", 365 * 24 * 3600],
  ["month", 30 * 24 * 3600],
  ["week", 7 * 24 * 3600],
  ["day", 24 * 3600],
  ["hour", 3600],
  ["minute", 60],
];

/** Return `seconds` as Django's `timesince` words: at most two adjacent units, "3 minutes", "1 hour, 5 minutes". */
function since(seconds) {
  const at = UNITS.findIndex(([, size]) => seconds >= size);
  if (at < 0) return `${Math.max(0, Math.floor(seconds))}\u00a0seconds`;
  const words = [];
  for (const [name, size] of UNITS.slice(at, at + 2)) {
    const count = Math.floor(seconds / size);
    if (count === 0) break;
    words.push(`${count}\u00a0${name}${count === 1 ? "" : "s"}`);
    seconds -= count * size;
  }
  return words.join(", ");
}

function tick() {
  const now = Date.now();
  for (const time of root.querySelectorAll("[data-live-part] time[datetime]:not([data-fixed])")) {
    if (time.closest("#launch-steps")) continue; // the steps show clock times
    const seconds = (now - Date.parse(time.dateTime)) / 1000;
    time.textContent = seconds < 60 ? "just now" : `${since(seconds)} ago`;
  }
  for (const elapsed of root.querySelectorAll("[data-elapsed-since]")) {
    elapsed.textContent = `for ${since((now - Date.parse(elapsed.dataset.elapsedSince)) / 1000)}`;
  }
}

// --- the stream ----------------------------------------------------------------------------------------

rememberLaunch();
window.setInterval(tick, TICK_MS);
new LiveSocket({
  path: root.dataset.ws,
  onmessage: (message) => {
    if (message.type === "snapshot") {
      root.dataset.synced = "true";
      scheduleRefresh();
    }
    else if (message.type === "workload" && message.id === workloadId) scheduleRefresh();
  },
  badge: root.querySelector(".live-bar [data-live-badge]"),
});
