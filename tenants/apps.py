from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants"

    def ready(self) -> None:
        # Registers the token scheme with drf-spectacular.
        from tenants.api import schema  # noqa: F401
