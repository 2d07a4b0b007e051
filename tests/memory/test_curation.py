"""Curation reaching the real store: fastembed and a Qdrant local folder, in this process,
with the worker's tasks run inline."""

from typing import Any

import pytest
from django.test import Client

from icrlhf.integrations import vectors
from icrlhf.memory import curation, index, integrity
from icrlhf.memory.models import CurationEvent, Example, Retrieval
from icrlhf.memory.selectors import examples_recall
from icrlhf.review.decisions import decision_record, decision_undo
from tests.factories import ItemFactory, UserFactory, ready_generation

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("vector_store", "eager_tasks")]


@pytest.fixture(autouse=True)
def _on_commit_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests run in a transaction that never commits: run what waits for the commit
    (the worker's tasks, inline) straight away, on the same connection."""
    monkeypatch.setattr(
        "django.db.transaction.on_commit", lambda func, using=None, robust=False: func()
    )


def remember(queue: Any, user: Any, question: str, answer: str, *others: str) -> Example:
    item = ItemFactory(queue=queue, input_text=question)
    generation = ready_generation(item, [answer, *others])
    decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=generation.candidates.get(text=answer).pk,
    )
    return Example.objects.get(decision__item=item, role="preferred")


def retrieve(queue: Any, query: str) -> list[str]:
    return [
        r.example.output_text
        for r in examples_recall(queue=queue, query_text=query, k=5, token_budget=10_000).examples
    ]


def store_status(queue: Any, example: Example) -> list[str]:
    hits = vectors.search(
        collection=index.collection_of(queue.pk),
        vector=vectors_of(example),
        limit=50,
        match={"status": ["active", "pinned", "retired"]},
    )
    return [str(h.payload["status"]) for h in hits if h.id == example.pk]


def vectors_of(example: Example) -> list[float]:
    from icrlhf.integrations import embeddings

    return embeddings.embed_text(example.input_text)


def test_a_retired_example_is_no_longer_retrieved_and_a_restored_one_is(
    queue: Any, user: Any
) -> None:
    example = remember(queue, user, "My card has not arrived.", "It ships in 3 days.")
    assert retrieve(queue, "Where is my card?") == ["It ships in 3 days."]
    curation.examples_status_set(ids=[example.pk], status="retired", actor=user, reason="wrong")
    assert store_status(queue, example) == ["retired"]
    assert retrieve(queue, "Where is my card?") == []
    curation.examples_status_set(ids=[example.pk], status="active", actor=user)
    assert store_status(queue, example) == ["active"]
    assert retrieve(queue, "Where is my card?") == ["It ships in 3 days."]
    actions = list(CurationEvent.objects.order_by("created_at").values_list("action", "actor"))
    assert actions == [("retire", user.pk), ("restore", user.pk)]


def test_a_pinned_example_is_always_retrieved_first(queue: Any, user: Any) -> None:
    queue.min_similarity = 0.5
    queue.save()
    remember(queue, user, "My card has not arrived.", "It ships in 3 days.")
    pinned = remember(queue, user, "What are your opening hours?", "Always say hello first.")
    assert retrieve(queue, "Where is my card?") == ["It ships in 3 days."]
    curation.examples_status_set(ids=[pinned.pk], status="pinned", actor=user)
    assert retrieve(queue, "Where is my card?") == [
        "Always say hello first.",
        "It ships in 3 days.",
    ]
    assert retrieve(queue, "Totally unrelated quantum physics") == ["Always say hello first."]


def test_an_edited_example_is_retrieved_with_its_new_text(queue: Any, user: Any) -> None:
    example = remember(queue, user, "My card has not arrived.", "It ships in 3 days.")
    curation.example_output_edit(
        example_id=example.pk, output_text="It ships in 2 days.", actor=user
    )
    example.refresh_from_db()
    assert example.index_state == "indexed"  # re-indexed through the (inline) worker
    assert retrieve(queue, "Where is my card?") == ["It ships in 2 days."]
    event = CurationEvent.objects.get(action="edit")
    assert event.detail == {"previous": "It ships in 3 days."}


def test_reweighting_changes_the_ranking(queue: Any, user: Any) -> None:
    close = remember(queue, user, "My card has not arrived yet.", "closest")
    remember(queue, user, "How long does card delivery take?", "further")
    assert retrieve(queue, "My card has not arrived yet")[0] == "closest"
    curation.examples_reweight(ids=[close.pk], weight=0.1, actor=user)
    assert retrieve(queue, "My card has not arrived yet")[0] == "further"


