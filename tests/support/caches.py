"""Django's cache in the machine's Redis, for the tests of what lives there."""

import uuid
from typing import Any


def cache_in_redis(settings: Any, *, prefix: str = "") -> str:
    """Django's cache in the machine's Redis (the counters' and the call-log journal's home),
    under a key prefix of the test's own, which it returns."""
    prefix = prefix or f"test-{uuid.uuid4().hex[:8]}"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": settings.CELERY_BROKER_URL,
            "KEY_PREFIX": prefix,
        }
    }
    return prefix
