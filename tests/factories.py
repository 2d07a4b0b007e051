from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from icrlhf.generation.models import Candidate, Generation
from icrlhf.memory import index
from icrlhf.memory.models import Example
from icrlhf.playbook.models import Version
from icrlhf.playbook.services import EntryDraft, version_create
from icrlhf.queues.models import Item, Membership, Queue
from icrlhf.review.decisions import decision_record
from icrlhf.review.models import Decision
from icrlhf.trajectories.services import (
    RunOwner,
    StepRecorded,
    end_user_key,
    run_hashes,
    step_record,
)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"reviewer{n}")
    password = factory.django.Password("pass-for-tests")

    @factory.post_generation
    def groups(self, create: bool, extracted: list[str] | None, **kwargs: object) -> None:
        """Install-wide groups (only `admin` means anything: roles are per queue)."""
        # get_or_create: transactional tests flush the groups the migration made.
        if create and extracted:
            self.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in extracted))


class QueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Queue
        skip_postgeneration_save = True

    slug = factory.Sequence(lambda n: f"queue-{n}")
    name = factory.Sequence(lambda n: f"Queue {n}")
    n_candidates = 3
    # Tests that rank read the ranking's order; the blind share is tested on its own.
    blind_percent = 0

    # Members by role: QueueFactory(members=[reviewer], curators=[curator], viewers=[viewer]).
    @factory.post_generation
    def members(self, create: bool, extracted: list[object] | None, **kwargs: object) -> None:
        if create and extracted:
            self.members.add(*extracted, through_defaults={"role": Membership.Role.REVIEWER})

    @factory.post_generation
    def curators(self, create: bool, extracted: list[object] | None, **kwargs: object) -> None:
        if create and extracted:
            self.members.add(*extracted, through_defaults={"role": Membership.Role.CURATOR})

    @factory.post_generation
    def viewers(self, create: bool, extracted: list[object] | None, **kwargs: object) -> None:
        if create and extracted:
            self.members.add(*extracted, through_defaults={"role": Membership.Role.VIEWER})

    # Its playbook's first version: QueueFactory(playbook=[("Tone", "Be brief.")]).
    @factory.post_generation
    def playbook(
        self, create: bool, extracted: list[tuple[str, str]] | None, **kwargs: object
    ) -> None:
        if create and extracted:
            playbook_write(self, extracted)


def playbook_write(queue: Queue, entries: list[tuple[str, str]]) -> Version:
    """The queue's next playbook version, holding `entries` ((section, text) each)."""
    return version_create(
        queue_id=queue.pk,
        drafts=[EntryDraft(section=section, text=text) for section, text in entries],
        origin=Version.Origin.WRITTEN,
        author=None,
    )


def member_add(queue: Queue, user: object, role: str = "reviewer") -> None:
    """Makes `user` a member of `queue` with `role`, or changes their role there."""
    Membership.objects.update_or_create(queue=queue, user=user, defaults={"role": role})


class ItemFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Item

    queue = factory.SubFactory(QueueFactory)
    input_text = factory.Sequence(lambda n: f"Question number {n}?")
    status = Item.Status.READY


class GenerationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Generation

    item = factory.SubFactory(ItemFactory)
    model = "openai/test-model"
    params: dict[str, object] = {}
    n_candidates = 1
    status = Generation.Status.DONE
    messages = factory.LazyAttribute(lambda g: [{"role": "user", "content": g.item.input_text}])


class CandidateFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Candidate

    generation = factory.SubFactory(GenerationFactory)
    position = factory.Sequence(lambda n: n)
    status = Candidate.Status.DONE
    text = factory.Sequence(lambda n: f"Answer number {n}.")


class DecisionFactory(factory.django.DjangoModelFactory):
    """A decision row as stored (for reading it back); decisions made the way reviewers make
    them go through review.decisions.decision_record."""

    class Meta:
        model = Decision

    generation = factory.SubFactory(GenerationFactory)
    item = factory.SelfAttribute("generation.item")
    reviewer = factory.SubFactory(UserFactory)
    verdict = Decision.Verdict.NONE_ACCEPTABLE
    guideline_version = 1