def test_a_deleted_example_leaves_the_store(queue: Any, user: Any) -> None:
    example = remember(queue, user, "My card has not arrived.", "It ships in 3 days.", "no")
    collection = index.collection_of(queue.pk)
    assert example.pk in vectors.point_ids(collection=collection)
    curation.examples_delete(ids=[example.pk], actor=user)
    assert example.pk not in vectors.point_ids(collection=collection)
    assert not Example.objects.filter(pk=example.pk).exists()
    assert CurationEvent.objects.get(action="delete").example_id == example.pk
    assert integrity.memory_check(queue_slug=queue.slug)["drift"] is False


def test_near_duplicates_are_flagged_and_merged(queue: Any, user: Any) -> None:
    first = remember(queue, user, "My card has not arrived yet.", "first")
    second = remember(queue, user, "My card has not arrived yet!", "second")
    other = remember(queue, user, "How do I reset my PIN?", "other")
    second.refresh_from_db()
    other.refresh_from_db()
    assert second.duplicate_of_id == first.pk and other.duplicate_of_id is None
    assert second.similar[0]["id"] == str(first.pk) and second.similar[0]["score"] > 0.95
    Example.objects.filter(pk=second.pk).update(times_retrieved=3, times_accepted=2)
    kept = curation.examples_merge(ids=[first.pk, second.pk], actor=user)
    second.refresh_from_db()
    assert kept.pk == first.pk and (kept.times_retrieved, kept.times_accepted) == (3, 2)
    assert second.status == "retired" and second.retired_reason == f"merged into {first.pk}"
    found = retrieve(queue, "My card has not arrived yet.")
    assert "first" in found and "second" not in found


def decided_with(queue: Any, user: Any, examples: list[Example], verdict: str) -> Any:
    item = ItemFactory(queue=queue, input_text="Where is my card?")
    generation = ready_generation(item, ["a", "b"])
    for rank, example in enumerate(examples, start=1):
        Retrieval.objects.create(generation=generation, example=example, score=0.9, rank=rank)
    candidate = generation.candidates.first()
    return decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict=verdict,
        candidate_id=None if verdict == "none_acceptable" else candidate.pk,
    )


def test_usage_is_counted_when_the_item_is_decided_and_undone(queue: Any, user: Any) -> None:
    example = remember(queue, user, "My card has not arrived.", "It ships in 3 days.")
    decided_with(queue, user, [example], "chosen")
    rejected = decided_with(queue, user, [example], "none_acceptable")
    example.refresh_from_db()
    assert (example.times_retrieved, example.times_accepted) == (2, 1)
    assert example.utility == pytest.approx(2 / 4)
    assert example.last_retrieved_at is not None
    decision_undo(decision_id=rejected.pk, reviewer=user)
    example.refresh_from_db()
    assert (example.times_retrieved, example.times_accepted) == (1, 1)
    assert example.utility == pytest.approx(2 / 3)


def test_pruning_retires_low_utility_examples_but_never_pinned_ones(queue: Any, user: Any) -> None:
    weak = remember(queue, user, "My card has not arrived.", "weak")
    pinned = remember(queue, user, "How do I reset my PIN?", "pinned")
    young = remember(queue, user, "What is the exchange rate?", "young")
    Example.objects.filter(pk__in=[weak.pk, pinned.pk]).update(times_retrieved=6, utility=0.125)
    Example.objects.filter(pk=young.pk).update(times_retrieved=2, utility=0.25)
    curation.examples_status_set(ids=[pinned.pk], status="pinned", actor=user)
    assert curation.examples_prune(queue=queue) == 1
    weak.refresh_from_db()
    assert weak.status == "retired"
    assert weak.retired_reason == "utility 0.12 after 6 retrievals (below 0.30)"
    assert Example.objects.get(pk=pinned.pk).status == "pinned"
    assert Example.objects.get(pk=young.pk).status == "active"
    assert CurationEvent.objects.get(action="retire").actor is None


