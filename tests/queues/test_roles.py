"""Curators can curate on a new install: one `migrate` on an empty database gives the curator
group its admin permissions (they were granted only by a second migrate before)."""

import subprocess

from bench.world import MANAGE, world
from icrlhf.queues.roles import CURATOR_PERMISSIONS


def test_a_single_migrate_on_an_empty_database_gives_curators_their_permissions() -> None:
    with world("roles") as here:  # a scratch PostgreSQL database in the PostgreSQL pass
        done = subprocess.run(
            [
                *MANAGE,
                "shell",
                "--no-imports",
                "-c",
                "from django.contrib.auth.models import Group;"
                "print(sorted(f'{p.content_type.app_label}.{p.codename}'"
                " for p in Group.objects.get(name='curator').permissions.all()))",
            ],
            env=here.env,
            capture_output=True,
            text=True,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(sorted(CURATOR_PERMISSIONS))