def ready_generation(item: Item, texts: list[str]) -> Generation:
    """A finished generation with one done candidate per text (no model involved)."""
    generation = GenerationFactory(item=item, n_candidates=len(texts))
    for position, text in enumerate(texts):
        CandidateFactory(generation=generation, position=position, text=text)
    return generation


def stored_example(
    queue: Queue,
    *,
    input_text: str = "How do I reset my card PIN?",
    output_text: str = "Use the app.",
) -> Example:
    """A preferred example in the queue's memory, from a decided item (not indexed)."""
    item = ItemFactory(queue=queue, input_text=input_text)
    generation = ready_generation(item, [output_text])
    decision = DecisionFactory(generation=generation, item=item)
    return Example.objects.create(
        queue=queue,
        decision=decision,
        role=Example.Role.PREFERRED,
        input_text=input_text,
        output_text=output_text,
        reward=1.0,
    )


def agent_step(
    queue: Queue,
    messages: list[dict[str, Any]],
    *,
    key: str = "",
    text: str = "",
    tool_calls: list[dict[str, Any]] | None = None,
    tool_names: list[str] | None = None,
    call_id: Any = None,
    token: Any = None,
    end_user: str = "",
    created_at: Any = None,
) -> StepRecorded:
    """One gateway call recorded as an agent's step, as the gateway records it (the messages
    as the caller sent them, nothing redacted), in a run of `token` (an IntegrationToken) for
    the end user the call names in `user`."""
    return step_record(
        queue=queue,
        owner=RunOwner(
            token_id=None if token is None else token.pk, end_user=end_user_key(end_user)
        ),
        key=key,
        messages=messages,
        hashes=run_hashes(messages=messages, answer_text=text, tool_calls=tool_calls or []),
        decision_point=str(messages[-1].get("content") or ""),
        action_text=text,
        tool_calls=tool_calls or [],
        tool_names=tool_names or [],
        call_id=call_id,
        created_at=created_at or timezone.now(),
    )


def decided_and_indexed(
    queue: Any, user: Any, question: str, answer: str, *others: str
) -> list[Example]:
    """Decide an item (the answer chosen over the others) and index its examples."""
    item = ItemFactory(queue=queue, input_text=question)
    generation = ready_generation(item, [answer, *others])
    decision = decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=generation.candidates.get(text=answer).pk,
    )
    examples = list(decision.examples.all())
    index.examples_index(example_ids=[e.pk for e in examples])
    return examples


def ready_item(queue: Any, texts: tuple[str, ...] = ("one", "two", "three")) -> Item:
    """An item with a ready generation of `texts`."""
    item = ItemFactory(queue=queue)
    ready_generation(item, list(texts))
    return item


def ranked_decision(queue: Queue, user: Any, *, pick_first: bool, text: str = "") -> Decision:
    """A decision on a two-candidate generation ranked in display order: the ranking's first
    picked, the second picked, or (with `text`) the first edited, with a reason."""
    queue.reason_tags = ["too long"]
    queue.save(update_fields=["reason_tags"])
    item = ItemFactory(queue=queue, input_text="My card is lost, write to ana@example.com")
    generation = ready_generation(item, ["Order a new card.", "Call us."])
    candidates = list(generation.candidates.order_by("position"))
    for rank, candidate in enumerate(candidates, start=1):
        candidate.rank = rank
        candidate.save(update_fields=["rank"])
    if text:
        return decision_record(
            item_id=item.pk,
            reviewer=user,
            verdict="edited",
            candidate_id=candidates[0].pk,
            final_text=text,
            reason_tags=["too long"],
        )
    return decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="chosen",
        candidate_id=candidates[0 if pick_first else 1].pk,
    )
