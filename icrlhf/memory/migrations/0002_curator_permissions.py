from django.apps.registry import Apps
from django.contrib.auth.management import create_permissions
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from icrlhf.queues.roles import curator_permissions_grant


def grant(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # Django creates an app's permissions after *all* migrations have run (post_migrate), so on
    # a fresh database they do not exist yet here: create the memory app's now.
    memory = apps.get_app_config("memory")
    # create_permissions skips an app without a models module; a historical app has none.
    memory.models_module = True  # type: ignore[assignment]
    create_permissions(memory, verbosity=0, apps=apps, using=schema_editor.connection.alias)
    memory.models_module = None
    curator_permissions_grant(
        group_model=apps.get_model("auth", "Group"),
        permission_model=apps.get_model("auth", "Permission"),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0001_initial"),
        ("queues", "0002_roles"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant, migrations.RunPython.noop)]
