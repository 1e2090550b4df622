"""How the console is served under uvicorn: one configuration for `gpucloud serve`/`up`, the tests and benches.

uvicorn trusts X-Forwarded-For (and -Proto) by default from loopback: it
rewrites the request's client address to whatever the header says, so a
client on the same host, or any request relayed by a local process, could
name any address and so dodge the login lockout and forge audit addresses.
The console reads those headers itself, only when TRUST_X_FORWARDED_FOR
(`common.requests.client_address`) or TRUST_X_FORWARDED_PROTO say so; uvicorn
is told to trust them only when TRUST_X_FORWARDED_FOR is on.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from django.conf import settings


def server_config(app: Any, *, host: str, port: int, **options: Any) -> uvicorn.Config:
    """Return uvicorn's configuration serving `app` on host:port; proxy headers only behind a trusted proxy."""
    if settings.TRUST_X_FORWARDED_FOR:
        return uvicorn.Config(app, host=host, port=port, proxy_headers=True, **options)
    # Without a trusted proxy the socket's peer is the client, whatever the headers claim.
    return uvicorn.Config(app, host=host, port=port, proxy_headers=False, forwarded_allow_ips="", **options)
