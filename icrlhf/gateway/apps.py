from typing import Any

from django.apps import AppConfig
from django.db.models.signals import pre_delete


class GatewayConfig(AppConfig):
    name = "icrlhf.gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from icrlhf.queues.models import Item

        # A signal, because items (below the gateway) must not know about calls.
        pre_delete.connect(_item_deleted, sender=Item, dispatch_uid="gateway-item-deleted")


def _item_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    from icrlhf.gateway.capture import item_deleted

    item_deleted(item_id=instance.pk)
