"""Tokens get scopes. Tokens made before could call everything, and keep every scope so no
integration breaks on upgrade; an admin narrows them on the token's page. New tokens get
items, gateway and feedback, and the export only when asked for."""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

import icrlhf.ingest.models

EVERY_SCOPE = ["items", "gateway", "export", "feedback"]


def existing_tokens_keep_every_scope(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("ingest", "IntegrationToken").objects.update(scopes=EVERY_SCOPE)


class Migration(migrations.Migration):
    dependencies = [("ingest", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="integrationtoken",
            name="scopes",
            field=models.JSONField(
                default=icrlhf.ingest.models.default_scopes,
                help_text="What the token may call: items, gateway, export, feedback.",
            ),
        ),
        migrations.RunPython(existing_tokens_keep_every_scope, migrations.RunPython.noop),
    ]
