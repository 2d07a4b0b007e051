"""Roles move from install-wide groups onto each queue membership.

The plain many-to-many's table becomes the Membership model's (no data is copied), gains a
role, and each membership takes the role its user had everywhere: the `curator` group makes a
curator, the `reviewer` group a reviewer, and a member in neither (who could only look) a
viewer. The `admin` group stays install-wide. The `reviewer` and `curator` groups are left in
place, unused, so that nothing an operator granted them is lost silently."""

import django.db.models.deletion
from django.apps.registry import Apps
from django.conf import settings
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def roles_from_groups(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    membership = apps.get_model("queues", "Membership")
    user_model = apps.get_model(settings.AUTH_USER_MODEL)
    for role in ("reviewer", "curator"):  # curator second: it wins for someone in both
        users = user_model.objects.filter(groups__name=role).values("pk")
        membership.objects.filter(user__in=users).update(role=role)


def groups_from_roles(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Back to install-wide groups: someone who was a curator anywhere becomes one everywhere
    (the old model could not say less)."""
    membership = apps.get_model("queues", "Membership")
    group_model = apps.get_model("auth", "Group")
    for role in ("reviewer", "curator"):
        group, _created = group_model.objects.get_or_create(name=role)
        users = membership.objects.filter(role=role).values_list("user", flat=True).distinct()
        group.user_set.add(*users)


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0007_automation"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "queue",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, to="queues.queue"
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "queues_queue_members",
                        "unique_together": {("queue", "user")},
                    },
                ),
                migrations.AlterField(
                    model_name="queue",
                    name="members",
                    field=models.ManyToManyField(
                        blank=True,
                        help_text="Who may see this queue, each with a role in it (superusers "
                        "see every queue).",
                        related_name="queues",
                        through="queues.Membership",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.AddField(
            model_name="membership",
            name="role",
            field=models.CharField(
                choices=[
                    ("viewer", "Viewer (sees the queue, cannot decide)"),
                    ("reviewer", "Reviewer (creates items, decides)"),
                    ("curator", "Curator (also curates memory, routing, import and export)"),
                ],
                default="viewer",
                max_length=20,
            ),
        ),
        migrations.RunPython(roles_from_groups, groups_from_roles),
        # New memberships are reviewers unless said otherwise; existing ones were set above.
        migrations.AlterField(
            model_name="membership",
            name="role",
            field=models.CharField(
                choices=[
                    ("viewer", "Viewer (sees the queue, cannot decide)"),
                    ("reviewer", "Reviewer (creates items, decides)"),
                    ("curator", "Curator (also curates memory, routing, import and export)"),
                ],
                default="reviewer",
                max_length=20,
            ),
        ),
    ]
