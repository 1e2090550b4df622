// The workload page's live log: `<section data-log-viewer data-ws="/ws/workloads/<id>/logs/">`.
//
// Virtualized: every received line is kept in an array (up to `data-cap`), but only the rows in
// view (and a few around them) are in the DOM, each one row high, so a long log scrolls as
// smoothly as a short one. Following keeps the newest line in view; scrolling up pauses it and
// counts the lines that arrive meanwhile. A reconnection resumes after the last line received
// (`?after=<seq>`); a line at or below it is dropped, so nothing shows twice.
//
// Lines are the stored format: [seq, timestamp, stream, text, attempt, replica].

import { LiveSocket, pageData } from "./live.js";

const SEQ = 0;
const TIMESTAMP = 1;
const STREAM = 2;
const TEXT = 3;
const ATTEMPT = 4;
const REPLICA = 5;
// Rows drawn above and below the visible ones, so a fast scroll shows no blank band.
const OVERSCAN = 30;
const SEARCH_DELAY_MS = 150;

class LogView {
  constructor(root) {
    this.root = root;
    this.cap = Number(root.dataset.cap) || 100_000;
    this.tail = Number(root.dataset.tail) || 1000;
    this.showReplica = Number(root.dataset.replicas) > 1;
    this.showAttempt = Number(root.dataset.attempt) > 1;
    this.lines = [];
    this.dropped = 0; // lines removed from the front by the cap: a line's absolute index is dropped + i
    this.lastSeq = 0;
    this.following = true;
    this.unseen = 0;
    this.query = "";
    this.matches = []; // absolute indexes of matching lines, ascending
    this.current = -1; // index into `matches` of the match last jumped to
    this.drawn = "";
    this.frame = 0;
    this.find();
    this.rowHeight = this.measureRow();
    this.bind();
    this.socket = new LiveSocket({
      path: () => this.path(),
      onmessage: (message) => this.receive(message),
      badge: root.querySelector("[data-live-badge]"),
    });
  }

  find() {
    const part = (name) => this.root.querySelector(`[data-log-${name}]`);
    this.toolbar = part("toolbar");
    this.viewport = part("viewport");
    this.spacer = part("spacer");
    this.rows = part("rows");
    this.staticTail = part("static");
    this.searchBox = part("search");
    this.count = part("count");
    this.followButton = part("follow");
    this.notice = part("notice");
    this.toolbar.hidden = false;
  }

  measureRow() {
    this.viewport.hidden = false;
    const probe = document.createElement("div");
    probe.className = "log-row";
    probe.textContent = "0";
    this.rows.append(probe);
    const height = probe.getBoundingClientRect().height || 18;
    probe.remove();
    this.viewport.hidden = true;
    return height;
  }

  bind() {
    this.viewport.addEventListener("scroll", () => this.scrolled(), { passive: true });
    this.followButton.addEventListener("click", () => this.setFollowing(!this.following));
    let timer = 0;
    this.searchBox.addEventListener("input", () => {
      window.clearTimeout(timer);
      timer = window.setTimeout(() => this.search(this.searchBox.value), SEARCH_DELAY_MS);
    });
    this.searchBox.addEventListener("keydown", (event) => {
      if (event.key !== "Enter") return;
      event.preventDefault();
      window.clearTimeout(timer);
      if (this.searchBox.value.toLowerCase() !== this.query) this.search(this.searchBox.value);
      this.jump(event.shiftKey ? -1 : 1);
    });
    this.root.querySelector("[data-log-next]").addEventListener("click", () => this.jump(1));
    this.root.querySelector("[data-log-prev]").addEventListener("click", () => this.jump(-1));
    new ResizeObserver(() => this.schedule()).observe(this.viewport);
  }

  path() {
    const base = this.root.dataset.ws;
    return this.lastSeq ? `${base}?after=${this.lastSeq}` : `${base}?tail=${this.tail}`;
  }

  receive(message) {
    if (message.type === "state") {
      showState(message.state, message.ended);
    } else if (message.type === "lines") {
      this.append(message.lines);
    }
  }

  append(lines) {
    let added = 0;
    for (const line of lines) {
      if (line[SEQ] <= this.lastSeq) continue; // already shown before a reconnection
      this.lastSeq = line[SEQ];
      if (this.query && line[TEXT].toLowerCase().includes(this.query)) {
        this.matches.push(this.dropped + this.lines.length);
      }
      if (line[ATTEMPT] > 1) this.showAttempt = true;
      this.lines.push(line);
      added += 1;
    }
    if (!this.following) this.unseen += added;
    this.trim();
    this.reveal();
    this.schedule();
  }

  // Keeps memory bounded: past the cap by a tenth, the oldest lines go (one slice, not one per line).
  trim() {
    const excess = this.lines.length - this.cap;
    if (excess <= Math.max(1000, this.cap / 10)) return;
    this.lines = this.lines.slice(excess);
    this.dropped += excess;
    const before = this.matches.length;
    this.matches = this.matches.filter((index) => index >= this.dropped);
    this.current = Math.max(-1, this.current - (before - this.matches.length));
    if (!this.following) this.viewport.scrollTop -= excess * this.rowHeight;
    this.notice.hidden = false;
    this.notice.textContent = `This view keeps about the last ${this.cap.toLocaleString()} lines; the download has them all.`;
  }

  // The server-rendered tail stays until the first message replaces it.
  reveal() {
    if (!this.viewport.hidden) return;
    this.viewport.hidden = false;
    if (this.staticTail) this.staticTail.hidden = true;
    this.root.dataset.synced = "true";
  }

