"""bench_bfcl's data, checker and measurement (see the command's docstring).

The Berkeley Function Calling Leaderboard's public entries, read from the `bfcl-eval`
package's data files (installed without its dependencies: `.venv/bin/pip install --no-deps
bfcl-eval==2026.3.23`, see docs/benchmarks.md). Its own AST checker imports every model
handler the leaderboard knows (anthropic, cohere, torch, …), so it does not import here; the
checker below applies the same rules to the same possible answers: the function's name (a
dot written as an underscore, as OpenAI's names must be), every required parameter, no
parameter the function or the answer does not have, each value among the possible values
(strings compared without case, spaces or ",./-_*^"; an integer accepted for a float), an
optional parameter left out only where the answer allows it ("" among its values), and for
several calls each matched to one expected call, in any order.

The `live_*` categories are never read: they are held back for the project's own checks."""

import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from openai import OpenAI

from bench.reviewed import answer_chosen, examples_indexed
from bench.world import percentile
from icrlhf.gateway.models import Call
from icrlhf.ingest.services import token_create
from icrlhf.insights.stats import wilson
from icrlhf.queues.models import Item, Queue

CATEGORIES = ("simple_python", "multiple", "parallel")
TIMEOUT_S = 600

# BFCL's types as JSON Schema's (its "dict" is an object, "float" a number, "tuple" an array).
_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}
# Its types as Python's, for the checker ("any": whatever the model sent).
_PYTHON_TYPES: dict[str, type | None] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": None,
}
_IGNORED_IN_STRINGS = re.compile(r"[ ,./\-_*^]")


@dataclass(frozen=True)
class Entry:
    id: str
    category: str
    messages: list[dict[str, Any]]  # the question: OpenAI messages, a user's request last
    functions: list[dict[str, Any]]  # as BFCL describes them
    answers: list[dict[str, dict[str, list[Any]]]]  # one {name: {parameter: possible values}}

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [openai_tool(function) for function in self.functions]

    @property
    def request(self) -> str:
        return str(self.messages[-1]["content"])


def entries(category: str) -> list[Entry]:
    """A category's entries with their possible answers, in the package's order."""
    if category not in CATEGORIES:
        raise ValueError(f"Unknown or held-back BFCL category {category!r}: use {CATEGORIES}.")
    data = resources.files("bfcl_eval") / "data"
    questions = _json_lines((data / f"BFCL_v4_{category}.json").read_text())
    answers = {
        row["id"]: row["ground_truth"]
        for row in _json_lines((data / "possible_answer" / f"BFCL_v4_{category}.json").read_text())
    }
    return [
        Entry(
            id=row["id"],
            category=category,
            messages=list(row["question"][0]),
            functions=list(row["function"]),
            answers=answers[row["id"]],
        )
        for row in questions
        if row["id"] in answers and len(row["question"]) == 1
    ]


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def openai_name(name: str) -> str:
    """A BFCL function's name as OpenAI accepts one (^[a-zA-Z0-9_-]+$: no dots)."""
    return name.replace(".", "_")


def openai_tool(function: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": openai_name(function["name"]),
            "description": function.get("description", ""),
            "parameters": _schema(function.get("parameters") or {"type": "dict"}),
        },
    }


def _schema(node: Any) -> Any:
    """BFCL's parameter description as JSON Schema: its own type names replaced, the rest
    (properties, items, required, enum, descriptions) kept."""
    if isinstance(node, list):
        return [_schema(value) for value in node]
    if not isinstance(node, dict):
        return node
    schema = {key: _schema(value) for key, value in node.items()}
    if isinstance(node.get("type"), str):
        schema["type"] = _SCHEMA_TYPES.get(node["type"], node["type"])
    return schema


def gold_calls(entry: Entry) -> list[dict[str, Any]]:
    """The expected calls as OpenAI tool calls: each parameter's first possible value, an
    optional one left out where its first possible value is "" (not given)."""
    calls = []
    for number, answer in enumerate(entry.answers):
        ((name, parameters),) = answer.items()
        function = next(f for f in entry.functions if f["name"] == name)
        required = frozenset((function.get("parameters") or {}).get("required") or [])
        arguments = _first_values(parameters, required=required)
        calls.append(
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {"name": openai_name(name), "arguments": json.dumps(arguments)},
            }
        )
    return calls


