"""The demo data `make run` seeds: a login, a queue, and a few Banking77 customer messages."""

import csv
import json
import random
import secrets
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from icrlhf.generation.services import item_create
from icrlhf.playbook.models import Version
from icrlhf.playbook.services import EntryDraft, version_create
from icrlhf.queues.models import Item, Queue

DEMO_USERNAME = "demo"
DEMO_QUEUE_SLUG = "banking-support"
DEMO_SYSTEM_PROMPT = (
    "You are a customer-support agent of an online bank. Reply to the customer's message in "
    "two or three short, friendly sentences. Never ask for card numbers or passwords."
)
# The demo queue's first playbook: what a support team would write on day one.
DEMO_PLAYBOOK = (
    ("Answers", "Be correct and short, and tell the customer what to do next."),
    ("Answers", "Never promise a refund or a date the bank has not confirmed."),
    ("Cards", "Before discussing a card, ask for its last four digits, never the whole number."),
)
# One message of each of these intents, in this order; a similar question typed next shows
# the remembered answer among the retrieved examples.
DEMO_INTENTS = (
    "card_arrival",
    "lost_or_stolen_card",
    "exchange_rate",
    "pin_blocked",
    "top_up_limits",
)


@dataclass(frozen=True)
class DemoLogin:
    username: str
    password: str


def banking77_messages(path: Path) -> dict[str, list[str]]:
    by_intent: dict[str, list[str]] = {}
    with path.open(newline="", encoding="utf-8") as stream:
        for row in csv.DictReader(stream):
            by_intent.setdefault(row["category"], []).append(row["text"].strip())
    return by_intent


def demo_login_ensure() -> DemoLogin:
    """The demo user, with a random password kept in var/ so every start prints the same one."""
    password_file = settings.VAR_DIR / "demo_password"
    user_model = get_user_model()
    user = user_model.objects.filter(username=DEMO_USERNAME).first()
    if user is None or not password_file.is_file():
        password = secrets.token_urlsafe(12)
        if user is None:
            user = user_model.objects.create_superuser(DEMO_USERNAME, "", password)
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
        password_file.parent.mkdir(parents=True, exist_ok=True)
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
    return DemoLogin(DEMO_USERNAME, password_file.read_text().strip())


DEMO_TRIAGE_SLUG = "banking-triage"
DEMO_TRIAGE_TICKETS = 8


def banking77_missing(data_dir: Path) -> str:
    """What the demo lacks without Banking77, in a sentence; empty when the data set is there."""
    folder = data_dir / "banking77"
    missing = [name for name in ("test.csv", "categories.json") if not (folder / name).is_file()]
    if not missing:
        return ""
    return (
        f"No Banking77 data set in {folder} ({' and '.join(missing)} missing): the demo queue "
        "gets no items and no triage queue is made. Point SHARED_DATA_DIR at a folder holding "
        "banking77/ (the shared data beside the repository) and run `make run` again."
    )


@transaction.atomic
def demo_triage_queue_ensure(*, data_dir: Path) -> tuple[Queue | None, int]:
    """A support-triage queue whose categories are Banking77's 77 intents, with a few
    tickets (once). Without the dataset there is nothing to seed."""
    from icrlhf.triage.services import ticket_create

    categories_path = data_dir / "banking77" / "categories.json"
    csv_path = data_dir / "banking77" / "test.csv"
    if banking77_missing(data_dir):
        return None, 0
    queue, created = Queue.objects.get_or_create(
        slug=DEMO_TRIAGE_SLUG,
        defaults={
            "name": "Banking triage",
            "kind": Queue.Kind.TRIAGE,
            "system_prompt": "You triage the support tickets of an online bank.",
            "categories": json.loads(categories_path.read_text()),
            "n_candidates": 3,
            "max_tokens": 120,
            "temperature": 0.8,
            "reason_tags": ["wrong category", "wrong priority", "bad reply"],
        },
    )
    queue.members.add(
        get_user_model().objects.get(username=DEMO_USERNAME), through_defaults={"role": "curator"}
    )
    if not created:
        return queue, 0
    messages = banking77_messages(csv_path)
    rng = random.Random(77)
    intents = rng.sample(sorted(messages), DEMO_TRIAGE_TICKETS)
    priorities = [
        Item.Priority.URGENT,
        Item.Priority.HIGH,
        Item.Priority.NORMAL,
        Item.Priority.NORMAL,
        Item.Priority.LOW,
        Item.Priority.HIGH,
        Item.Priority.NORMAL,
        Item.Priority.LOW,
    ]
    for number, (intent, priority) in enumerate(zip(intents, priorities, strict=True)):
        text = messages[intent][1]
        ticket_create(
            queue=queue,
            subject=" ".join(text.split()[:5]) + ("…" if len(text.split()) > 5 else ""),
            body=text,
            customer=f"customer{number + 1}@example.com",
            channel=rng.choice(["email", "chat", "phone"]),
            priority=priority,
            external_id=f"demo-{number + 1}",
            source="import",
        )
    return queue, DEMO_TRIAGE_TICKETS


@transaction.atomic
def demo_queue_ensure(*, data_dir: Path) -> tuple[Queue, int]:
    """Create the demo queue once, and its items while it has none (so a data set put in place
    later still seeds them); returns the queue and the items created."""
    queue, created = Queue.objects.get_or_create(
        slug=DEMO_QUEUE_SLUG,
        defaults={
            "name": "Banking support",
            "system_prompt": DEMO_SYSTEM_PROMPT,
            "n_candidates": 4,
            "k_examples": 5,
            "max_tokens": 120,
            "reason_tags": ["wrong facts", "not helpful", "too long", "unsafe"],
        },
    )
    queue.members.add(
        get_user_model().objects.get(username=DEMO_USERNAME), through_defaults={"role": "curator"}
    )
    if created:
        version_create(
            queue_id=queue.pk,
            drafts=[EntryDraft(section=section, text=text) for section, text in DEMO_PLAYBOOK],
            origin=Version.Origin.WRITTEN,
            author=None,
            summary="The demo's rules.",
        )
    csv_path = data_dir / "banking77" / "test.csv"
    if not csv_path.is_file() or Item.objects.filter(queue=queue).exists():
        return queue, 0
    messages = banking77_messages(csv_path)
    user = get_user_model().objects.get(username=DEMO_USERNAME)
    for intent in DEMO_INTENTS:
        item_create(queue=queue, input_text=messages[intent][0], created_by=user)
    return queue, len(DEMO_INTENTS)
