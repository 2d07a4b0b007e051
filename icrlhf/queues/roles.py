"""The roles' permissions in the admin, granted by a data migration (memory 0002) once every
permission they name exists, and again by the test factories after a database flush."""

from typing import Any

# What the curator role may do in the admin (staff status is still needed to enter it).
CURATOR_PERMISSIONS = (
    "memory.view_example",
    "memory.change_example",
    "memory.delete_example",
    "memory.view_curationevent",
)


def curator_permissions_grant(*, group_model: Any, permission_model: Any) -> None:
    """Takes the models as arguments so that a migration can pass its historical ones."""
    curator, _created = group_model.objects.get_or_create(name="curator")
    for dotted in CURATOR_PERMISSIONS:
        app_label, codename = dotted.split(".")
        curator.permissions.add(
            permission_model.objects.get(content_type__app_label=app_label, codename=codename)
        )
