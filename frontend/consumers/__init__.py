"""WebSocket consumers of the live streams (logs, GPU metrics, workload events, the cluster), and their plumbing.

`auth` authenticates the handshake (session cookie or API token) and
checks its Origin; `base.LiveConsumer` holds what every stream shares
(authorize, connection cap, revocation); one module per stream. The
protocol is in docs/live.md.
"""
