"""The volume file browser: a folder of many files listed, a large file uploaded and downloaded.

    .venv/bin/python bench/volume_files.py [--files 10000] [--size-mb 1024] [--runs 5]

Embedded mode in a scratch data directory (set DATABASE_URL to measure
with Postgres): the console is served by `gpucloud serve` (uvicorn, one
process) in a child process on loopback, and a member of tenant `bench`
with an API token and a logged-in session gets their home through `POST
volumes/home/`. Then:

1. `--files` small files are written straight to folder `many/` of the
   home on disk; timed over HTTP, p50 of `--runs`: the API's first page
   (`limit=200`), every page of 200 in turn, and the file browser's page
   `/t/bench/storage/<id>/?path=many` (its first 200);
2. a `--size-mb` MiB file is uploaded with `PUT files/content/?path=big.bin`,
   its body generated chunk by chunk (never held whole by the client) and
   hashed as it is sent; the file the console stored is hashed from disk;
3. the same file is downloaded, streamed, hashed as it arrives and discarded.

For each operation the web process's resident memory is recorded: its
baseline just before, and its peak during (VmHWM of /proc/<pid>/status,
reset before through /proc/<pid>/clear_refs where allowed, and a 5 ms
sampler of VmRSS either way). Prints JSON on stdout and a table on stderr;
the child and the scratch directory are removed whatever happens.
MB/s are 10^6 bytes a second.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCRATCH = Path(tempfile.mkdtemp(prefix="gpucloud-bench-volume-files-"))
(SCRATCH / "data").mkdir()
os.environ["GPUCLOUD_DATA_DIR"] = str(SCRATCH / "data")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))
os.environ.setdefault("LOG_LEVEL", "WARNING")

TENANT = "bench"
FOLDER = "many"
BIG = "big.bin"
CHUNK = 1 << 20
PAGE = 200


def _setup() -> tuple[str, str]:
    """Migrate, collect static files, make a member of tenant `bench`; return their API token and session cookie."""
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    from tenants.context import Actor
    from tenants.models import Membership, Tenant
    from tenants.services.tokens import create_token

    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)  # the pages name their static files' hashes
    tenant, _ = Tenant.objects.get_or_create(slug=TENANT, defaults={"name": "Bench"})
    user = User.objects.create_user("bench-member", password=None)
    Membership.all_tenants.create(tenant=tenant, user=user, role="member")
    issued = create_token(actor=Actor(user=user), tenant=tenant, name="bench", role="member", expires_in_days=1)
    client = Client()
    client.force_login(user)
    return issued.secret, f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _volume_directory(volume_id: int) -> Path:
    from inventory.models import Volume
    from inventory.services.volume_files import ensure_directory

    return Path(ensure_directory(Volume.all_tenants.select_related("backend").get(pk=volume_id)))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(port: int) -> subprocess.Popen[bytes]:
    """Start `gpucloud serve` on `port` (its output to a log in the scratch directory); return once it answers."""
    command = [sys.executable, "-c", "from gpucloud.cli import main; main()", "serve", "--port", str(port)]
    with (SCRATCH / "serve.log").open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.poll() is None:
        try:
            conn = _connect(port)
            conn.request("GET", "/api/v1/")
            conn.getresponse().read()  # any answer: it serves
            return server
        except OSError:
            time.sleep(0.1)
    _stop(server)
    raise SystemExit(f"the console did not answer within 60 s (exit status {server.returncode}):\n{_log_tail()}")


def _log_tail() -> str:
    return (SCRATCH / "serve.log").read_text(errors="replace")[-3000:]


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# --- the web process's memory ----------------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/{pid}/status has no {field}")


class Memory:
    """The peak resident memory of process `pid` while the block runs, with its resident memory just before."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.baseline_kib = self.peak_kib = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self.hwm_reset = False

    def __enter__(self) -> Memory:
        try:  # "5" resets the peak (VmHWM) to the current RSS (Linux >= 4.0; the process's owner or root)
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.baseline_kib = self.peak_kib = _status_kib(self.pid, "VmRSS")
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak_kib = max(self.peak_kib, _status_kib(self.pid, "VmRSS"))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()
        self.peak_kib = max(self.peak_kib, _status_kib(self.pid, "VmRSS"))
        if self.hwm_reset:
            self.peak_kib = max(self.peak_kib, _status_kib(self.pid, "VmHWM"))

    def figures(self) -> dict[str, Any]:
        baseline, peak = self.baseline_kib / 1024, self.peak_kib / 1024
        return {
            "rss_before_mb": round(baseline, 1),
            "peak_rss_mb": round(peak, 1),
            "increase_mb": round(peak - baseline, 1),
        }


