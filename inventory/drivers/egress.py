"""What workload containers may reach outside their bridge: never the host itself, link-local or metadata addresses.

A service on a GPU host bound to 0.0.0.0 (or to any of the host's
addresses) answers every container on the host's bridges, and a cloud's
instance metadata (169.254.169.254) hands out the host's credentials to
whoever asks. The agent keeps two chains of its own in the filter table,
for every workload bridge (the Docker runtime names them `gpc…`,
`bridge_name`; iptables' `gpc+` matches them all):

- `GPUCLOUD-INPUT`, jumped to from INPUT: a container's packet to any of
  the host's own addresses (0.0.0.0-bound services included) is refused,
  replies to connections the host opened excepted;
- `GPUCLOUD-FORWARD`, jumped to from DOCKER-USER (Docker's hook for user
  rules, ahead of its own): link-local (169.254.0.0/16, fe80::/10) and
  metadata addresses are refused; everything else goes on to Docker's rules.

A refusal is a TCP reset (ICMP port unreachable for anything else), so a
connection fails at once instead of hanging. An operator allows a
destination with `GPUCLOUD_EGRESS_ALLOWED` entries `CIDR:PORT` (TCP), e.g.
`10.0.0.5/32:3128` for a proxy on the host; they come before every refusal.

`install_egress` writes both chains in one `iptables-restore --noflush`
(atomic: the old rules hold until the new ones replace them) and makes sure
the jumps exist; it is idempotent. The agent runs it at start and on every
reconcile; rules found changed or missing are put back and logged as a
warning, never removed silently. The same rules go to ip6tables when the
host has it. Pure apart from running iptables (each call with a timeout).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from inventory.drivers.base import PermanentDriverError

log = logging.getLogger(__name__)

BRIDGE_PREFIX = "gpc"
"""Every workload bridge's interface name starts so (Linux allows 15 characters)."""
INPUT_CHAIN = "GPUCLOUD-INPUT"
FORWARD_CHAIN = "GPUCLOUD-FORWARD"
_TIMEOUT_SECONDS = 10.0

_BLOCKED_FORWARD = {
    4: ("169.254.0.0/16", "100.100.100.200/32", "127.0.0.0/8", "0.0.0.0/32"),
    6: ("fe80::/10", "fd00:ec2::254/128", "::1/128"),
}
"""Link-local, metadata and loopback destinations, refused through the FORWARD hook too."""


@dataclass(frozen=True)
class Allowance:
    """One destination workloads may reach after all: a network and a TCP port."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    port: int


def bridge_name(network: str) -> str:
    """Return the interface name of the workload network `network`: `gpc` and 12 hex digits of its name's digest."""
    return f"{BRIDGE_PREFIX}{hashlib.sha256(network.encode()).hexdigest()[:12]}"


def parse_allowed(entries: Iterable[str]) -> tuple[Allowance, ...]:
    """Return the allowances `CIDR:PORT` entries name (`[v6-cidr]:PORT` for IPv6); raises ValueError on a bad one."""
    found = []
    for entry in entries:
        where, _, port = entry.strip().rpartition(":")
        if not where or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{entry!r} is not CIDR:PORT (e.g. 10.0.0.5/32:3128)")
        found.append(Allowance(ipaddress.ip_network(where.strip("[]"), strict=False), int(port)))
    return tuple(found)


def rules(allowed: Iterable[Allowance], family: int) -> str:
    """Return the `iptables-restore --noflush` text of both chains for IP version `family` (4 or 6)."""
    unreachable = "icmp-port-unreachable" if family == 4 else "icmp6-port-unreachable"
    ours = [a for a in allowed if a.network.version == family]
    accept = [f"-d {a.network} -p tcp -m tcp --dport {a.port} -j RETURN" for a in ours]
    established = "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
    refuse = ["-p tcp -j REJECT --reject-with tcp-reset", f"-j REJECT --reject-with {unreachable}"]
    lines = ["*filter", f":{INPUT_CHAIN} - [0:0]", f":{FORWARD_CHAIN} - [0:0]"]
    lines += [f"-A {INPUT_CHAIN} {rule}" for rule in (established, *accept, *refuse)]
    lines += [f"-A {FORWARD_CHAIN} {rule}" for rule in (established, *accept)]
    for blocked in _BLOCKED_FORWARD[family]:
        lines += [f"-A {FORWARD_CHAIN} -d {blocked} {rule}" for rule in refuse]
    lines += ["COMMIT", ""]
    return "\n".join(lines)


