"""Workload logs: storing the batches agents ship, and retention.

Agents follow each replica's output and ship it in batches
(`jobs.ingest_logs`). A batch names the cursor it starts after (`since`)
and the cursor after its last line (`cursor`); the replica's `log_cursor`
row is the end of the chain stored so far. A batch is stored only when it
continues that chain, so a redelivered Celery task or an agent that resumed
from an older cursor cannot store a line twice. Each line also carries its
own cursor (`marks`), so a batch that overlaps the stored chain continues
it from the line after the stored cursor (`aligned`): output read again
after a lost batch (`reconcile.request_output_resends`) fits whatever
batches of it were already on their way.

Stored lines are numbered per workload (1, 2, ... across replicas and
attempts) and kept as `LogChunk` rows of `[seq, timestamp, stream, text,
attempt, replica]`; readers are in `jobs.selectors`.

`chain` stores one batch, `ordering` a node's message of them in order per
replica, `retention` deletes what has expired; all are re-exported here.
"""

from jobs.services.logs.chain import (
    MAX_CURSOR_CHARS,
    MAX_LINE_CHARS,
    STREAMS,
    TRUNCATION_MARKER,
    LogBatchError,
    ingest_log_batch,
    record_log_end,
    truncate_line,
)
from jobs.services.logs.ordering import aligned, ingest_log_batches, replica_key
from jobs.services.logs.retention import PURGE_BATCH, purge_expired_logs

__all__ = [
    "MAX_CURSOR_CHARS",
    "MAX_LINE_CHARS",
    "PURGE_BATCH",
    "STREAMS",
    "TRUNCATION_MARKER",
    "LogBatchError",
    "aligned",
    "ingest_log_batch",
    "ingest_log_batches",
    "purge_expired_logs",
    "record_log_end",
    "replica_key",
    "truncate_line",
]