# --- HTTP -----------------------------------------------------------------------------------


def _connect(port: int) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=600, blocksize=CHUNK)


def _get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> bytes:
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"GET {path} answered {response.status}: {body[:500]!r}")
    return body


def _p50_ms(runs: int, once: Callable[[], None]) -> dict[str, float]:
    once()  # warm-up: the first request imports and compiles what the later ones reuse
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        once()
        timings.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(statistics.median(timings), 1), "max_ms": round(max(timings), 1)}


def _listings(
    port: int, pid: int, base: str, page: str, auth: dict[str, str], cookie: str, args: Any
) -> dict[str, Any]:
    """Time the first API page, every API page in turn, and the browser's first page of folder `many`."""
    conn = _connect(port)
    listing = f"{base}/files/?path={FOLDER}&limit={PAGE}"

    def first() -> None:
        entries = json.loads(_get(conn, f"{listing}&offset=0", auth))["entries"]
        if len(entries) != min(PAGE, args.files):
            raise SystemExit(f"the first page held {len(entries)} entries")

    def every() -> None:
        offset, seen, more = 0, 0, True
        while more:
            found = json.loads(_get(conn, f"{listing}&offset={offset}", auth))
            seen, more, offset = seen + len(found["entries"]), found["more"], offset + PAGE
        if seen != args.files:
            raise SystemExit(f"the pages held {seen} entries, not {args.files}")

    def browser() -> None:
        if b"f000199" not in _get(conn, f"{page}?path={FOLDER}", {"Cookie": cookie}):
            raise SystemExit("the file browser's page does not show the 200th file")

    results: dict[str, Any] = {"files": args.files, "page_size": PAGE, "runs": args.runs}
    for name, once in (("api_first_page", first), ("api_all_pages", every), ("browser_first_page", browser)):
        with Memory(pid) as memory:
            results[name] = _p50_ms(args.runs, once)
        results[name] |= memory.figures()
    results["api_all_pages"]["requests"] = -(-args.files // PAGE)
    return results


def _chunks(size: int) -> Iterator[bytes]:
    """Yield `size` bytes of incompressible data, 1 MiB at a time, each chunk different (its index in front)."""
    block = os.urandom(CHUNK)
    for index, start in enumerate(range(0, size, CHUNK)):
        yield (index.to_bytes(8, "big") + block[8:])[: min(CHUNK, size - start)]


def _upload(port: int, pid: int, url: str, auth: dict[str, str], size: int) -> tuple[dict[str, Any], str]:
    """PUT `size` generated bytes to `url` streamed; return the figures and the sha256 of what was sent."""
    digest = hashlib.sha256()
    conn = _connect(port)
    with Memory(pid) as memory:
        started = time.perf_counter()
        conn.putrequest("PUT", url)
        for name, value in (auth | {"Content-Type": "application/octet-stream"}).items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        for chunk in _chunks(size):
            digest.update(chunk)
            conn.send(chunk)
        response = conn.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - started
    conn.close()
    if response.status != 200 or json.loads(body)["size"] != size:
        raise SystemExit(f"the upload answered {response.status}: {body[:500]!r}")
    return {
        "seconds": round(elapsed, 2),
        "mb_s": round(size / elapsed / 1e6, 1),
        **memory.figures(),
    }, digest.hexdigest()


def _download(port: int, pid: int, url: str, auth: dict[str, str], size: int) -> tuple[dict[str, Any], str]:
    """GET `url` streamed and discarded; return the figures and the sha256 of what arrived (its size checked)."""
    digest, received = hashlib.sha256(), 0
    conn = _connect(port)
    with Memory(pid) as memory:
        started = time.perf_counter()
        conn.request("GET", url, headers=auth)
        response = conn.getresponse()
        if response.status != 200:
            raise SystemExit(f"the download answered {response.status}: {response.read()[:500]!r}")
        headers_at = time.perf_counter() - started
        while chunk := response.read(CHUNK):
            digest.update(chunk)
            received += len(chunk)
        elapsed = time.perf_counter() - started
    conn.close()
    if received != size:
        raise SystemExit(f"the download sent {received} bytes, not {size}")
    figures = {
        "seconds": round(elapsed, 2),
        "headers_s": round(headers_at, 2),
        "mb_s": round(size / elapsed / 1e6, 1),
    }
    return figures | memory.figures(), digest.hexdigest()


def _measure(args: Any) -> dict[str, Any]:
    token, cookie = _setup()
    auth = {"Authorization": f"Bearer {token}"}
    port = _free_port()
    server = _serve(port)
    try:
        pid = server.pid
        conn = _connect(port)
        conn.request("POST", f"/api/v1/tenants/{TENANT}/volumes/home/", headers=auth)
        answer = conn.getresponse()
        home = json.loads(answer.read())
        if answer.status != 200:
            raise SystemExit(f"POST volumes/home/ answered {answer.status}: {home}")
        directory = _volume_directory(int(home["id"]))
        (directory / FOLDER).mkdir()
        started = time.perf_counter()
        for index in range(args.files):
            (directory / FOLDER / f"f{index:06d}.txt").write_bytes(b"%d\n" % index)
        made_s = time.perf_counter() - started
        idle_mb = _status_kib(pid, "VmRSS") / 1024
        base = f"/api/v1/tenants/{TENANT}/volumes/{home['id']}"
        listing = _listings(port, pid, base, f"/t/{TENANT}/storage/{home['id']}/", auth, cookie, args)
        size = args.size_mb * CHUNK
        url = f"{base}/files/content/?path={quote(BIG)}"
        upload, sent = _upload(port, pid, url, auth, size)
        with (directory / BIG).open("rb") as on_disk:  # what the console stored, read back outside the timing
            stored = hashlib.file_digest(on_disk, "sha256").hexdigest()
        download, received = _download(port, pid, url, auth, size)
        if len({sent, stored, received}) != 1:
            raise SystemExit(f"checksums differ: sent {sent}, stored {stored}, downloaded {received}")
        resettable = os.access(f"/proc/{pid}/clear_refs", os.W_OK)
    except BaseException:
        print(_log_tail(), file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a TERM now would cut the cleanup short
        _stop(server)
    from django.db import connection

    return {
        "database": connection.vendor,
        "cpus": os.cpu_count(),
        "web_process_idle_rss_mb": round(idle_mb, 1),
        "files_written_on_disk_s": round(made_s, 2),
        "listing": listing,
        "size_mb": args.size_mb,
        "sha256": sent,
        "checksums_match": True,
        "upload": upload,
        "download": download,
        "peak_rss_from": "VmHWM reset before each operation" if resettable else "VmRSS sampled every 5 ms",
    }


def _table(results: dict[str, Any]) -> str:
    def rss(row: dict[str, Any]) -> list[str]:
        return [str(row[key]) for key in ("rss_before_mb", "peak_rss_mb", "increase_mb")]

    listing = results["listing"]
    rows = [["operation", "time", "MB/s", "RSS before MB", "peak RSS MB", "+MB"]]
    for name in ("api_first_page", "api_all_pages", "browser_first_page"):
        row = listing[name]
        rows.append([f"{name} ({listing['files']} files)", f"p50 {row['p50_ms']} ms", "", *rss(row)])
    for name in ("upload", "download"):
        row = results[name]
        rows.append([f"{name} {results['size_mb']} MiB", f"{row['seconds']} s", str(row["mb_s"]), *rss(row)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([*lines, f"web process idle RSS {results['web_process_idle_rss_mb']} MB"])


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the cleanup below must not be cut short
    raise SystemExit(128 + signum)  # unwinds through the `finally`s: the child stops, the scratch directory goes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        results = _measure(args)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        shutil.rmtree(SCRATCH, ignore_errors=True)
    print(json.dumps(results, indent=2))
    print(_table(results), file=sys.stderr)


if __name__ == "__main__":
    main()
