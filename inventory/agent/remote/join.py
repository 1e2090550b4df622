"""Joining: trade a one-time join token for this host's node name and credential, and store them."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from inventory.agent.remote.client import ConsoleClient, check_console_url
from inventory.agent.remote.credential import Credential, prepare_path, save_credential


def join_console(
    console: str, token: str, *, path: Path, ca_file: str | None = None, allow_http: bool = False, force: bool = False
) -> Credential:
    """Join the console at `console` with `token`, store the credential at `path` (0600) and return it.

    Checked before the token is spent: the URL (`check_console_url`:
    ConsoleUrlRefused), the CA file and the credential path (an existing
    file without `force`: CredentialFileError). Raises JoinRefused when
    the console refuses the token or cannot be reached.
    """
    base = check_console_url(console, allow_http=allow_http)
    prepare_path(path, force=force)
    ca_path = os.path.abspath(ca_file) if ca_file else None
    client = ConsoleClient(base, ca_file=ca_path)
    try:
        joined = client.join(token, hostname=socket.gethostname())
    finally:
        client.close()
    credential = Credential(
        console=base,
        node=joined.node,
        credential=joined.credential,
        ca_file=ca_path,
        sample_seconds=joined.sample_seconds,
        heartbeat_seconds=joined.heartbeat_seconds,
    )
    save_credential(path, credential, force=force)
    return credential
