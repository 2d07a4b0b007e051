from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate

# What the curator role may do in the admin (staff status is still needed to enter it).
CURATOR_PERMISSIONS = (
    "memory.view_example",
    "memory.change_example",
    "memory.delete_example",
    "memory.view_curationevent",
)


def grant_curator_permissions(**_: Any) -> None:
    from django.contrib.auth.models import Group, Permission

    curator, _created = Group.objects.get_or_create(name="curator")
    for dotted in CURATOR_PERMISSIONS:
        app_label, codename = dotted.split(".")
        permission = Permission.objects.filter(
            content_type__app_label=app_label, codename=codename
        ).first()
        if permission is not None:
            curator.permissions.add(permission)


class QueuesConfig(AppConfig):
    name = "icrlhf.queues"
    label = "queues"

    def ready(self) -> None:
        # Permissions exist only after every app has migrated: grant them then.
        post_migrate.connect(grant_curator_permissions, sender=self)
