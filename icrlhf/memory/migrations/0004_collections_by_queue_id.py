"""Collections are named by queue id now, not by the slug (which can be renamed and given to
another queue). Every example is marked for indexing again: the worker's periodic sweep
re-embeds them into their queue's new collection within minutes of the upgrade, or at once
with `python manage.py reindex`, which also drops the old slug-named collections.
Until then a queue's generations run with the examples indexed so far."""

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def examples_to_index_again(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("memory", "Example").objects.update(index_state="pending")


class Migration(migrations.Migration):
    dependencies = [("memory", "0003_example_queue_role_status")]

    operations = [migrations.RunPython(examples_to_index_again, migrations.RunPython.noop)]
