"""Fuzzing the real gateway process and the feedback API with what a hostile end user can send:
numbers past the float range, nesting deeper than a parser's recursion, escaped and raw lone
surrogates, JSON hidden inside strings, huge strings, and personal data under every key.

The gateway runs in its own process as in production (its call log written through the
journal in Redis by the writer's own process, REDACTION=all, every call captured for review),
on the database the suite runs on, so `make test` runs this on SQLite and on PostgreSQL.
For every generated body:
- no answer is a server error;
- a call that was answered is in the log within seconds, with its run's step;
- its run can be rewarded, exported (plain and anonymised) and shown on its page;
- none of the personal data planted in it is stored anywhere, nor exported.

Hypothesis keeps the examples that failed in a database of its own (FUZZ_DATABASE, by default
in the user's cache folder, so that it outlives a clean checkout on the same machine) and
tries them first on the next run; the budget of examples is fixed."""

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from django.core import serializers
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from bench.world import database_url_of
from icrlhf.gateway.models import Call
from icrlhf.ingest.models import Scope
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import Example
from icrlhf.queues.models import Queue
from icrlhf.review.models import Item
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from tests.factories import QueueFactory, UserFactory
from tests.support.caches import cache_in_redis
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import CallLogWriterProcess, GatewayProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FUZZ_DATABASE = Path(
    os.environ.get("FUZZ_DATABASE", Path.home() / ".cache" / "icrlhf" / "hypothesis")
)
BUDGET = hypothesis.settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    database=DirectoryBasedExampleDatabase(FUZZ_DATABASE),
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

# Personal data each redaction kind must catch, planted with spaces around it (so that what a
# generator writes beside it cannot make it another token).
PERSONAL = [
    "ana.lima@example.com",
    "+1 650 253 0000",
    "4111 1111 1111 1111",
    "DE89 3704 0044 0532 0130 00",
]


@dataclass(frozen=True)
class Raw:
    """JSON text written into the body as it is (what json.dumps cannot write: 1e999, nesting
    deeper than Python's recursion limit)."""

    text: str


def encoded(body: Any) -> bytes:
    """The body as JSON, with each Raw written in place of a placeholder string."""
    raws: list[str] = []

    def placeholders(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(value, dict):
            return {key: placeholders(child) for key, child in value.items()}
        if isinstance(value, list):
            return [placeholders(child) for child in value]
        return value

    text = json.dumps(placeholders(body))
    for index, raw in enumerate(raws):
        text = text.replace(f'"@@raw{index}@@"', raw)
    return text.encode("utf-8", "surrogatepass")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


planted = st.sampled_from(PERSONAL).map(lambda found: f" {found} ")
plain_text = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters=["\x00"]), max_size=12
)
# Text an end user can write: plain, with personal data, JSON inside a string (with an escaped
# lone surrogate beside personal data, or nested deeply), huge.
user_text = st.one_of(
    plain_text,
    st.builds(lambda a, p, b: a + p + b, plain_text, planted, plain_text),
    st.builds(lambda p: '{"note": "\\ud800' + p + '"}', planted),
    st.builds(lambda p: '{"x": "\\udfff' + p + '", "y": [' + '"\\ud83d"' + "]}", planted),
    st.builds(lambda p: json.dumps({"id": p, "type": p, "role": p, "tool_call_id": p}), planted),
    st.sampled_from([1_000, 50_000]).map(nested),
    st.sampled_from([1_000, 50_000]).map(lambda depth: '{"a":' * depth + "1" + "}" * depth),
    st.just("x" * 200_000),
)
# Numbers: any JSON can hold, and those past the float range, written as JSON text.
number = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["1e999", "-1e999", "1E400", "123456789e300"]).map(Raw),
)
json_value = st.recursive(
    st.none() | st.booleans() | number | user_text,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["id", "type", "role", "tool_call_id", "q"]), inner)
    ),
    max_leaves=6,
)
# Structure nested past any recursion limit, as the body's own JSON.
deep_structure = st.sampled_from([200, 5_000]).map(lambda depth: Raw(nested(depth)))
arguments = st.one_of(
    user_text,
    st.dictionaries(st.sampled_from(["id", "type", "role", "order"]), json_value).map(
        lambda value: encoded(value).decode()
    ),
)
tool_call = st.fixed_dictionaries(
    {
        "id": st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True),
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.just("lookup"), "arguments": arguments}),
    }
)
TOOL_NAMES = ["lookup", "refund"]
tool = st.builds(
    lambda name, description, parameters: {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    },
    st.sampled_from(TOOL_NAMES),
    user_text,
    st.one_of(
        st.dictionaries(st.sampled_from(["type", "properties", "maximum"]), json_value),
        deep_structure.map(lambda raw: {"type": "object", "x": raw}),
    ),
)
user_turn = st.fixed_dictionaries(
    {"role": st.just("user"), "content": user_text.filter(str.strip)},
    optional={"name": plain_text},
)
conversation = st.one_of(
    st.lists(user_turn, min_size=1, max_size=2),
    st.tuples(user_turn, tool_call, user_text).map(
        lambda parts: [
            parts[0],
            {"role": "assistant", "content": None, "tool_calls": [parts[1]]},
            {"role": "tool", "tool_call_id": parts[1]["id"], "content": parts[2]},
        ]
    ),
)
chat_body = st.fixed_dictionaries(
    {"model": st.just("desk"), "messages": conversation, "stream": st.booleans()},
    optional={
        "user": user_text,
        "tools": st.lists(tool, max_size=2),
        "tool_choice": st.one_of(
            st.just("auto"),
            st.fixed_dictionaries(
                {"type": st.just("function"), "function": st.just({"name": "lookup"})},
                optional={"extra": json_value},
            ),
        ),
        "response_format": st.fixed_dictionaries(
            {"type": st.just("json_schema")},
            optional={
                "json_schema": st.fixed_dictionaries(
                    {"name": st.just("reply"), "schema": json_value}
                )
            },
        ),
        "temperature": st.floats(0, 2) | number,
        "metadata": st.dictionaries(st.sampled_from(["trajectory_id", "app"]), plain_text),
        "service_tier": json_value,  # ignored by the gateway, as OpenAI-compatible servers do
    },
)
# A body as bytes: JSON with hostile parts, or (one in five) bytes that are not UTF-8 (a raw
# surrogate): most bodies can be answered, so that what follows an answer is fuzzed too.
chat_bytes = st.builds(
    lambda body, broken: body.replace(b"desk", b"desk\xed\xa0\x80", 1) if broken else body,
    chat_body.map(encoded),
    st.integers(0, 4).map(lambda draw: draw == 4),  # hypothesis favours 0
)


