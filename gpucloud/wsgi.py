"""WSGI entry point, for servers that speak only WSGI (no WebSockets)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")
application = get_wsgi_application()
