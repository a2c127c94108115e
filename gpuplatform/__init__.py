"""gpuplatform project package: settings, URLs, the API base and the Celery app."""

from .celery import app as celery_app

__all__ = ["celery_app"]
