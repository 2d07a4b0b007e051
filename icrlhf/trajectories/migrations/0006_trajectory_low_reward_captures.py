from typing import Any

from django.db import migrations, models
from django.db.models import Count


def low_reward_captures_counted(apps: Any, schema_editor: Any) -> None:
    """The low-reward captures each run has now (those deleted or found duplicate before this
    count was kept cannot be told from the others any more)."""
    Trajectory = apps.get_model("trajectories", "Trajectory")
    Step = apps.get_model("trajectories", "Step")
    counts = (
        Step.objects.filter(call__capture="low_reward")
        .values("trajectory_id")
        .annotate(captures=Count("pk"))
        .order_by()
    )
    for row in counts:
        Trajectory.objects.filter(pk=row["trajectory_id"]).update(
            low_reward_captures=row["captures"]
        )


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0005_call_memory_confidence"),
        ("trajectories", "0005_end_users_keyed"),
    ]

    operations = [
        migrations.AddField(
            model_name="trajectory",
            name="low_reward_captures",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(low_reward_captures_counted, migrations.RunPython.noop),
    ]
