"""Every model change has its migration: a help text edited in a model and not migrated would
make the next `makemigrations` of someone else's change carry it."""

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_models_match_their_migrations() -> None:
    # --check exits non-zero (SystemExit) when a migration is missing.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
