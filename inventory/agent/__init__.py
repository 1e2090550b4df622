"""The node agent: node-local work on the node's own Celery queue, a heartbeat and a GPU sampler.

The agent never touches the database. It receives JSON requests on the
queue `node.<name>`, answers with JSON results (linked callbacks on the
`control` queue apply them), and reports heartbeats with its latest GPU
samples to the controller and every sample to the channel layer.
"""

AGENT_VERSION = "0.1.0"