def _first_values(
    possible: dict[str, list[Any]], required: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Each key's first possible value, a key whose first is "" (not given) left out unless
    it is `required` (then its first given value: one answer allows a required parameter
    left out); a dict value's own keys hold possible values too, as do those of each dict
    in a list."""

    def first(value: Any) -> Any:
        if isinstance(value, dict):
            return _first_values(value)
        if isinstance(value, list):
            return [first(item) if isinstance(item, dict) else item for item in value]
        return value

    chosen = {
        key: next((v for v in values if v != ""), "") if key in required else values[0]
        for key, values in possible.items()
    }
    return {key: first(value) for key, value in chosen.items() if value != ""}


# ---------------------------------------------------------------- the checker


def calls_correct(entry: Entry, calls: list[tuple[str, Any]]) -> bool:
    """Whether the model's calls (name, parsed arguments) are exactly the expected ones: as
    many, each matching one expected call (any order)."""
    if len(calls) != len(entry.answers):
        return False
    described = {function["name"]: function for function in entry.functions}

    def match(expected: list[dict[str, dict[str, list[Any]]]], left: list[int]) -> bool:
        if not expected:
            return True
        ((name, possible),) = expected[0].items()
        return any(
            call_correct(described[name], calls[i], possible) and match(expected[1:], rest)
            for i in left
            for rest in [[j for j in left if j != i]]
        )

    return match(entry.answers, list(range(len(calls))))


def call_correct(
    function: dict[str, Any], call: tuple[str, Any], possible: dict[str, list[Any]]
) -> bool:
    """One call against one expected call (`possible`: each parameter's possible values)."""
    name, arguments = call
    if name not in (function["name"], openai_name(function["name"])):
        return False
    if not isinstance(arguments, dict):
        return False
    parameters = function.get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties") or {}
    if any(required not in arguments for required in parameters.get("required") or []):
        return False
    for key, value in arguments.items():
        if key not in properties or key not in possible:
            return False
        if not _value_correct(properties[key], value, possible[key]):
            return False
    return all(key in arguments or "" in values for key, values in possible.items())


def _value_correct(described: dict[str, Any], value: Any, possible: list[Any]) -> bool:
    kind = str(described.get("type", "any"))
    expected = _PYTHON_TYPES.get(kind)
    if expected is float and type(value) is int:
        value = float(value)  # an integer is a fine float
    if expected is not None and type(value) is not expected:
        return False
    if isinstance(value, str):
        return _standard(value) in [_standard(p) for p in possible if isinstance(p, str)]
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            return any(_dicts_correct(value, p) for p in possible if isinstance(p, list))
        return _standard_list(value) in [_standard_list(p) for p in possible if isinstance(p, list)]
    if isinstance(value, dict):
        return any(_dict_correct(value, p) for p in possible if isinstance(p, dict))
    return value in possible


def _standard(text: str) -> str:
    """A string as compared: "April 1, 2024" is "april12024"."""
    return _IGNORED_IN_STRINGS.sub("", text).lower().replace("'", '"')


def _standard_list(values: list[Any]) -> list[Any]:
    return [_standard(v) if isinstance(v, str) else v for v in values]


def _dict_correct(value: dict[str, Any], possible: dict[str, list[Any]]) -> bool:
    """A dict parameter: each key one the answer has, with one of its values; each key left
    out one the answer allows to be."""
    for key, given in value.items():
        if key not in possible:
            return False
        allowed = [_standard(p) if isinstance(p, str) else p for p in possible[key]]
        if (_standard(given) if isinstance(given, str) else given) not in allowed:
            return False
    return all(key in value or "" in values for key, values in possible.items())


def _dicts_correct(value: list[dict[str, Any]], possible: list[Any]) -> bool:
    return len(value) == len(possible) and all(
        isinstance(p, dict) and _dict_correct(v, p) for v, p in zip(value, possible, strict=True)
    )


def parsed_calls(tool_calls: list[Any]) -> list[tuple[str, Any]]:
    """An answer's tool calls as (name, arguments); arguments that are not JSON are kept as
    their text (and then match nothing)."""
    parsed = []
    for call in tool_calls:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except ValueError:
            arguments = call.function.arguments
        parsed.append((call.function.name, arguments))
    return parsed


# ---------------------------------------------------------------- memory


def split(
    categories: list[str], *, held_out: int, stored: int, seed: int
) -> tuple[list[Entry], list[Entry]]:
    """Held-out entries (as evenly as the categories allow) and up to `stored` other entries
    to remember, drawn from the same categories, shuffled alike."""
    rng = random.Random(seed)
    pools = {category: entries(category) for category in categories}
    for pool in pools.values():
        rng.shuffle(pool)
    asked = [pool[i] for i in range(held_out) for pool in pools.values() if i < len(pool)][
        :held_out
    ]
    taken = {entry.id for entry in asked}
    rest = [entry for pool in pools.values() for entry in pool if entry.id not in taken]
    rng.shuffle(rest)
    return asked, rest[:stored]


def remember(queue: Queue, entry: Entry, reviewer: User) -> None:
    """A gold call into memory, through the review flow's own path (as bench_agent stores an
    expert's step): an item with the question and its tools, whose one candidate is the
    expected call, picked by a reviewer; the decision stores the example and the worker
    indexes it."""
    item = Item.objects.create(
        queue=queue,
        input_text=entry.request,
        source=Item.Source.GATEWAY,
        status=Item.Status.READY,
        conversation=entry.messages,
        call_options={"tools": entry.tools},
    )
    answer_chosen(item, model="bfcl-gold", reviewer=reviewer, tool_calls=gold_calls(entry))


# ---------------------------------------------------------------- the measurement


@dataclass(frozen=True)
class Outcome:
    correct: bool
    called: bool  # any tool call at all
    foreign: bool = False  # a call naming a tool the request did not offer reached us
    error: str = ""
    status: int = 200  # the gateway's answer; 0 when it gave none


def _status(failure: Exception) -> int:
    return int(getattr(failure, "status_code", 0) or 0)


def ask(client: OpenAI, model: str, entry: Entry, max_tokens: int) -> Outcome:
    """One held-out entry through the gateway, as an application calls it."""
    try:
        answer = client.chat.completions.create(
            model=model,
            messages=entry.messages,  # type: ignore[arg-type]
            tools=entry.tools,  # type: ignore[arg-type]
            max_tokens=max_tokens,
        )
    except Exception as failure:  # counted as a miss, and reported
        return Outcome(
            correct=False, called=False, error=str(failure)[:300], status=_status(failure)
        )
    calls = parsed_calls(list(answer.choices[0].message.tool_calls or []))
    offered = {tool["function"]["name"] for tool in entry.tools}
    return Outcome(
        correct=calls_correct(entry, calls),
        called=bool(calls),
        foreign=any(name not in offered for name, _ in calls),
    )


def rates(outcomes: list[Outcome]) -> dict[str, Any]:
    """Exact-call accuracy and the any-call rate, with Wilson 95% intervals."""
    total = len(outcomes)

    def rate(hits: int) -> tuple[float, list[float]]:
        low, high = wilson(hits, total)
        return round(hits / total, 3) if total else 0.0, [round(low, 3), round(high, 3)]

    accuracy, accuracy_ci = rate(sum(o.correct for o in outcomes))
    called, called_ci = rate(sum(o.called for o in outcomes))
    return {
        "calls": total,
        "accuracy": accuracy,
        "accuracy_ci95": accuracy_ci,
        "any_call": called,
        "any_call_ci95": called_ci,
        "foreign_calls": sum(o.foreign for o in outcomes),
        "failed_calls": sum(bool(o.error) for o in outcomes),
        "lost_to_deadline": sum(o.status == 504 for o in outcomes),
        "refused_too_busy": sum(o.status == 503 for o in outcomes),
        "first_error": next((o.error for o in outcomes if o.error), ""),
    }


def _run(
    client: OpenAI, queue: Queue, held_out: list[Entry], options: dict[str, Any]
) -> dict[str, Any]:
    def asked(entry: Entry) -> Outcome:
        return ask(client, queue.slug, entry, options["max_tokens"])

    logged_before = Call.objects.filter(queue=queue).count()
    with ThreadPoolExecutor(max_workers=options["concurrency"]) as pool:
        outcomes = list(pool.map(asked, held_out))
    row = rates(outcomes)
    row["time"] = time_spent(_logged(queue, logged_before + len(held_out))[: len(held_out)])
    pairs = list(zip(outcomes, held_out, strict=True))
    row["by_category"] = {
        category: rates([o for o, e in pairs if e.category == category])
        for category in options["categories"]
    }
    return row


def _logged(queue: Queue, count: int) -> list[Call]:
    """The queue's newest calls once `count` are logged (the gateway writes its rows just
    after answering), newest first."""
    deadline = time.monotonic() + 60
    while Call.objects.filter(queue=queue).count() < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return list(Call.objects.filter(queue=queue).order_by("-created_at"))


def time_spent(calls: list[Call]) -> dict[str, Any]:
    """Where the calls' time went, from their log rows: the median and p95 of the whole call,
    of the upstream, and of its parts as the model's server reports them (waiting for a
    slot, reading the prompt, writing the answer), the prompt's tokens, and how many calls
    asked the model twice."""

    def spread(values: list[int | None]) -> dict[str, float | None]:
        known = [float(v) for v in values if v is not None]
        if not known:
            return {"p50": None, "p95": None}
        return {"p50": percentile(known, 50), "p95": percentile(known, 95)}

    return {
        "total_ms": spread([c.total_ms for c in calls]),
        "upstream_ms": spread([c.upstream_ms for c in calls]),
        "waited_ms": spread([c.waited_ms for c in calls]),
        "model_prompt_ms": spread([c.model_prompt_ms for c in calls]),
        "model_generation_ms": spread([c.model_generation_ms for c in calls]),
        "prompt_tokens": spread([c.prompt_tokens for c in calls]),
        "cached_prompt_tokens": spread([c.cached_prompt_tokens for c in calls]),
        "asked_twice": sum(c.asks > 1 for c in calls),
    }


def measure(options: dict[str, Any]) -> dict[str, Any]:
    sizes = sorted({int(s) for s in str(options["stored"]).split(",") if s.strip()})
    held_out, stored = split(
        options["categories"], held_out=options["held_out"], stored=max(sizes), seed=options["seed"]
    )
    queue = Queue.objects.create(
        slug="bfcl",
        name="bfcl",
        system_prompt="",  # BFCL's questions are the whole request
        k_examples=options["k"],
        example_token_budget=options["token_budget"],
        max_tokens=options["max_tokens"],
        temperature=options["temperature"],
        memory_candidates=0,
        capture_percent=0,
        example_framing=Queue.ExampleFraming.TURNS,
    )
    client = OpenAI(
        base_url=options["gateway_url"],
        api_key=token_create(queue=queue, name="bench")[1],
        timeout=TIMEOUT_S,
        max_retries=0,
    )
    reviewer = get_user_model().objects.create_user("bfcl-reviewer")
    arms: dict[str, dict[str, Any]] = {}
    remembered = 0
    for size in sizes:
        for entry in stored[remembered:size]:
            remember(queue, entry, reviewer)
        remembered = size
        examples_indexed([queue], timeout_s=TIMEOUT_S)
        if size == 0:
            arms["empty"] = _run(client, queue, held_out, options)
            continue
        # Every stored step is a reviewer's, of no token's call: shared by the whole queue.
        for arm, source in (
            ("same_tool_set", Queue.FormatExamples.OFF),
            ("format_examples", Queue.FormatExamples.QUEUE),
        ):
            Queue.objects.filter(pk=queue.pk).update(format_examples_from=source)
            arms[f"{arm}_{size}"] = _run(client, queue, held_out, options)
    return {
        "arms": arms,
        "stored": sizes,
        "held_out": len(held_out),
        "categories": options["categories"],
        "k": options["k"],
        "held_out_ids": [entry.id for entry in held_out],
    }
