import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from bench.embedders import BASELINE, DATASETS, candidates_parse, measure, table


class Command(BaseCommand):
    help = (
        "Candidate embedding models against the product's own: kNN top-1 on Banking77 and "
        "CLINC150 and embedding speed, one thread as the product embeds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--models",
            default=BASELINE,
            help=(
                f"Comma list: `{BASELINE}` (the product's model folder) and `name=/path/to/folder` "
                "candidates in the same layout. Differences are against the baseline when listed."
            ),
        )
        parser.add_argument("--datasets", default=",".join(DATASETS))
        parser.add_argument("--stored", type=int, default=600, help="Labelled messages stored.")
        parser.add_argument("--held-out", type=int, default=1000, help="Messages predicted.")
        parser.add_argument("--seed", type=int, default=0, help="Of the split.")
        parser.add_argument("--single-calls", type=int, default=200)
        parser.add_argument(
            "--batches", type=int, default=10, help="Lots of 32 texts timed, by 8 and by 32."
        )
        parser.add_argument("--json", action="store_true", help="End with one JSON line.")

    def handle(self, *args: Any, **options: Any) -> None:
        datasets = [name.strip() for name in options["datasets"].split(",") if name.strip()]
        unknown = sorted(set(datasets) - set(DATASETS))
        if unknown or not datasets:
            raise CommandError(f"--datasets: choose from {', '.join(DATASETS)} (got {unknown})")
        try:
            candidates = candidates_parse(options["models"])
            result = measure(
                candidates,
                datasets=datasets,
                stored=options["stored"],
                held_out=options["held_out"],
                seed=options["seed"],
                single_calls=options["single_calls"],
                batches=options["batches"],
            )
        except (ValueError, OSError) as error:
            raise CommandError(str(error)) from error
        self.stdout.write(
            f"kNN top-1 with {result['stored']} stored, {result['held_out']} held out (seed "
            f"{result['seed']}); speed with {result['threads']} thread(s), "
            f"{result['single_calls']} single-text calls, {result['batch_texts']} texts in "
            "batches of 8 and of 32:"
        )
        for line in table(result):
            self.stdout.write(line)
        if options["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))
