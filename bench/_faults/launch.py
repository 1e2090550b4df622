"""Run a `gpucloud` command of the code tree on PYTHONPATH, with what the fault suite needs around it.

    PYTHONPATH=CODE python bench/_faults/launch.py [--queue-samples FILE] [--simulated-gpus N] -- up --port 8100

- Prints where `gpucloud` was imported from, so a run proves which code it measured.
- `--queue-samples FILE`: a thread appends, every 0.5 s, one JSON line
  `{"t": <unix time>, "queues": {name: size}, "held": {name: count}}`:
  the sizes of the in-process transport's queues
  (`kombu.transport.memory.Channel.queues`), and the messages of each queue
  the process's workers have taken and not started (Celery's reserved
  requests less its active ones), since a worker that takes every waiting
  message at once empties the transport's queue without running them.
- `--simulated-gpus N`: the embedded agent of `gpucloud up` probes N
  simulated GPUs instead of NVML (this machine has none), as
  `gpucloud agent --probe simulated --simulated-gpus N` does for a
  separate agent.

Nothing here changes the product: it wraps the command as it is, so it
runs the same against older code.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

# This directory's modules must not shadow anything of the product's.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)


def _held_not_started() -> dict[str, int]:
    from celery.worker import state

    for _ in range(5):  # the sets change under worker threads; a later try reads them whole
        try:
            waiting = list(state.reserved_requests - state.active_requests)
        except RuntimeError:
            continue
        counts: dict[str, int] = {}
        for request in waiting:
            queue = str((request.delivery_info or {}).get("routing_key") or "")
            counts[queue] = counts.get(queue, 0) + 1
        return counts
    return {}


def _sample_queues(path: Path, interval: float = 0.5) -> None:
    from kombu.transport.memory import Channel

    with path.open("a") as out:
        while True:
            sizes = {str(name): queue.qsize() for name, queue in list(Channel.queues.items())}
            sample = {"t": round(time.time(), 3), "queues": sizes, "held": _held_not_started()}
            out.write(json.dumps(sample) + "\n")
            out.flush()
            time.sleep(interval)


def _simulated_probe(gpus: int) -> None:
    import inventory.agent.config as agent_config

    original = agent_config.config_from_settings

    def config_from_settings(node: str | None = None, **overrides: object) -> object:
        overrides.setdefault("probe", "simulated")
        overrides.setdefault("simulated_gpu_count", gpus)
        return original(node, **overrides)

    agent_config.config_from_settings = config_from_settings  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queue-samples", type=Path)
    parser.add_argument("--simulated-gpus", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    import gpucloud.cli

    print(f"faults: gpucloud from {Path(gpucloud.cli.__file__).resolve().parent.parent}", file=sys.stderr, flush=True)
    if args.simulated_gpus is not None:
        _simulated_probe(args.simulated_gpus)
    if args.queue_samples is not None:
        threading.Thread(target=_sample_queues, args=(args.queue_samples,), daemon=True, name="faults-queues").start()
    gpucloud.cli.main(command)


if __name__ == "__main__":
    main()