def test_memory_check_catches_drift_and_reindex_repairs_it_with_the_same_ids(
    queue: Any, user: Any
) -> None:
    kept = remember(queue, user, "My card has not arrived.", "ships soon", "no idea")
    lost = remember(queue, user, "How do I reset my PIN?", "in the app", "call us")
    collection = index.collection_of(queue.pk)
    ids_before = vectors.point_ids(collection=collection)
    assert integrity.memory_check()["drift"] is False

    vectors.delete(collection=collection, ids=[lost.pk])  # behind the app's back
    never = Example.objects.create(
        queue=queue,
        decision=kept.decision,
        input_text="x",
        output_text="y",
        reward=1.0,
        role="preferred",
    )
    check = integrity.memory_check(queue_slug=queue.slug)
    assert check["drift"] is True
    report = check["queues"][queue.slug]
    assert report["missing_in_store"] == 2 and report["orphan_points"] == 0
    assert set(report["samples"]["missing"]) == {str(lost.pk), str(never.pk)}

    assert integrity.memory_reindex(queue_slug=queue.slug) == {"reindexed": {queue.slug: 5}}
    assert vectors.point_ids(collection=collection) == ids_before | {never.pk}
    assert integrity.memory_check()["drift"] is False


def test_curators_curate_in_the_admin_and_reviewers_cannot(queue: Any, user: Any) -> None:
    example = remember(queue, user, "My card has not arrived.", "It ships in 3 days.")
    curator = UserFactory(is_staff=True)
    queue.members.add(curator, through_defaults={"role": "curator"})
    client = Client()
    client.force_login(curator)
    response = client.post(
        "/admin/memory/example/",
        {"action": "retire", "_selected_action": [str(example.pk)], "weight": ""},
        follow=True,
    )
    assert response.status_code == 200 and "Retired 1 example(s)." in response.content.decode()
    assert Example.objects.get(pk=example.pk).status == "retired"
    assert CurationEvent.objects.get().actor == curator
    assert client.get(f"/admin/memory/example/{example.pk}/change/").status_code == 200
    reviewer = Client()
    reviewer.force_login(user)
    assert reviewer.get("/admin/memory/example/").status_code == 302


@pytest.mark.parametrize("role", ["curator", "superuser"])
def test_the_admin_shows_and_changes_only_the_queues_a_curator_belongs_to(
    queue: Any, user: Any, role: str
) -> None:
    """A curator of one queue cannot list, open, edit, pin, retire or delete another queue's
    examples, see its audit log or its name in a filter; a superuser can."""
    from tests.factories import QueueFactory

    mine = remember(queue, user, "My card has not arrived.", "It ships in 3 days.")
    other_queue = QueueFactory(name="Payroll")
    other_queue.members.add(user)
    theirs = remember(other_queue, user, "Salary question?", "Confidential answer.")
    curation.examples_status_set(ids=[theirs.pk, mine.pk], status="pinned", actor=user)
    staff = UserFactory(is_staff=True, is_superuser=role == "superuser")
    queue.members.add(staff, through_defaults={"role": "curator"})
    other_queue.members.add(staff)  # a reviewer there: its examples are not theirs to curate
    client = Client()
    client.force_login(staff)

    listing = client.get("/admin/memory/example/").content.decode()
    searched = client.get("/admin/memory/example/?q=Confidential").content.decode()
    change_page = client.get(f"/admin/memory/example/{theirs.pk}/change/", follow=True)
    edit = client.post(
        f"/admin/memory/example/{theirs.pk}/change/",
        {"output_text": "Injected instructions", "weight": "1", "status": "pinned"},
    )
    for action in ("retire", "delete_selected_examples"):
        client.post(
            "/admin/memory/example/",
            {"action": action, "_selected_action": [str(theirs.pk)], "weight": "", "post": "yes"},
        )
    events = client.get("/admin/memory/curationevent/").content.decode()

    if role == "superuser":
        assert "Payroll" in listing and str(theirs.pk) in listing and str(theirs.pk) in searched
        assert not Example.objects.filter(pk=theirs.pk).exists()  # the superuser deleted it
        return
    assert "Payroll" not in listing and str(theirs.pk) not in listing  # nor in the filter
    assert str(mine.pk) in listing  # their own queue is there
    assert str(theirs.pk) not in searched
    assert "doesn’t exist" in change_page.content.decode() or change_page.status_code == 404
    assert edit.status_code in {302, 404}
    after = Example.objects.get(pk=theirs.pk)
    assert (after.output_text, after.status) == ("Confidential answer.", "pinned")
    assert "Payroll" not in events
    assert CurationEvent.objects.filter(queue=other_queue, actor=staff).count() == 0
