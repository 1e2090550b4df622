"""ASGI entry point: the notebook origin (`jobs.proxy`), then the console: body limits, the submission ingest, Django
over HTTP, Channels consumers over WebSocket."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")

from common.streaming import get_streaming_asgi_application

# Django must be set up before the consumers' modules import models. Its handler, streaming volume uploads
# to their view rather than spooling them to disk first (common.streaming).
django_asgi_app = get_streaming_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from common.bodylimit import BodyLimit  # noqa: E402
from frontend.consumers.auth import LiveAuthMiddleware  # noqa: E402
from frontend.routing import websocket_urlpatterns  # noqa: E402
from jobs.api.fast_ingest import SubmissionIngest  # noqa: E402
from jobs.proxy import NotebookProxy  # noqa: E402

# The notebook origin first (jobs.proxy): it authenticates before it reads a byte of a body and streams
# bodies to the notebook, never buffering them, so the console's body limits are not its own.
application = NotebookProxy(
    # Every request body within its limit and deadlines before anything behind reads a byte (common.bodylimit).
    BodyLimit(
        ProtocolTypeRouter(
            {
                # API submissions that can be committed together go to the ingest; everything else to Django.
                "http": SubmissionIngest(django_asgi_app),
                # The session's user first, then a token (which wins) and the Origin rule: LiveAuthMiddleware.
                "websocket": AuthMiddlewareStack(LiveAuthMiddleware(URLRouter(websocket_urlpatterns))),
            }
        )
    )
)
