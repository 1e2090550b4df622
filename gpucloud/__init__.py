"""gpucloud: a web console that turns a fleet of GPU machines into a multi-tenant GPU cloud."""

from gpucloud.celery import app as celery_app

__all__ = ["celery_app"]
__version__ = "0.1.0"
