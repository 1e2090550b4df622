"""ASGI entry point: the notebook proxy (`/notebooks/<id>/`), the submission ingest, Django over HTTP, Channels
consumers over WebSocket."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
# Django must be set up before the consumers' modules import models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from frontend.consumers.auth import LiveAuthMiddleware  # noqa: E402
from frontend.routing import websocket_urlpatterns  # noqa: E402
from jobs.api.ingest import SubmissionIngest  # noqa: E402
from jobs.proxy import NotebookProxy  # noqa: E402

application = NotebookProxy(
    ProtocolTypeRouter(
        {
            # API submissions that can be committed together go to the ingest; everything else to Django.
            "http": SubmissionIngest(django_asgi_app),
            # The session's user first, then a token (which wins) and the Origin rule: LiveAuthMiddleware.
            "websocket": AuthMiddlewareStack(LiveAuthMiddleware(URLRouter(websocket_urlpatterns))),
        }
    )
)
