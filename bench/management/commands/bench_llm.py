import json
import statistics
import subprocess
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.ops.local_llm import build_features

# Runs in a child process, so the llama.cpp on its PYTHONPATH is the one measured (and a
# build this CPU cannot run kills the child, not the benchmark).
_MEASURE = """
import json, sys, time
from llama_cpp import Llama
model, runs, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=model, n_ctx=2048, n_threads=1, verbose=False, seed=7)
prompt = [{"role": "user", "content": "Write a short story about a lost bank card."}]
results = []
for _ in range(runs + 1):  # the first run warms caches up and is dropped
    started = time.perf_counter()
    out = llm.create_chat_completion(prompt, max_tokens=tokens, temperature=0.0)
    seconds = time.perf_counter() - started
    results.append({"seconds": seconds, "completion_tokens": out["usage"]["completion_tokens"]})
print(json.dumps(results[1:]))
"""


class Command(BaseCommand):
    help = "Tokens per second of the installed llama.cpp build on the local model (one thread)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=5)
        parser.add_argument("--tokens", type=int, default=128, help="Tokens per answer.")
        parser.add_argument("--json", action="store_true", help="End with one JSON line.")

    def handle(self, *args: Any, **options: Any) -> None:
        model = settings.LOCAL_LLM_MODEL_PATH
        if not model.is_file():
            raise CommandError(f"No model at {model}: run `manage.py build_models --llm`.")
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _MEASURE,
                str(model),
                str(options["runs"]),
                str(options["tokens"]),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise CommandError(
                f"The local LLM failed (exit {done.returncode}): {done.stderr[-500:]}"
            )
        runs = json.loads(done.stdout.strip().splitlines()[-1])
        rates = [run["completion_tokens"] / run["seconds"] for run in runs]
        features = sorted(build_features())
        result = {
            "build_features": features,
            "runs": len(runs),
            "tokens_per_answer": statistics.median(run["completion_tokens"] for run in runs),
            "tokens_per_s_median": round(statistics.median(rates), 1),
            "tokens_per_s_min": round(min(rates), 1),
            "answer_s_median": round(statistics.median(run["seconds"] for run in runs), 3),
        }
        self.stdout.write(
            f"llama.cpp built for {' '.join(features)}: {result['tokens_per_s_median']} tokens/s "
            f"(median of {len(runs)} answers of ~{result['tokens_per_answer']:.0f} tokens, "
            f"min {result['tokens_per_s_min']}), {result['answer_s_median']} s an answer, "
            "one thread"
        )
        if options["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))
