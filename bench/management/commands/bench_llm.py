import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from bench.world import add_llm_options, local_llm_chosen
from icrlhf.ops.local_llm import build_features
from icrlhf.ops.stack import Stack, free_port, local_llm_threads

PROMPT = [{"role": "user", "content": "Write a short story about a lost bank card."}]


def _answer(api_base: str, model: str, tokens: int) -> dict[str, float]:
    """One greedy answer from the server, timed from the request to its last byte."""
    body = json.dumps(
        {"model": model, "messages": PROMPT, "max_tokens": tokens, "temperature": 0.0}
    ).encode()
    request = urllib.request.Request(
        f"{api_base}/chat/completions",
        data=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {settings.LLM_API_KEY}",
        },
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310 (loopback)
        answer = json.load(response)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "completion_tokens": answer["usage"]["completion_tokens"]}


@dataclass(frozen=True)
class Wave:
    """The answers asked at once in one run, and the time until the last one ended."""

    answers: list[dict[str, float]]
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return sum(answer["completion_tokens"] for answer in self.answers) / self.seconds


class Command(BaseCommand):
    help = (
        "Tokens per second of the installed llama-server on the local model, as the product "
        "runs it (over HTTP; one answer at a time, or --concurrent at once)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=5)
        parser.add_argument("--tokens", type=int, default=128, help="Tokens per answer.")
        parser.add_argument(
            "--concurrent",
            type=int,
            default=1,
            help="Answers asked at once, each run (a local server gets as many slots).",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="llama-server's threads (default: as the product starts it).",
        )
        add_llm_options(parser)
        parser.add_argument("--json", action="store_true", help="End with one JSON line.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["llm_api_base"]:  # another server: its speed, as any client sees it
            features: list[str] = []
            threads: int | None = None
            model = options["llm_model"] or f"openai/{local_llm_chosen(options)[0].alias}"
            model = model.removeprefix("openai/")
            runs = self._runs(options["llm_api_base"], model, options)
            served_by = f"{model} at {options['llm_api_base']}"
        else:
            features, threads, runs = self._local_runs(options)
            served_by = f"llama-server built for {' '.join(features)}"
        answers = [answer for wave in runs for answer in wave.answers]
        rates = [answer["completion_tokens"] / answer["seconds"] for answer in answers]
        result = {
            "build_features": features,
            "threads": threads,
            "runs": len(runs),
            "concurrent": options["concurrent"],
            "tokens_per_answer": statistics.median(a["completion_tokens"] for a in answers),
            "tokens_per_s_median": round(statistics.median(rates), 1),
            "tokens_per_s_min": round(min(rates), 1),
            "answer_s_median": round(statistics.median(a["seconds"] for a in answers), 3),
            # All the answers of a run, over the time until the last one ended.
            "tokens_per_s_together": round(statistics.median(w.tokens_per_s for w in runs), 1),
        }
        self.stdout.write(
            f"{served_by}: {result['tokens_per_s_median']} "
            f"tokens/s (median of {len(answers)} answers of ~{result['tokens_per_answer']:.0f} "
            f"tokens, min {result['tokens_per_s_min']}), {result['answer_s_median']} s an "
            f"answer, {threads or 'unknown'} thread(s); {options['concurrent']} at once: "
            f"{result['tokens_per_s_together']} tokens/s together"
        )
        if options["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))

    def _local_runs(self, options: dict[str, Any]) -> tuple[list[str], int, list[Wave]]:
        """The installed llama-server's build, threads and answers, started here as the
        product starts it but with a slot for each answer asked at once."""
        model, path = local_llm_chosen(options)
        if not path.is_file():
            raise CommandError(f"No model at {path}: run `manage.py build_models --llm`.")
        threads = options["threads"] or local_llm_threads()
        api_base = f"http://127.0.0.1:{free_port()}/v1"
        server = Stack(log_dir=settings.VAR_DIR / "bench" / "logs")
        try:
            slots = options["concurrent"]
            server.start_local_llm(api_base, path, model, slots=slots, threads=threads)
            return sorted(build_features()), threads, self._runs(api_base, model.alias, options)
        except (OSError, RuntimeError) as error:
            raise CommandError(f"The local LLM failed: {error}") from error
        finally:
            server.stop()

    def _runs(self, api_base: str, model: str, options: dict[str, Any]) -> list[Wave]:
        """`--runs` timed runs of `--concurrent` answers asked at once; the first run warms
        the caches up and is dropped."""
        at_once = options["concurrent"]

        def wave() -> Wave:
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=at_once) as pool:
                answers = list(
                    pool.map(lambda _: _answer(api_base, model, options["tokens"]), range(at_once))
                )
            return Wave(answers=answers, seconds=time.perf_counter() - started)

        try:
            waves = [wave() for _ in range(options["runs"] + 1)]
        except OSError as error:
            raise CommandError(f"The LLM at {api_base} failed: {error}") from error
        return waves[1:]
