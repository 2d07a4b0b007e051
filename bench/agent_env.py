"""bench_agent's environment: a small support desk whose goals the desk itself checks.

A customer writes about an order. The agent may look the order up, then must do the one thing
that resolves it: refund a damaged order, escalate a lost one, or reply with the delivery day
of a late one. The desk knows the truth (the order's state) and checks what the agent did, not
what it said: success is the right action on the right order, and nothing wrong done on the
way (a refund to a lost order is a failure even if an escalation follows).

Two ways to act, as the icrl library's agents and today's tool-calling agents do:
- `tools`: OpenAI function tools (lookup_order, refund, escalate, reply);
- `text`: the action is the answer's text (`refund 4821`), one prompt per step holding the
  goal and the latest observation, as the icrl library's act prompt does.
"""

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
MAX_STEPS = 4
TERMINAL = ("refund", "escalate", "reply")

GOALS = {
    "damaged": [
        "My order {order} arrived broken. I want my money back.",
        "Order {order} came in pieces, the box was crushed.",
        "The lamp from order {order} is cracked. Please sort this out.",
        "Everything in order {order} was damaged when it arrived.",
        "Order {order} showed up smashed. What now?",
    ],
    "lost": [
        "Where is order {order}? The tracking has not moved for two weeks.",
        "Order {order} never arrived and the courier says it was delivered.",
        "I have been waiting a month for order {order}. Is it lost?",
        "Order {order} seems to have vanished. Can you find it?",
        "My parcel for order {order} is nowhere to be found.",
    ],
    "late": [
        "When will order {order} arrive?",
        "Order {order} is late. When can I expect it?",
        "Is order {order} still coming? It was due yesterday.",
        "Any news on the delivery of order {order}?",
        "How much longer for order {order}?",
    ],
}

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order's status by its number.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Refund an order that arrived damaged.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "escalate",
            "description": "Send a lost order to the courier team.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "reply",
            "description": "Answer the customer, ending the conversation.",
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
            },
        },
    },
]

SYSTEM = (
    "You are a support agent for an online shop. Resolve the customer's problem with the "
    "tools: look the order up, then refund a damaged order, escalate a lost one, or reply "
    "with the delivery day of a late one."
)
TEXT_ACTIONS = (
    "Actions: lookup_order <order>, refund <order>, escalate <order>, reply <message>. "
    "Answer with one action only."
)


@dataclass(frozen=True)
class Task:
    kind: str  # damaged, lost or late
    order: str
    goal: str
    day: str  # a late order's delivery day

    def lookup(self, order: str) -> str:
        if order != self.order:
            return json.dumps({"error": f"no order {order}"})
        status = {
            "damaged": {"status": "delivered", "condition": "damaged"},
            "lost": {"status": "lost in transit", "last_scan": "14 days ago"},
            "late": {"status": "in transit", "delivery_day": self.day},
        }[self.kind]
        return json.dumps({"order_id": order, **status})


@dataclass
class Desk:
    """One episode: what the agent did to the task's order, and whether that resolved it."""

    task: Task
    actions: list[tuple[str, str]] = field(default_factory=list)  # (tool, argument)

    @property
    def done(self) -> bool:
        return any(name in TERMINAL for name, _ in self.actions) or len(self.actions) >= MAX_STEPS

    def act(self, name: str, argument: str) -> str:
        """Carry out one action; the observation the agent gets back."""
        argument = argument.strip().strip("#").strip()
        self.actions.append((name, argument))
        if name == "lookup_order":
            return self.task.lookup(argument)
        if name in ("refund", "escalate"):
            return json.dumps({"ok": True, "action": name, "order_id": argument})
        if name == "reply":
            return json.dumps({"ok": True, "sent": True})
        return json.dumps({"error": f"unknown action {name}"})

    @property
    def success(self) -> bool:
        """The episode ended on the right action for the order (the first terminal action
        ends it: a refund to a lost order cannot be taken back by an escalation after)."""
        final = next(((n, a) for n, a in self.actions if n in TERMINAL), None)
        if final is None:
            return False
        name, argument = final
        if self.task.kind == "late":
            return name == "reply" and self.task.day.lower() in argument.lower()
        right = "refund" if self.task.kind == "damaged" else "escalate"
        return final == (right, self.task.order)


def tasks(count: int, *, seed: int) -> list[Task]:
    """`count` tasks, the kinds and phrasings in turn, orders and days at random."""
    rng = random.Random(seed)
    made = []
    for number in range(count):
        kind = list(GOALS)[number % len(GOALS)]
        order = str(rng.randint(1000, 9999))
        goal = rng.choice(GOALS[kind]).format(order=order)
        made.append(Task(kind=kind, order=order, goal=goal, day=rng.choice(DAYS)))
    rng.shuffle(made)
    return made


def expert(task: Task) -> list[tuple[str, str]]:
    """The resolving actions: look up, then the one that fits the order's state."""
    final = {
        "damaged": ("refund", task.order),
        "lost": ("escalate", task.order),
        "late": ("reply", f"Your order {task.order} will arrive on {task.day}."),
    }[task.kind]
    return [("lookup_order", task.order), final]


def argument_name(tool: str) -> str:
    return "message" if tool == "reply" else "order_id"


_TEXT_ACTION = re.compile(
    r"\b(lookup_order|refund|escalate|reply)\b[\s:(\"']*(.*)", re.DOTALL | re.IGNORECASE
)


def text_action(answer: str) -> tuple[str, str] | None:
    """A text answer as an action: `refund 4821`, `reply: It comes on Friday.`; None when no
    action is named."""
    found = _TEXT_ACTION.search(answer)
    if found is None:
        return None
    name, rest = found.group(1).lower(), found.group(2).strip().splitlines()
    argument = rest[0] if rest else ""
    if name != "reply":
        number = re.search(r"\d{3,}", argument)
        argument = number.group(0) if number else argument.strip(" )\"'")
    return name, argument.strip(" )\"'")


def text_prompt(goal: str, observation: str) -> str:
    """The text variant's one message a step: the goal, the latest observation, the actions."""
    return f"Goal: {goal}\nObservation: {observation}\n{TEXT_ACTIONS}\nNext action:"