@dataclass
class Stack:
    queue: Queue
    token: str
    gateway: GatewayProcess
    api: Client
    page: Client


@pytest.fixture
def stack(tmp_path: Path, settings: Any) -> Iterator[Stack]:
    """The real gateway in production's configuration, in front of an upstream that answers
    at once; the web side (feedback, exports, pages) served in this process, on the same
    database and the same Redis."""
    prefix = cache_in_redis(settings)
    settings.REDACTION = "all"
    settings.API_REQUESTS_PER_MINUTE = 100_000
    reviewer = UserFactory()
    queue = QueueFactory(slug="desk", capture_percent=100, members=[reviewer])
    token = token_create(
        queue=queue,
        name="app",
        scopes=[Scope.GATEWAY.value, Scope.FEEDBACK.value, Scope.EXPORT.value],
    )[1]
    upstream = FixedLatencyLLM(latency_s=0.0).start()
    env = {
        "DJANGO_SETTINGS_MODULE": "icrlhf.settings",  # its cache is Redis, as in production
        "CELERY_QUEUE": prefix,  # the cache's key prefix, and a broker queue nobody reads
        "CACHE_URL": settings.CELERY_BROKER_URL,
        "DATABASE_URL": database_url_of(settings.DATABASES["default"]),
        "LLM_API_BASE": upstream.api_base,
        "REDACTION": "all",
        "GATEWAY_RECALL_TIMEOUT_S": "1",
        "GATEWAY_REQUESTS_PER_MINUTE": "100000",
        "GATEWAY_PROCESSES": "1",
    }
    gateway = GatewayProcess(env=env, log=tmp_path / "gateway.log")
    # The call log's writer in its own process, as production runs it (CALL_LOG_WRITER).
    writer = CallLogWriterProcess(env=env, log=tmp_path / "writer.log")
    page = Client()
    page.force_login(reviewer)
    try:
        gateway.wait_ready()
        yield Stack(
            queue=queue,
            token=token,
            gateway=gateway,
            api=Client(headers={"Authorization": f"Bearer {token}"}),
            page=page,
        )
    finally:
        gateway.stop()
        writer.stop()
        upstream.stop()


