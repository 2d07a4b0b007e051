"""Curators can curate on a new install: one `migrate` on an empty database gives the curator
group its admin permissions (they were granted only by a second migrate before)."""

import subprocess
from pathlib import Path

from icrlhf.ops.benchworld import MANAGE, world_database, world_env, world_migrate
from icrlhf.queues.roles import CURATOR_PERMISSIONS


def test_a_single_migrate_on_an_empty_database_gives_curators_their_permissions(
    tmp_path: Path,
) -> None:
    with world_database(tmp_path) as database_url:  # PostgreSQL in the PostgreSQL pass
        env = world_env(tmp_path, database_url=database_url)
        world_migrate(env)
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
            env=env,
            capture_output=True,
            text=True,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(sorted(CURATOR_PERMISSIONS))