  scrolled() {
    const { scrollTop, clientHeight, scrollHeight } = this.viewport;
    const atBottom = scrollTop + clientHeight >= scrollHeight - this.rowHeight;
    if (atBottom !== this.following) {
      this.following = atBottom;
      if (atBottom) this.unseen = 0;
    }
    this.schedule();
  }

  setFollowing(on) {
    this.following = on;
    this.unseen = 0;
    if (on) this.viewport.scrollTop = this.viewport.scrollHeight;
    this.schedule();
  }

  search(text) {
    this.query = text.toLowerCase();
    this.matches = [];
    this.current = -1;
    if (this.query) {
      this.lines.forEach((line, i) => {
        if (line[TEXT].toLowerCase().includes(this.query)) this.matches.push(this.dropped + i);
      });
    }
    this.drawn = "";
    this.schedule();
  }

  // Next (+1) or previous (-1) match; the first jump goes to the nearest one from the top of the view.
  jump(step) {
    if (!this.matches.length) return;
    if (this.current < 0) {
      const top = this.dropped + Math.floor(this.viewport.scrollTop / this.rowHeight);
      const after = this.matches.findIndex((index) => index >= top);
      this.current = step > 0 ? Math.max(after, 0) : (after <= 0 ? this.matches.length : after) - 1;
    } else {
      this.current = (this.current + step + this.matches.length) % this.matches.length;
    }
    const row = this.matches[this.current] - this.dropped;
    this.following = false;
    this.viewport.scrollTop = row * this.rowHeight - this.viewport.clientHeight / 2 + this.rowHeight / 2;
    this.drawn = "";
    this.schedule();
  }

  schedule() {
    if (!this.frame) this.frame = window.requestAnimationFrame(() => this.render());
  }

  render() {
    this.frame = 0;
    const total = this.lines.length;
    this.spacer.style.height = `${total * this.rowHeight}px`;
    if (this.following) this.viewport.scrollTop = this.viewport.scrollHeight;
    const { scrollTop, clientHeight } = this.viewport;
    const first = Math.max(0, Math.floor(scrollTop / this.rowHeight) - OVERSCAN);
    const last = Math.min(total, Math.ceil((scrollTop + clientHeight) / this.rowHeight) + OVERSCAN);
    const key = `${first}:${last}:${this.dropped}:${this.current}:${this.query}`;
    if (key !== this.drawn) {
      this.drawn = key;
      this.rows.style.transform = `translateY(${first * this.rowHeight}px)`;
      const fragment = document.createDocumentFragment();
      const current = this.current >= 0 ? this.matches[this.current] - this.dropped : -1;
      for (let i = first; i < last; i += 1) fragment.append(this.row(this.lines[i], i === current));
      this.rows.replaceChildren(fragment);
    }
    this.status(total);
  }

  row(line, isCurrent) {
    const row = document.createElement("div");
    row.className = `log-row log-${line[STREAM]}${isCurrent ? " log-current" : ""}`;
    row.dataset.seq = line[SEQ];
    row.title = line[TIMESTAMP];
    if (this.showReplica || this.showAttempt) {
      const source = document.createElement("span");
      source.className = "log-source";
      const parts = [this.showReplica ? `r${line[REPLICA]}` : "", this.showAttempt ? `a${line[ATTEMPT]}` : ""];
      source.textContent = `[${parts.filter(Boolean).join(" ")}] `;
      row.append(source);
    }
    row.append(...highlighted(line[TEXT], this.query));
    return row;
  }

  status(total) {
    this.root.dataset.lines = String(total);
    this.root.dataset.lastSeq = String(this.lastSeq);
    this.root.dataset.following = String(this.following);
    this.followButton.setAttribute("aria-pressed", String(this.following));
    this.followButton.textContent = this.following
      ? "Following"
      : `Follow${this.unseen ? ` (${this.unseen.toLocaleString()} new line${this.unseen === 1 ? "" : "s"})` : ""}`;
    if (!this.query) {
      this.count.textContent = "";
    } else if (!this.matches.length) {
      this.count.textContent = "no match";
    } else {
      const of = `${this.matches.length.toLocaleString()} match${this.matches.length === 1 ? "" : "es"}`;
      this.count.textContent = this.current >= 0 ? `${this.current + 1} of ${of}` : of;
    }
  }
}

/** Return `text` as DOM nodes with each case-insensitive occurrence of `query` (lowercase) in a <mark>. */
function highlighted(text, query) {
  if (!query) return [text];
  const lower = text.toLowerCase();
  const nodes = [];
  let from = 0;
  for (let at = lower.indexOf(query); at >= 0; at = lower.indexOf(query, from)) {
    if (at > from) nodes.push(text.slice(from, at));
    const mark = document.createElement("mark");
    mark.textContent = text.slice(at, at + query.length);
    nodes.push(mark);
    from = at + query.length;
  }
  if (from < text.length) nodes.push(text.slice(from));
  return nodes;
}

/** Put the workload's new state on its badge at once (workloadlive.js then redraws the rest of the page). */
function showState(state, ended) {
  const badge = document.querySelector("[data-workload-state]");
  if (!badge) return;
  const labels = pageData("workload-state-labels", {});
  badge.className = `state wstate-${state}`;
  badge.textContent = labels[state] ?? state;
  badge.dataset.workloadState = state;
  document.body.dataset.workloadEnded = String(Boolean(ended));
}

for (const root of document.querySelectorAll("[data-log-viewer]")) new LogView(root);
