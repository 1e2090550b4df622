from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"
    verbose_name = "Web UI"

    def ready(self) -> None:
        # Access changes announce themselves to open live streams (see frontend/consumers/access.py).
        from frontend.consumers.access import connect_signals

        connect_signals()
