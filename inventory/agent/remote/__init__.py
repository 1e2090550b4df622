"""The remote agent: a GPU host that reaches the console over HTTPS only, with a credential of its own.

`gpucloud agent join CONSOLE TOKEN` trades a one-time join token for the
node's credential (`credential`), and `gpucloud agent run` runs the agent
from it (`agent.run_remote_agent`). The host needs no SECRET_KEY, database
or Redis: the reporter and executor of the co-located agent run unchanged,
but what they report goes to a durable on-disk spool (`spool`) that a
sender thread posts to `/api/v1/agent/reports` (`sender`), and the work
the console asks for is long-polled from `/api/v1/agent/commands`
(`commands`). `client` speaks HTTP; `backoff` paces retries.

This package imports nothing heavy here, so `spool` loads without Django.
"""


class RemoteAgentError(Exception):
    """A remote agent cannot start or join as asked; the message says why and what to do (the CLI prints it)."""
