from typing import Any

from django.db import migrations
from django.utils.crypto import salted_hmac

# trajectories.services.end_user_key's salt, as trajectories/0005 uses it.
_END_USER_SALT = "icrlhf.trajectories.end_user"


def end_users_out_of_options(apps: Any, schema_editor: Any) -> None:
    """Calls logged before stored the end user's id in their options (`user`) as sent, and
    their review items copied it: the calls keep the keyed hash new calls store, the items
    nothing (a review item never needed who asked). Done once, here, rather than by retention,
    which never reaches calls kept forever."""
    Call = apps.get_model("gateway", "Call")
    for call in Call.objects.filter(options__has_key="user").only("options").iterator():
        user = str(call.options["user"])
        keyed = salted_hmac(_END_USER_SALT, user, algorithm="sha256").hexdigest()
        Call.objects.filter(pk=call.pk).update(options={**call.options, "user": keyed})
    Item = apps.get_model("queues", "Item")
    for item in Item.objects.filter(call_options__has_key="user").only("call_options").iterator():
        kept = {name: value for name, value in item.call_options.items() if name != "user"}
        Item.objects.filter(pk=item.pk).update(call_options=kept)


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0005_call_memory_confidence"),
        ("queues", "0022_queue_format_examples_from"),
        ("trajectories", "0005_end_users_keyed"),
    ]

    operations = [migrations.RunPython(end_users_out_of_options, migrations.RunPython.noop)]
