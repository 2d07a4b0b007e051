from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

# The historical model still has the boolean; the type checker reads today's, which has not.
BOOLEAN = "format_examples"


def from_the_boolean(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """A queue that sent format examples keeps them, from each token's own calls: the
    boolean shared every token's whole turns; what a token receives is now chosen by a
    curator, never granted by a migration."""
    queue = apps.get_model("queues", "Queue")
    queue.objects.filter(**{BOOLEAN: False}).update(format_examples_from="off")
    queue.objects.filter(**{BOOLEAN: True}).update(format_examples_from="token")


def to_the_boolean(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    queue = apps.get_model("queues", "Queue")
    queue.objects.filter(format_examples_from="off").update(**{BOOLEAN: False})
    queue.objects.exclude(format_examples_from="off").update(**{BOOLEAN: True})


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0021_queue_format_examples"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="format_examples_from",
            field=models.CharField(
                choices=[
                    ("off", "off"),
                    ("token", "from the calls of the calling token only"),
                    (
                        "queue",
                        "from the calls of every token of the queue (shares only the form of "
                        "tool calls: tool and argument names, never words or values)",
                    ),
                ],
                default="token",
                help_text="When fewer than k stored steps were made with the tools a request "
                "offers, the "
                "places left may go to stored tool calls of other tool sets, to show how a call"
                " is written (it helps a model that answers in prose where it should call a "
                "tool: docs/benchmarks.md, BFCL). Only the form of each call is sent: the "
                "tool's name and the names of its arguments, each value replaced by a "
                "placeholder of its type; never the request, the words beside the call, the "
                "argument values or the tools' results. Their tools are not offered, and a call"
                " naming a tool the request did not offer is never returned. They are chosen by"
                " the tools they call, not by how similar their requests are, and carry nothing"
                " of those requests: the minimum similarity does not apply to them.",
                max_length=10,
                verbose_name="format examples",
            ),
        ),
        migrations.RunPython(from_the_boolean, to_the_boolean),
        migrations.RemoveField(model_name="queue", name="format_examples"),
    ]
