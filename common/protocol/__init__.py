"""The controller-agent protocol: typed, versioned messages, their task names, and their wire form.

`messages` defines every message (`StartReplica`, `ReplicaExited`, ...);
`wire` turns them into JSON-able dicts and back, refusing what does not fit;
`schema` pins each message's shape per version (`schema.json`). Pure
Python: the controller, the co-located agent and a joined host's agent all
import it, and nothing here imports Django or Celery.
"""

from common.protocol.messages import BY_TASK, COMMANDS, REPORTS
from common.protocol.wire import Message, ProtocolError, Record

__all__ = ["BY_TASK", "COMMANDS", "REPORTS", "Message", "ProtocolError", "Record"]