def chat(stack: Stack, body: bytes) -> tuple[int, str | None, bytes]:
    """Status, call id and the whole answer (a stream read to its end) of one call."""
    request = urllib.request.Request(
        f"{stack.gateway.base_url}/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("X-Icrlhf-Call"), response.read()
    except urllib.error.HTTPError as error:
        return error.code, None, error.read()


def stored() -> str:
    """Every row end users' words may reach, as JSON."""
    rows = [
        *Call.objects.all(),
        *Step.objects.all(),
        *Trajectory.objects.all(),
        *Feedback.objects.all(),
        *Item.objects.all(),
        *Example.objects.all(),
    ]
    return serializers.serialize("json", rows)


def exported(stack: Stack) -> str:
    """The queue's runs and decisions, exported plain and anonymised: each export answers 200
    with JSON lines."""
    lines = []
    for path in ("exports/trajectories", "exports/preferences"):
        for anonymize in ("false", "true"):
            response = stack.api.get(f"/api/v1/{path}", {"anonymize": anonymize})
            assert response.status_code == 200, (path, response.content[:500])
            body = b"".join(response.streaming_content).decode()
            lines += [
                json.loads(line) for line in body.split("\n") if line
            ]  # not splitlines: U+2028 is text
    return json.dumps(lines)


def assert_nothing_personal_kept(stack: Stack) -> None:
    for where, kept in (("stored", stored()), ("exported", exported(stack))):
        for found in PERSONAL:
            for form in (found, found.replace(" ", "")):
                at = kept.find(form)
                assert at < 0, f"{form!r} {where}: …{kept[max(0, at - 300) : at + 100]}…"


def assert_logged_and_usable(stack: Stack, call_id: str) -> None:
    """The answered call is in the log with its step; its run takes a reward, is exported
    and has its page."""
    try:
        step = wait_for(
            lambda: Step.objects.filter(call_id=call_id).select_related("trajectory").first(),
            timeout_s=10,
            what="the call's row and step",
        )
    except AssertionError as error:
        raise AssertionError(stack.gateway.log.read_text()[-3000:]) from error
    rewarded = stack.api.post(
        "/api/v1/feedback",
        {"call_id": call_id, "reward": 1.0, "success": True},
        content_type="application/json",
    )
    assert rewarded.status_code in (200, 201), rewarded.content
    page = stack.page.get(f"/q/{stack.queue.slug}/trajectories/{step.trajectory_id}/")
    assert page.status_code == 200


@given(body=chat_bytes)
@BUDGET
def test_no_chat_body_fails_the_gateway_loses_its_call_or_leaks(stack: Stack, body: bytes) -> None:
    status, call_id, answer = chat(stack, body)
    hypothesis.event(f"status {status}", payload=answer[:90].decode(errors="replace"))
    assert status < 500, answer[:500]
    if status == 200:
        assert call_id is not None
        assert_logged_and_usable(stack, call_id)
    assert_nothing_personal_kept(stack)
    forget_everything()  # each example's checks read only its own rows: they stay quick


def forget_everything() -> None:
    for model in (Call, Trajectory, Item, Example):
        model.objects.all().delete()


# Feedback bodies: each field anything a hostile caller may send in it.
correction = st.one_of(
    st.fixed_dictionaries({"content": user_text}),
    st.fixed_dictionaries({"tool_calls": st.lists(tool_call, min_size=1, max_size=2)}),
    json_value,
)
feedback_body = st.fixed_dictionaries(
    {"reward": number},
    optional={
        "success": st.booleans() | json_value,
        "comment": user_text,
        "corrected_action": correction,
        "feedback_id": plain_text,
        "extra": json_value | deep_structure,
    },
)


@given(body=feedback_body, on_run=st.booleans())
@BUDGET
def test_no_feedback_body_fails_the_api_or_breaks_the_run(
    stack: Stack, body: dict[str, Any], on_run: bool
) -> None:
    status, call_id, _ = chat(
        stack,
        encoded(
            {
                "model": "desk",
                "messages": [{"role": "user", "content": "Where is order 4821?"}],
                "tools": [{"type": "function", "function": {"name": "lookup"}}],
                "metadata": {"trajectory_id": "run-fuzzed"},
            }
        ),
    )
    assert status == 200 and call_id is not None
    target = {"trajectory_id": "run-fuzzed"} if on_run else {"call_id": call_id}
    response = stack.api.generic(
        "POST", "/api/v1/feedback", encoded({**body, **target}), content_type="application/json"
    )
    hypothesis.event(f"status {response.status_code}")
    assert response.status_code < 500, response.content[:500]
    # Whatever that feedback was, the run still takes a reward, exports and shows.
    assert_logged_and_usable(stack, call_id)
    assert_nothing_personal_kept(stack)
