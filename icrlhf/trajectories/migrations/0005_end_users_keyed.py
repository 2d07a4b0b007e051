from typing import Any

from django.db import migrations
from django.utils.crypto import salted_hmac

# trajectories.services.end_user_key's salt: the runs' owners must hash as new calls do.
_END_USER_SALT = "icrlhf.trajectories.end_user"


def end_users_keyed(apps: Any, schema_editor: Any) -> None:
    """End users' ids were stored as the calls sent them: they become the keyed hash new calls
    are matched by, so that each end user's runs go on (and the ids themselves go)."""
    Trajectory = apps.get_model("trajectories", "Trajectory")
    for trajectory in Trajectory.objects.exclude(end_user="").only("end_user").iterator():
        keyed = salted_hmac(_END_USER_SALT, trajectory.end_user, algorithm="sha256").hexdigest()
        Trajectory.objects.filter(pk=trajectory.pk).update(end_user=keyed)


class Migration(migrations.Migration):
    dependencies = [("trajectories", "0004_run_owner")]

    operations = [migrations.RunPython(end_users_keyed, migrations.RunPython.noop)]