def _jumps() -> list[tuple[str, list[str]]]:
    match = ["-i", f"{BRIDGE_PREFIX}+"]
    return [("INPUT", [*match, "-j", INPUT_CHAIN]), ("DOCKER-USER", [*match, "-j", FORWARD_CHAIN])]


def install_egress(allowed: Iterable[Allowance] = ()) -> bool:
    """Install or refresh the egress rules for both IP versions; return whether anything was missing or changed.

    Raises PermanentDriverError when IPv4's cannot be installed (no iptables,
    not root): the caller decides whether workloads may run without them.
    IPv6's are installed where ip6tables exists, and only logged when they fail.
    """
    allowed = tuple(allowed)
    changed = _install("iptables", rules(allowed, 4))
    if shutil.which("ip6tables"):
        try:
            changed = _install("ip6tables", rules(allowed, 6)) or changed
        except PermanentDriverError as error:
            log.warning("IPv6 egress rules not installed: %s", error)
    return changed


def _install(tool: str, text: str) -> bool:
    before = _listing(tool)
    _run([f"{tool}-restore", "--noflush"], text)
    for chain, jump in _jumps():
        if chain == "DOCKER-USER" and _run([tool, "-S", chain], check=False) is None:
            _run([tool, "-N", chain])  # Docker makes it at its start; made here first, Docker keeps it
        if _run([tool, "-C", chain, *jump], check=False) is None:
            _run([tool, "-I", chain, "1", *jump])
    after = _listing(tool)
    if before != after:
        if any(INPUT_CHAIN in line for line in before):
            log.warning("%s egress rules had changed or gone missing; put back:\n%s", tool, "\n".join(after))
        else:
            log.info("%s egress rules installed", tool)
        return True
    return False


def remove_egress(reason: str) -> None:
    """Remove the jumps and both chains (IPv4 and IPv6), logging `reason` as a warning: never done silently."""
    log.warning("removing the egress rules of workload bridges: %s", reason)
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(tool):
            continue
        for chain, jump in _jumps():
            while _run([tool, "-D", chain, *jump], check=False) is not None:
                pass
        for chain in (INPUT_CHAIN, FORWARD_CHAIN):
            _run([tool, "-F", chain], check=False)
            _run([tool, "-X", chain], check=False)


def installed(tool: str = "iptables") -> list[str]:
    """Return the egress rules `tool` holds now (`-S` lines of both chains and of the jumps to them)."""
    return _listing(tool)


def _listing(tool: str) -> list[str]:
    found: list[str] = []
    for chain in (INPUT_CHAIN, FORWARD_CHAIN, "INPUT", "DOCKER-USER"):
        listed = _run([tool, "-S", chain], check=False) or ""
        found += [line for line in listed.splitlines() if "GPUCLOUD" in line]
    return found


def _run(argv: list[str], stdin: str | None = None, *, check: bool = True) -> str | None:
    """Run an iptables command; return its output, or None when it failed and `check` is off."""
    try:
        # iptables and its arguments are ours (chains, CIDRs and ports parsed by ipaddress), never a user's text.
        done = subprocess.run(  # noqa: S603
            argv, input=stdin, capture_output=True, text=True, timeout=_TIMEOUT_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        if not check:
            return None
        raise PermanentDriverError(f"{argv[0]} failed: {error}", code="egress_rules") from error
    if done.returncode != 0:
        if not check:
            return None
        raise PermanentDriverError(f"{' '.join(argv)}: {done.stderr.strip()}", code="egress_rules")
    return done.stdout
