"""Reflection on demand: a batch of decisions the queue's first candidate lost and of agents'
runs with a weak step, read by the reflector model, becomes a proposal of playbook
mutations; a curator approves, edits or rejects each, and applying the proposal makes the
playbook's next version."""

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from icrlhf.integrations import llm
from icrlhf.playbook.checks import entry_problem
from icrlhf.playbook.models import Entry, Version
from icrlhf.playbook.selectors import current_version, version_entries
from icrlhf.playbook.services import EntryDraft, version_create
from icrlhf.queues.models import Queue
from icrlhf.reflection.models import Mutation, Proposal
from icrlhf.reflection.mutations import MutationDraft, mutations_read
from icrlhf.reflection.prompts import mutations_schema, reflector_messages
from icrlhf.reflection.replay import Replay, replay
from icrlhf.reflection.traces import (
    DualTrace,
    RunTrace,
    dual_traces,
    losing_decisions,
    run_traces,
    weak_runs,
)
from icrlhf.review.models import Decision
from icrlhf.trajectories.models import Trajectory

logger = logging.getLogger(__name__)

# The reflector's answer: three mutations at their schema's longest (about 350 tokens) fit.
REFLECTOR_MAX_TOKENS = 700
# The log of what curators decided: the newest mutations.
LOG_MAX = 20
# A running reflection older than this was lost with its worker.
REFLECTION_STALE = timedelta(hours=1)


def _read_before(queue: Queue) -> tuple[set[int], set[str]]:
    """The decisions and the runs earlier reflections read (a failed one read nothing)."""
    decisions: set[int] = set()
    runs: set[str] = set()
    for read_decisions, read_runs in (
        Proposal.objects.filter(queue=queue)
        .exclude(status=Proposal.Status.FAILED)
        .values_list("decisions", "runs")
    ):
        decisions.update(read_decisions)
        runs.update(read_runs)
    return decisions, runs


