"""What each workload really does, and what really runs: the truth the ledger is held to.

A batch job prints `line 1` ... `line N` on stdout, one every PERIOD
seconds; one meant to fail also prints `exit C on purpose` on stderr; then
it appends `<attempt> <code>` to its proof file and exits with its code. So
its true final state (succeeded or failed), its whole expected log and
whether an attempt ran to its end are all known without asking the
console. A notebook's true state is running and serving: the suite never
stops one before the end of a run.

Every workload carries `FAULTS_RUN=<run id>` in its environment; the
processes of a run are found by that in /proc, with the workload id and
attempt the launch put beside it (GPUCLOUD_WORKLOAD_ID, GPUCLOUD_ATTEMPT).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PERIOD = 0.2
JOB_IMAGE = "registry.local/faults/sh:1"
NOTEBOOK_IMAGE = "registry.local/faults/jupyter:lab"


@dataclass(frozen=True)
class Design:
    """One workload the suite submits: a job with its exit code and line count, or a notebook."""

    name: str
    kind: str = "job"
    exit_code: int = 0
    lines: int = 30
    gpus: int = 1

    @property
    def true_state(self) -> str:
        if self.kind == "notebook":
            return "running"
        return "succeeded" if self.exit_code == 0 else "failed"

    def script(self) -> str:
        failing = f'echo "exit {self.exit_code} on purpose" >&2; ' if self.exit_code else ""
        return (
            f'for i in $(seq 1 {self.lines}); do echo "line $i"; sleep {PERIOD}; done; {failing}'
            f'[ -z "$FAULTS_PROOF" ] || echo "$GPUCLOUD_ATTEMPT {self.exit_code}" >> "$FAULTS_PROOF/$FAULTS_NAME"; '
            f"exit {self.exit_code}"
        )

    def payload(self, *, run_id: str, proof_dir: Path | None, image: str | None = None) -> dict[str, Any]:
        """Return the REST API's submission body (project and pool are added by the client)."""
        env = {"FAULTS_RUN": run_id, "FAULTS_NAME": self.name}
        common = {"name": self.name, "gpus_per_replica": self.gpus, "cpu_milli": 100, "env": env}
        if self.kind == "notebook":
            return {**common, "kind": "notebook", "image": image or NOTEBOOK_IMAGE, "memory_mib": 256}
        if proof_dir is not None:
            env["FAULTS_PROOF"] = str(proof_dir)
        return {**common, "image": image or JOB_IMAGE, "command": ["sh", "-c", self.script()], "memory_mib": 64}

    def expected_lines(self) -> Counter[tuple[str, str]]:
        """Return the (stream, text) lines one complete attempt prints."""
        lines: Counter[tuple[str, str]] = Counter(("stdout", f"line {i}") for i in range(1, self.lines + 1))
        if self.exit_code:
            lines[("stderr", f"exit {self.exit_code} on purpose")] += 1
        return lines


def designs(jobs: int, notebooks: int, *, fail_every: int = 5, cpu_only_every: int = 10) -> list[Design]:
    """Return `notebooks` notebooks and `jobs` jobs; every `fail_every`-th job exits 3, every `cpu_only_every`-th
    asks for no GPU."""
    made = [Design(name=f"nb-{k:02d}", kind="notebook") for k in range(1, notebooks + 1)]
    for i in range(1, jobs + 1):
        code = 3 if fail_every and i % fail_every == 0 else 0
        gpus = 0 if cpu_only_every and i % cpu_only_every == 0 else 1
        made.append(Design(name=f"job-{i:03d}", exit_code=code, gpus=gpus))
    return made


def completed_attempts(proof_dir: Path, name: str) -> dict[int, int]:
    """Return {attempt: exit code} of the attempts of job `name` that ran to their end (from its proof file)."""
    try:
        text = (proof_dir / name).read_text()
    except FileNotFoundError:
        return {}
    done: dict[int, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            done[int(parts[0])] = int(parts[1])
    return done


def _environ(pid: str) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
    if state in ("Z", "X"):
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def running_processes(run_id: str) -> dict[tuple[int, int], list[int]]:
    """Return {(workload id, attempt): [pids]} of every live process of the run's workloads on this machine."""
    found: dict[tuple[int, int], list[int]] = {}
    needle = f"FAULTS_RUN={run_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
        except OSError:
            continue
        env = _environ(entry.name)
        if env is None or env.get("FAULTS_RUN") != run_id:
            continue
        try:
            key = (int(env["GPUCLOUD_WORKLOAD_ID"]), int(env.get("GPUCLOUD_ATTEMPT", "0")))
        except (KeyError, ValueError):
            continue
        found.setdefault(key, []).append(int(entry.name))
    return found


def notebook_serving(endpoint: str, workload_id: int, secret: str) -> bool:
    """Return True when the notebook's Jupyter answers its status URL with the session secret."""
    import httpx

    try:
        answer = httpx.get(
            f"{endpoint}/notebooks/{workload_id}/api/status", headers={"Authorization": f"token {secret}"}, timeout=3
        )
    except httpx.HTTPError:
        return False
    return answer.status_code == 200
