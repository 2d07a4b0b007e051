"""bench_workbench's step-review path: captured steps of a tool-calling support agent, as the
gateway captures them (a conversation in OpenAI message form, its tools, and a generation of N
tool-call candidates), for a reviewer to decide on the step page.

Each run is a customer's goal, then the agent looking the order up three times, each tool
result a long JSON history, so the page has to keep the state compact for the candidates to
stay in view. The candidates are the next action: one refunds (the right action: the order
arrived damaged and its replacement was lost), the others do something else; the agent itself
served another lookup, which is why the step was captured."""

import json
import random
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from icrlhf.generation.models import Candidate, Generation
from icrlhf.queues.models import Item, Queue

SLUG = "bench-steps"
# The right next action's note: no other candidate has it.
RIGHT_NOTE = "Damaged and replacement lost."
NOTE_ADDED = " Refund in full."  # what an edit appends to the picked call's note
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} of an order",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "note": {"type": "string"},
                    "amount": {"type": "number"},
                },
                "required": ["order_id"],
            },
        },
    }
    for name in ("lookup_order", "refund", "escalate", "send_message")
]
GOAL = "My order {order} arrived broken and the replacement never came. I want my money back."
LOOKUPS = 3
# The next actions the candidates take, in this order up to N (8 at most); the served one is
# the agent's own: yet another lookup.
SERVED: tuple[str, dict[str, Any]] = ("lookup_order", {})
ACTIONS: list[tuple[str, dict[str, Any]]] = [
    ("refund", {"note": RIGHT_NOTE}),
    ("escalate", {"note": "Two failed deliveries."}),
    ("send_message", {"note": "We are sorry; a refund is on its way."}),
    ("refund", {"note": "Partial refund for the damage.", "amount": 10}),
    ("send_message", {"note": "Could you send a photo of the damage?"}),
    ("escalate", {"note": "The courier lost the replacement."}),
    ("lookup_order", {"note": "Check the replacement's tracking."}),
]


def _tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def conversation(order: str) -> list[dict[str, Any]]:
    """A run several steps long whose tool results are long."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": GOAL.format(order=order)}]
    for step in range(1, LOOKUPS + 1):
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_tool_call(f"call_{step}", "lookup_order", {"order_id": order})],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{step}",
                "content": json.dumps(
                    {
                        "order_id": order,
                        "status": "delivered damaged" if step < LOOKUPS else "replacement lost",
                        "history": [f"event {n}: parcel scanned at depot {n}" for n in range(12)],
                    }
                ),
            },
        ]
    return messages


@transaction.atomic
def step_create(*, queue: Queue, order: str, candidates: int) -> Item:
    """A captured step ready for review: its N tool-call candidates are done, at shuffled
    positions as a generation leaves them."""
    messages = conversation(order)
    item = Item.objects.create(
        queue=queue,
        input_text=f"{messages[0]['content']}\n\n{messages[-1]['content']}",
        source=Item.Source.GATEWAY,
        status=Item.Status.READY,
        conversation=messages,
        call_options={"tools": TOOLS},
    )
    now = timezone.now()
    generation = Generation.objects.create(
        item=item,
        model="openai/support-agent",
        n_candidates=candidates,
        messages=messages,
        status=Generation.Status.DONE,
        prepared_at=now,
        finished_at=now,
    )
    actions = [SERVED, *ACTIONS][:candidates]
    positions = random.sample(range(candidates), candidates)
    Candidate.objects.bulk_create(
        Candidate(
            generation=generation,
            position=position,
            status=Candidate.Status.DONE,
            served=(name, arguments) == SERVED,
            text="",
            tool_calls=[_tool_call(f"call_{10 + n}", name, {"order_id": order, **arguments})],
            model=generation.model,
        )
        for n, (position, (name, arguments)) in enumerate(zip(positions, actions, strict=True))
    )
    return item


def steps_seed(*, count: int, candidates: int, reviewer: User) -> None:
    """A queue of `count` captured steps that `reviewer` reviews."""
    if not count:
        return
    queue = Queue.objects.create(
        slug=SLUG, name="Bench agent steps", n_candidates=candidates, memory_candidates=0
    )
    queue.members.add(reviewer)
    for number in range(count):
        step_create(queue=queue, order=str(4821 + number), candidates=candidates)


def steps_decided() -> dict[str, Any]:
    """What the reviewer's keys recorded: the share of steps decided for the right action,
    and how many of those were saved edited, the words added to its note."""
    from icrlhf.review.models import Decision

    decisions = Decision.objects.standing().filter(item__queue__slug=SLUG)
    right = edited = 0
    for decision in decisions.select_related("chosen_candidate"):
        chosen = decision.chosen_candidate
        calls = chosen.tool_calls if chosen is not None else []
        right += bool(calls) and _note(calls) == RIGHT_NOTE
        edited += decision.verdict == Decision.Verdict.EDITED and (
            _note(decision.final_tool_calls) == RIGHT_NOTE + NOTE_ADDED
        )
    steps = Item.objects.filter(queue__slug=SLUG).count()
    return {"step_right_share": right / steps if steps else 0.0, "step_edits_saved": edited}


def _note(calls: list[dict[str, Any]]) -> str:
    return str(json.loads(calls[0]["function"]["arguments"]).get("note", ""))
