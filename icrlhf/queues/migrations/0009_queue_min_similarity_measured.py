import django.core.validators
from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

# The default before it was measured, and the one the learning benchmark's sweep chose.
PREVIOUS_DEFAULT = 0.2
MEASURED_DEFAULT = 0.4


def queues_at_the_old_default_move(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Queues still at the old, unmeasured default take the measured one: 0.2 let unrelated
    examples (similarity 0.25–0.37) into prompts. A minimum someone chose is kept."""
    queue = apps.get_model("queues", "Queue")
    queue.objects.filter(min_similarity=PREVIOUS_DEFAULT).update(min_similarity=MEASURED_DEFAULT)


class Migration(migrations.Migration):
    dependencies = [("queues", "0008_membership_roles")]

    operations = [
        migrations.AlterField(
            model_name="queue",
            name="min_similarity",
            field=models.FloatField(
                default=MEASURED_DEFAULT,
                help_text="Stored examples less similar than this (cosine) to a request are left "
                "out of its prompt and never offered or served as its answer; the item page "
                "lists them. Pinned examples stay in every prompt. -1: no minimum.",
                validators=[
                    django.core.validators.MinValueValidator(-1.0),
                    django.core.validators.MaxValueValidator(1.0),
                ],
                verbose_name="minimum similarity",
            ),
        ),
        # Going back leaves every queue's minimum as it is: the old default is not restored
        # over a value that may have been chosen since.
        migrations.RunPython(queues_at_the_old_default_move, migrations.RunPython.noop),
    ]
