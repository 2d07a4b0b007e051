"""The playbook's arms of bench_learning, bench_agent and bench_triage, at their largest
size: R rounds of reflection through the product (`reflection.services`, replay included),
each approved without a person; then the held-out set again with the learned playbook in the
prompt, the model alone with it, and with a control playbook learned in as many rounds from
the same batches shuffled (preferred answers and corrections credited to the wrong requests),
cut to the learned one's length. The queue keeps the learned playbook when it ends."""

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from icrlhf.integrations import llm
from icrlhf.playbook.models import Version
from icrlhf.playbook.selectors import current_version, version_entries
from icrlhf.playbook.services import EntryDraft, version_create, version_restore
from icrlhf.queues.models import Queue
from icrlhf.reflection import services as reflection
from icrlhf.reflection.models import Mutation, Proposal
from icrlhf.reflection.traces import DualTrace, RunTrace, dual_traces, run_traces
from icrlhf.review.models import Decision
from icrlhf.trajectories.models import Trajectory


@dataclass(frozen=True)
class Rounds:
    version: Version | None  # the playbook they made (None: nothing was approved)
    proposals: list[Proposal]
    log: list[dict[str, Any]]


def _approved_and_applied(queue: Queue, proposal: Proposal, reviewer: User) -> Version | None:
    """Every change of an open proposal approved, as no person would: the next version."""
    if proposal.status != Proposal.Status.OPEN:
        return None
    for mutation in proposal.mutations.all():
        reflection.mutation_decide(
            queue=queue, mutation_id=mutation.pk, approve=True, actor=reviewer
        )
    try:
        return reflection.proposal_apply(queue=queue, proposal_id=proposal.pk, actor=reviewer)
    except ValidationError as error:  # e.g. it would change nothing
        Proposal.objects.filter(pk=proposal.pk).update(notes=" ".join(error.messages))
        return None


def reflect_rounds(queue: Queue, reviewer: User, rounds: int) -> Rounds:
    """Up to `rounds` reflections on the queue's decisions, each read batch not read before,
    each approved and applied."""
    proposals, log = [], []
    for number in range(1, rounds + 1):
        try:
            started = reflection.proposal_start(queue_id=queue.pk)
        except ValidationError as error:  # nothing left to read
            log.append({"round": number, "status": "not started", "notes": error.messages[0]})
            break
        proposal = reflection.proposal_reflect(proposal_id=started.pk)
        made = _approved_and_applied(queue, proposal, reviewer)
        proposal.refresh_from_db()
        proposals.append(proposal)
        log.append(_round_row(number, proposal, made))
    return Rounds(version=current_version(queue), proposals=proposals, log=log)


def _round_row(number: int, proposal: Proposal, made: Version | None) -> dict[str, Any]:
    return {
        "round": number,
        "status": proposal.status,
        "decisions": len(proposal.decisions),
        "changes": [
            {"op": m.op, "key": m.key, "section": m.section, "text": m.text}
            for m in proposal.mutations.all()
        ],
        "replay": None
        if proposal.replay_failures is None
        else {
            "fixed": proposal.replay_fixed,
            "failures": proposal.replay_failures,
            "broke": proposal.replay_broke,
            "successes": proposal.replay_successes,
        },
        "version": made.number if made else None,
        "notes": proposal.notes,
    }


def _elsewhere(count: int, rng: random.Random) -> list[int]:
    """For each of `count` places, the place whose content it takes: never its own."""
    order = list(range(count))
    rng.shuffle(order)
    source = list(range(count))
    for position, place in enumerate(order):
        source[place] = order[(position + 1) % count]
    return source


def shuffled(traces: list[DualTrace], rng: random.Random) -> list[DualTrace]:
    """The traces with their preferred answers (and the verdicts, reasons and comments that
    go with them) moved to other requests: every one lands elsewhere."""
    if len(traces) < 2:
        return traces
    source = [traces[i] for i in _elsewhere(len(traces), rng)]
    return [
        replace(t, preferred=s.preferred, verdict=s.verdict, reasons=s.reasons, comment=s.comment)
        for t, s in zip(traces, source, strict=True)
    ]


def shuffled_runs(runs: list[RunTrace], rng: random.Random) -> list[RunTrace]:
    """The runs with each weak step's correction and comment moved to another weak step of
    the batch: the right action credited to the wrong situation."""
    weak = [(r, s) for r, run in enumerate(runs) for s, step in enumerate(run.steps) if step.weak]
    if len(weak) < 2:
        return runs
    steps = [list(run.steps) for run in runs]
    for (r, s), source in zip(weak, _elsewhere(len(weak), rng), strict=True):
        moved = runs[weak[source][0]].steps[weak[source][1]]
        steps[r][s] = replace(steps[r][s], correction=moved.correction, comment=moved.comment)
    return [replace(run, steps=own) for run, own in zip(runs, steps, strict=True)]


