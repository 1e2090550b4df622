// One live view's WebSocket: the URL from the page's location, reconnection with backoff, a status badge.
//
// The server answers a refusal with a close code that will not change on a retry (bad parameters,
// signed out, not found, access revoked): those end the view for good and say why on the badge.
// Anything else (a restart, a dropped network, too many open views) is retried with backoff.

const FINAL = new Map([
  [1000, "closed"],
  [4400, "closed: bad request"],
  [4401, "closed: signed out"],
  [4403, "closed: access revoked"],
  [4404, "closed: not found"],
]);
const TOO_MANY = 4429;
const FIRST_DELAY_MS = 500;
const MAX_DELAY_MS = 15_000;
// A connection that stayed open this long counts as healthy: the next drop retries quickly again.
const HEALTHY_MS = 10_000;

/** Return the ws:// (or wss:// under https) URL of `path` on this page's host. */
export function socketUrl(path) {
  const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${window.location.host}${path}`;
}

/** A status badge: `<span data-live-badge>` made visible, its text and `data-status` kept current. */
export class LiveBadge {
  constructor(element) {
    this.element = element;
    if (element) element.hidden = false;
  }

  set(status, text) {
    if (!this.element) return;
    this.element.dataset.status = status;
    this.element.textContent = text;
  }
}

/**
 * A live view's connection. `path` is a string or a function returning one (called before every
 * connect, so a view can resume where it stopped); `onmessage` gets each parsed JSON message;
 * `onopen` runs on every (re)connect.
 */
export class LiveSocket {
  constructor({ path, onmessage, onopen = () => {}, badge = null }) {
    this.path = typeof path === "function" ? path : () => path;
    this.onmessage = onmessage;
    this.onopen = onopen;
    this.badge = badge instanceof LiveBadge ? badge : new LiveBadge(badge);
    this.delay = FIRST_DELAY_MS;
    this.stopped = false;
    this.socket = null;
    this.timer = null;
    // The page's open views, for a look from the browser's console (and the browser tests).
    (window.gpucloudLive ??= []).push(this);
    this.connect();
  }

  connect() {
    this.timer = null;
    this.badge.set("connecting", this.socket ? "reconnecting…" : "connecting…");
    const socket = new WebSocket(socketUrl(this.path()));
    const opened = { at: 0 };
    socket.addEventListener("open", () => {
      opened.at = Date.now();
      this.badge.set("live", "live");
      this.onopen();
    });
    socket.addEventListener("message", (event) => {
      if (this.socket !== socket) return;
      this.onmessage(JSON.parse(event.data));
    });
    socket.addEventListener("close", (event) => this.closed(socket, event.code, opened.at));
    this.socket = socket;
  }

  closed(socket, code, openedAt) {
    if (this.socket !== socket || this.stopped) return;
    if (FINAL.has(code)) {
      this.stopped = true;
      this.badge.set(code === 1000 ? "closed" : "refused", FINAL.get(code));
      return;
    }
    if (openedAt && Date.now() - openedAt >= HEALTHY_MS) this.delay = FIRST_DELAY_MS;
    // Jitter spreads the reconnections of many browsers after a server restart.
    const wait = this.delay * (0.75 + Math.random() * 0.5);
    this.delay = Math.min(this.delay * 2, MAX_DELAY_MS);
    this.badge.set("reconnecting", code === TOO_MANY ? "reconnecting… (too many live views open)" : "reconnecting…");
    this.timer = window.setTimeout(() => this.connect(), code === TOO_MANY ? Math.max(wait, 5_000) : wait);
  }

  /** Close for good (the page no longer needs it). */
  close() {
    this.stopped = true;
    if (this.timer) window.clearTimeout(this.timer);
    this.socket?.close(1000);
    this.badge.set("closed", "closed");
  }
}

/** Return the JSON a template put in `<script type="application/json" id=...>` (Django's json_script). */
export function pageData(id, fallback = null) {
  const element = document.getElementById(id);
  return element ? JSON.parse(element.textContent) : fallback;
}
