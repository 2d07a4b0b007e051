"""Review-page benchmark: N concurrent reviewers against gunicorn, on loopback.

A throw-away world is seeded with ready items (4 markdown candidates each, retrieved
examples, the queue's playbook); gunicorn serves it; each simulated reviewer logs in, takes
the next item and loads its review page repeatedly, deciding every few loads and moving on,
with a short think time. Only review-page loads are timed.
"""

import random
import statistics
import threading
import time
from typing import Any

import requests
from django.core.management.base import CommandParser

from bench.world import WorldCommand, percentile, world

PASSWORD = "bench-reviewer-password"  # noqa: S105 (a throw-away world's users)
WEB_WORKERS = 3


class Command(WorldCommand):
    help = "Measure the review page's p50/p95 with concurrent reviewers against gunicorn."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--reviewers", type=int, default=20)
        parser.add_argument("--loads", type=int, default=40, help="Page loads per reviewer.")
        parser.add_argument(
            "--think",
            type=float,
            default=1.0,
            help="Mean seconds between a reviewer's page loads (a person takes far longer).",
        )
        parser.add_argument(
            "--duration", type=float, default=0, help="Seconds to run instead of --loads."
        )
        parser.add_argument("--port", type=int, default=0, help="Default: a free port.")
        parser.add_argument(
            "--database-url",
            default="",
            help="A PostgreSQL server to run on: a scratch database is created there and "
            "dropped after the run (default: the install's database kind).",
        )

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        # Every simulated reviewer logs in from 127.0.0.1: lift the per-address limit.
        with world(
            "bench-review",
            database_url=options["database_url"],
            LOGIN_ATTEMPTS_PER_MINUTE="100000",
            LOGIN_ATTEMPTS_PER_ADDRESS_PER_MINUTE="100000",
        ) as here:
            here.inside("bench_review", {**options, "phase": "seed"})
            web, base = here.web(port=options["port"], workers=WEB_WORKERS)
            result = load(base, options)
            web.process.terminate()
            web.process.wait(timeout=15)
            acknowledged = result.pop("acknowledged")
            result.update(
                here.inside("bench_review", {"phase": "verify", "acknowledged": acknowledged})
            )
        return result

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        if options["phase"] == "seed":
            seed(reviewers=options["reviewers"], items=options["reviewers"] * 40)
            return {}
        return verify([(name, item_id) for name, item_id in options["acknowledged"]])

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        self.stdout.write(
            f"Review page with {result['reviewers']} concurrent reviewers (gunicorn, "
            f"{WEB_WORKERS} workers × 4 threads, {options['think']} s think time): p50 "
            f"{result['review_page_p50_ms']:.1f} ms, p95 {result['review_page_p95_ms']:.1f} ms "
            f"over {result['loads']} loads, {result['errors']} errors, {result['decisions']} "
            "decisions (target p95 ≤ 150 ms)"
        )
        self.stdout.write(
            f"Integrity: {result['decisions_acknowledged']} decisions acknowledged, "
            f"{result['decisions_lost']} lost, {result['acknowledged_twice']} double submits "
            f"saved twice, {result['items_decided_twice']} items decided more often than their "
            f"reviewers per item, {result['server_errors']} server errors"
        )
        for sample in result["error_samples"]:
            self.stdout.write(f"  error: {sample}")


def seed(*, reviewers: int, items: int) -> None:
    from django.contrib.auth.models import User

    from icrlhf.generation.models import Candidate, Generation
    from icrlhf.playbook.models import Version
    from icrlhf.playbook.services import EntryDraft, version_create
    from icrlhf.queues.models import Item, Queue

    queue = Queue.objects.create(
        slug="bench",
        name="Bench",
        n_candidates=4,
        reason_tags=["wrong facts", "too long"],
    )
    # A playbook of ten rules, shown beside every item.
    version_create(
        queue_id=queue.pk,
        drafts=[
            EntryDraft(section="Answers", text=f"Rule {number}: be correct, and be brief.")
            for number in range(10)
        ],
        origin=Version.Origin.WRITTEN,
        author=None,
    )
    for number in range(reviewers):
        user = User.objects.create_user(f"reviewer{number}", password=PASSWORD)
        queue.members.add(user)  # a reviewer of this queue
    answer = (
        "Thanks for reaching out! Your card was posted **3 working days** ago.\n\n"
        "1. Check the tracking link in the app.\n2. If it has not arrived in 5 days, "
        "freeze the card and order a new one.\n\n```\nCard status: shipped\n```\n"
    ) * 2
    for number in range(items):
        item = Item.objects.create(
            queue=queue,
            input_text=f"Request {number}: my card has not arrived.",
            status=Item.Status.READY,
        )
        generation = Generation.objects.create(
            item=item,
            model="bench",
            n_candidates=4,
            status=Generation.Status.DONE,
            messages=[{"role": "system", "content": "x" * 2000}, {"role": "user", "content": "q"}],
            params={"temperature": 0.7, "max_tokens": 256},
        )
        Candidate.objects.bulk_create(
            Candidate(generation=generation, position=p, status="done", text=f"{p} {answer}")
            for p in range(4)
        )