def _batch_share(decisions: int, runs: int, size: int) -> tuple[int, int]:
    """How many of the decisions and runs waiting a batch of `size` takes: half each, and
    what one side leaves to the other."""
    runs_taken = min(runs, max(size // 2, size - decisions))
    return min(decisions, size - runs_taken), runs_taken


def _waiting(queue: Queue, *, size: int) -> tuple[list[Decision], list[Trajectory]]:
    """A batch of at most `size`: decisions the first candidate lost and runs with a weak
    step, that no earlier reflection read, newest first."""
    read_decisions, read_runs = _read_before(queue)
    decisions = losing_decisions(queue, read=read_decisions, limit=size)
    runs = weak_runs(queue, read=read_runs, limit=size)
    taken_decisions, taken_runs = _batch_share(len(decisions), len(runs), size)
    return decisions[:taken_decisions], runs[:taken_runs]


@transaction.atomic
def proposal_start(*, queue_id: int) -> Proposal:
    """The next batch, as a proposal for the reflector to fill (`tasks.proposal_reflect`, in
    the worker, once this has committed)."""
    queue = Queue.objects.select_for_update().get(pk=queue_id)  # one batch at a time
    running = Proposal.objects.filter(queue=queue, status=Proposal.Status.RUNNING)
    # A worker that died mid-reflection leaves its proposal running: past the longest a
    # reflection and its replay take, it failed.
    running.filter(created_at__lt=timezone.now() - REFLECTION_STALE).update(
        status=Proposal.Status.FAILED, notes="The worker stopped before the reflector answered."
    )
    if running.exists():
        raise ValidationError("A reflection of this queue is already running.")
    decisions, runs = _waiting(queue, size=settings.REFLECTION_BATCH)
    if not decisions and not runs:
        raise ValidationError(
            "Nothing new to reflect on: since the last reflection, no decision where the first "
            "candidate lost, and no agent's run with a step rewarded low or corrected."
        )
    return Proposal.objects.create(
        queue=queue,
        based_on=current_version(queue),
        model=settings.REFLECTOR_MODEL,
        decisions=[d.pk for d in decisions],
        runs=[str(r.pk) for r in runs],
        status=Proposal.Status.RUNNING,
    )


def proposals_due() -> list[Proposal]:
    """Proposals started for the queues that reflect by themselves and have, since their last
    reflection, at least their `reflect_after` decisions the first candidate lost and runs
    with a weak step."""
    started = []
    for queue in Queue.objects.filter(reflect_after__isnull=False):
        assert queue.reflect_after is not None
        decisions, runs = _waiting(queue, size=queue.reflect_after)
        if len(decisions) + len(runs) < queue.reflect_after:
            continue
        try:
            started.append(proposal_start(queue_id=queue.pk))
        except ValidationError:  # one is running, or another check started it meanwhile
            continue
    return started


def decided_log(queue: Queue) -> list[str]:
    """What curators decided of earlier mutations, newest first: the optimizer's state."""
    decided = Mutation.objects.filter(
        proposal__queue=queue,
        status__in=[Mutation.Status.APPROVED, Mutation.Status.REJECTED],
    ).order_by("-pk")[:LOG_MAX]
    return [
        f"- {m.status}: {m.op}"
        + (f" E{m.key}" if m.key else "")
        + (f" ({m.section}): {m.text}" if m.op != Mutation.Op.RETIRE else "")
        for m in decided
    ]


def reflector_ask(
    *,
    model: str,
    version_number: int | None,
    entries: Sequence[Entry],
    log: Sequence[str],
    traces: Sequence[DualTrace],
    runs: Sequence[RunTrace],
) -> tuple[list[MutationDraft], list[str]]:
    """The reflector's mutations of the playbook `entries` that can stand, and why each other
    was refused. Raises llm.LLMError when the model cannot be asked."""
    answer = llm.complete(
        messages=reflector_messages(
            version_number=version_number,
            entries=[(e.name, e.section, e.text) for e in entries],
            log=log,
            traces=traces,
            runs=runs,
        ),
        model=model,
        params={"temperature": 0.0, "seed": 7, "max_tokens": REFLECTOR_MAX_TOKENS},
        api_base=settings.REFLECTOR_API_BASE,
        response_format=mutations_schema(),
    )
    return mutations_read(
        answer.text,
        shown=[trace.decision_id for trace in traces],
        shown_runs=[run.run_id for run in runs],
        entries={e.key: (e.section, e.text) for e in entries},
        requests=[t.request for t in traces] + [run.goal for run in runs],
    )


def proposal_reflect(*, proposal_id: int) -> Proposal:
    """Ask the reflector for the proposal's mutations; keep those that can stand."""
    proposal = Proposal.objects.select_related("queue", "based_on").get(pk=proposal_id)
    if proposal.status != Proposal.Status.RUNNING:
        return proposal  # a redelivered task: done already
    entries = version_entries(proposal.based_on)
    batch = _batch(proposal)
    traces = dual_traces(batch)
    batch_runs = list(Trajectory.objects.filter(pk__in=proposal.runs, queue=proposal.queue))
    runs = run_traces(proposal.queue, batch_runs)
    try:
        drafts, refused = reflector_ask(
            model=proposal.model,
            version_number=proposal.based_on.number if proposal.based_on else None,
            entries=entries,
            log=decided_log(proposal.queue),
            traces=traces,
            runs=runs,
        )
    except llm.LLMError as error:
        logger.warning("Reflection %s failed: %s", proposal.pk, error)
        proposal.status = Proposal.Status.FAILED
        proposal.notes = f"The reflector could not be asked: {error.summary}."
        proposal.save(update_fields=["status", "notes"])
        return proposal
    Mutation.objects.bulk_create(
        Mutation(
            proposal=proposal,
            op=d.op,
            key=d.key,
            section=d.section,
            text=d.text,
            cites=d.cites,
            cites_runs=d.cites_runs,
            why=d.why,
        )
        for d in drafts
    )
    notes = [("Refused: " + "; ".join(refused) + ".")] if refused else []
    if drafts and (batch or batch_runs):
        try:
            tried = replay(proposal=proposal, failures=batch, entries=entries, runs=batch_runs)
        except llm.LLMError as error:
            notes.append(f"The replay could not be run: {error.summary}.")
        else:
            if tried.failures or tried.successes:
                proposal.replay_fixed, proposal.replay_failures = tried.fixed, tried.failures
                proposal.replay_broke, proposal.replay_successes = tried.broke, tried.successes
                proposal.replay_scored_by = tried.scored_by
            if runs:
                notes.append(_steps_note(tried, runs=len(runs)))
    proposal.status = Proposal.Status.OPEN if drafts else Proposal.Status.EMPTY
    proposal.notes = " ".join(notes)
    proposal.save()
    return proposal


def _steps_note(tried: Replay, *, runs: int) -> str:
    read = f"Read {runs} agent run{'s' if runs != 1 else ''} beside the decisions"
    if not tried.steps_failed:
        return f"{read}: none has a corrected step with its call logged, so none was replayed."
    return (
        f"{read}. Of the figures, agents' steps (asked again without examples, scored as "
        f"taking the correction, or the action taken): fixes {tried.steps_fixed} of "
        f"{tried.steps_failed} corrected steps, breaks {tried.steps_broke} of "
        f"{tried.steps_succeeded} accepted ones."
    )


def _batch(proposal: Proposal) -> list[Decision]:
    found = {
        d.pk: d
        for d in Decision.objects.filter(
            pk__in=proposal.decisions, item__queue=proposal.queue
        ).select_related("item", "generation", "generation__playbook")
    }
    return [found[pk] for pk in proposal.decisions if pk in found]


def mutation_decide(
    *, queue: Queue, mutation_id: int, approve: bool, actor: User, section: str = "", text: str = ""
) -> Mutation:
    """A curator's verdict on one mutation of an open proposal of `queue`; an approved
    addition or edit may carry the curator's own words (checked as any rule)."""
    mutation = (
        Mutation.objects.select_related("proposal")
        .filter(pk=mutation_id, proposal__queue=queue)
        .first()
    )
    if mutation is None:
        raise ValidationError("This queue has no such proposed change.")
    if mutation.proposal.status != Proposal.Status.OPEN:
        raise ValidationError("This proposal has been decided already.")
    if approve and mutation.op != Mutation.Op.RETIRE and (section or text):
        section, text = " ".join(section.split()), " ".join(text.split())
        problem = entry_problem(section=section, text=text)
        if problem is not None:
            raise ValidationError(f"This change cannot be approved so: {problem}.")
        mutation.section, mutation.text = section, text
    mutation.status = Mutation.Status.APPROVED if approve else Mutation.Status.REJECTED
    mutation.save(update_fields=["status", "section", "text"])
    return mutation


@transaction.atomic
def proposal_apply(*, queue: Queue, proposal_id: int, actor: User) -> Version | None:
    """The playbook in force with the proposal's approved mutations, as its next version
    (None when every one was rejected). Every mutation must be decided first."""
    proposal = Proposal.objects.select_for_update().filter(pk=proposal_id, queue=queue).first()
    if proposal is None:
        raise ValidationError("This queue has no such proposal.")
    if proposal.status != Proposal.Status.OPEN:
        raise ValidationError("This proposal has been decided already.")
    waiting = proposal.mutations.filter(status=Mutation.Status.PENDING).count()
    if waiting:
        raise ValidationError(f"Approve or reject each change first: {waiting} still waiting.")
    approved = list(proposal.mutations.filter(status=Mutation.Status.APPROVED))
    made = _applied(queue=queue, proposal=proposal, approved=approved, actor=actor)
    proposal.status = Proposal.Status.DECIDED
    proposal.decided_at = timezone.now()
    proposal.decided_by = actor
    proposal.made = made
    proposal.save(update_fields=["status", "decided_at", "decided_by", "made"])
    return made


def _applied(
    *, queue: Queue, proposal: Proposal, approved: list[Mutation], actor: User
) -> Version | None:
    if not approved:
        return None
    drafts = {e.key: EntryDraft.of(e) for e in version_entries(current_version(queue))}
    added = []
    for mutation in approved:
        if mutation.op == Mutation.Op.ADD:
            added.append(
                EntryDraft(
                    section=mutation.section,
                    text=mutation.text,
                    sources=mutation.cites,
                    run_sources=mutation.cites_runs,
                )
            )
            continue
        if mutation.key not in drafts:
            raise ValidationError(
                f"E{mutation.key} is no longer in the playbook (changed since this proposal): "
                "reject that change, or restore the rule first."
            )
        if mutation.op == Mutation.Op.RETIRE:
            del drafts[mutation.key]
        else:
            before = drafts[mutation.key]
            drafts[mutation.key] = replace(
                before,
                section=mutation.section,
                text=mutation.text,
                sources=[*before.sources, *mutation.cites],
                run_sources=[*before.run_sources, *mutation.cites_runs],
            )
    return version_create(
        queue_id=queue.pk,
        drafts=[*drafts.values(), *added],
        origin=Version.Origin.REFLECTION,
        author=actor,
        summary=f"Reflection {proposal.pk}: {len(approved)} change"
        f"{'s' if len(approved) != 1 else ''} approved.",
    )
