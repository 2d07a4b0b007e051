# Load the Celery app with Django so that `.delay()` from the web process uses its settings.
from worker import app as celery_app

__all__ = ["celery_app"]