def load(base: str, options: dict[str, Any]) -> dict[str, Any]:
    timings: list[float] = []
    errors: list[str] = []
    server_errors = [0]
    decisions = [0]
    acknowledged: list[tuple[str, int]] = []
    deadline = time.monotonic() + options["duration"]
    lock = threading.Lock()
    barrier = threading.Barrier(options["reviewers"])

    def reviewer(number: int) -> None:
        session = requests.Session()
        try:
            session.get(f"{base}/accounts/login/")
            session.post(
                f"{base}/accounts/login/",
                data={
                    "username": f"reviewer{number}",
                    "password": PASSWORD,
                    "csrfmiddlewaretoken": session.cookies["csrftoken"],
                },
                headers={"Referer": f"{base}/accounts/login/"},
            )
            token = session.cookies["csrftoken"]
            item_url = session.post(
                f"{base}/q/bench/review/next/",
                data={"csrfmiddlewaretoken": token},
                headers={"Referer": base},
            ).url
        except Exception as error:  # noqa: BLE001 (counted, not raised)
            with lock:
                errors.append(f"login: {error}")
            barrier.abort()
            return
        barrier.wait()
        load_number = -1
        while True:
            load_number += 1
            if options["duration"] and time.monotonic() > deadline:
                break
            if not options["duration"] and load_number >= options["loads"]:
                break
            started = time.perf_counter()
            try:
                response = session.get(item_url)
                elapsed = (time.perf_counter() - started) * 1000
                ok = response.status_code == 200 and "Pick candidate 1" in response.text
            except requests.RequestException as error:
                elapsed, ok = 0.0, False
                response = None
                with lock:
                    errors.append(str(error))
            with lock:
                timings.append(elapsed)
                if not ok and response is not None:
                    errors.append(f"{response.status_code} on {item_url}")
                    server_errors[0] += response.status_code >= 500
            if response is not None and ok and load_number % 5 == 4:
                candidate = response.text.split('name="choice" value="c', 1)[1].split('"', 1)[0]
                item_id = int(item_url.rstrip("/").rsplit("/", 1)[1])
                # Submitted twice, as a double click does: the second must be refused.
                next_url = ""
                for _ in range(2):
                    decided = session.post(
                        f"{item_url}decide/",
                        data={"choice": f"c{candidate}", "csrfmiddlewaretoken": token},
                        headers={"Referer": item_url},
                    )
                    with lock:
                        if decided.status_code >= 500:
                            errors.append(f"{decided.status_code} on decide")
                            server_errors[0] += 1
                        # The one banner says what was saved (for the undo window, on
                        # every page); a refused submit says it was not.
                        saved = f"Saved item {item_id}:" in decided.text
                        if saved and "was not saved" not in decided.text:
                            acknowledged.append((f"reviewer{number}", item_id))
                    next_url = next_url or decided.url  # the first answer leads on
                with lock:
                    decisions[0] += 1
                item_url = next_url
            time.sleep(options["think"] * random.uniform(0.5, 1.5))

    threads = [threading.Thread(target=reviewer, args=(n,)) for n in range(options["reviewers"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "reviewers": options["reviewers"],
        "loads": len(timings),
        "errors": len(errors),
        "error_samples": errors[:5],
        "decisions": decisions[0],
        "server_errors": server_errors[0],
        "acknowledged": acknowledged,
        "review_page_p50_ms": statistics.median(timings) if timings else float("nan"),
        "review_page_p95_ms": percentile(timings, 95) if timings else float("nan"),
    }


def verify(acknowledged: list[tuple[str, int]]) -> dict[str, int]:
    """Checks the world's database against what the reviewers were told was saved."""
    from django.db import models
    from django.db.models import Count

    from icrlhf.review.models import Decision

    standing = Decision.objects.standing()
    saved = set(standing.values_list("reviewer__username", "item_id"))
    twice = (
        standing.values("item_id", "item__queue__reviewers_per_item")
        .annotate(count=Count("pk"))
        .filter(count__gt=models.F("item__queue__reviewers_per_item"))
        .count()
    )
    return {
        "decisions_acknowledged": len(acknowledged),
        "decisions_lost": sum(1 for pair in acknowledged if pair not in saved),
        "acknowledged_twice": len(acknowledged) - len(set(acknowledged)),
        "items_decided_twice": twice,
    }