def control_rounds(
    queue: Queue, reviewer: User, batches: list[Proposal], rng: random.Random
) -> Version | None:
    """As many rounds as the learned playbook took, on the same batches (decisions and runs)
    shuffled, from an empty playbook and with their own log of what was approved (the real
    rounds' log would hand them the learned rules)."""
    version_create(
        queue_id=queue.pk,
        drafts=[],
        origin=Version.Origin.WRITTEN,
        author=reviewer,
        summary="Bench: the control starts empty.",
    )
    log: list[str] = []
    for batch in batches:
        found = {
            d.pk: d for d in Decision.objects.filter(pk__in=batch.decisions).select_related("item")
        }
        traces = shuffled(dual_traces([found[pk] for pk in batch.decisions if pk in found]), rng)
        runs = shuffled_runs(
            run_traces(queue, list(Trajectory.objects.filter(pk__in=batch.runs, queue=queue))),
            rng,
        )
        try:
            drafts, _refused = reflection.reflector_ask(
                model=settings.REFLECTOR_MODEL,
                version_number=None,
                entries=version_entries(current_version(queue)),
                log=log,
                traces=traces,
                runs=runs,
            )
        except llm.LLMError:
            continue
        if not drafts:
            continue
        proposal = Proposal.objects.create(
            queue=queue,
            based_on=current_version(queue),
            model=settings.REFLECTOR_MODEL,
            decisions=batch.decisions,
            runs=batch.runs,
            status=Proposal.Status.OPEN,
            notes="Bench control: the batch shuffled (preferred answers, corrections).",
        )
        Mutation.objects.bulk_create(
            Mutation(proposal=proposal, op=d.op, key=d.key, section=d.section, text=d.text)
            for d in drafts
        )
        _approved_and_applied(queue, proposal, reviewer)
        log += [f"- approved: {d.op} ({d.section}): {d.text}" for d in drafts]
    return current_version(queue)


def _unless_in_force(change: Callable[[], object]) -> None:
    """Makes the change, unless the playbook in force is that already (which the product
    refuses as a change of nothing)."""
    try:
        change()
    except ValidationError as error:
        if "Nothing changed" not in error.messages[0]:
            raise


def playbook_set(queue: Queue, entries: list[EntryDraft], reviewer: User, summary: str) -> None:
    """`entries` as the queue's playbook."""
    _unless_in_force(
        lambda: version_create(
            queue_id=queue.pk,
            drafts=entries,
            origin=Version.Origin.IMPORTED,
            author=reviewer,
            summary=summary,
        )
    )


def learned_drafts(version: Version | None) -> list[EntryDraft]:
    """A version's entries as another queue may hold them (without this queue's sources)."""
    return [EntryDraft(section=e.section, text=e.text) for e in version_entries(version)]


def playbook_arms(
    *,
    queue: Queue,
    plain: Queue,
    reviewer: User,
    rounds: int,
    rng: random.Random,
    evaluate: Callable[[], dict[str, Any]],
    alone: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """The arms, as `evaluate` (the held-out messages through the queue) and `alone` (the
    model alone, through `plain`) count them, each with the playbook then in force."""
    learned = reflect_rounds(queue, reviewer, rounds)
    entries = learned_drafts(learned.version)
    result: dict[str, Any] = {
        "playbook_rounds": learned.log,
        "playbook_entries": [f"{d.section}: {d.text}" for d in entries],
    }
    if not entries:
        return result  # nothing learned: the arms would repeat the ones without a playbook
    assert learned.version is not None
    result["with_playbook"] = evaluate()
    playbook_set(plain, entries, reviewer, "Bench: the learned playbook, alone.")
    result["playbook_alone"] = alone()
    control = control_rounds(queue, reviewer, learned.proposals, rng)
    control_entries = learned_drafts(control)[: len(entries)]
    result["control_entries"] = [f"{d.section}: {d.text}" for d in control_entries]
    if control_entries:
        playbook_set(queue, control_entries, reviewer, "Bench: the control, cut to length.")
        result["with_control_playbook"] = evaluate()
    number = learned.version.number
    _unless_in_force(lambda: version_restore(queue=queue, number=number, author=reviewer))
    return result
