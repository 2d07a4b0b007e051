import logging
from typing import Any

from celery import Task, current_app, shared_task
from django.conf import settings
from kombu.exceptions import ChannelError

from icrlhf.generation import pipeline, recovery
from icrlhf.integrations.database import asynchronous_commits

logger = logging.getLogger(__name__)


class PrepareTask(Task):  # type: ignore[misc]
    """Fails the generation when preparing it fails, so the item does not stay generating."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        generation_id = kwargs.get("generation_id", args[0] if args else None)
        if generation_id is not None:
            pipeline.generation_fail(
                generation_id=generation_id,
                message="Not generated: preparing the prompt failed because of an internal "
                "error; it was logged.",
            )


# Set by a worker that consumes the LLM queue beside the memory queue (worker/app.py): its
# prepare task then generates the candidates itself, instead of handing them over through the
# broker to a thread of the same worker pool.
fan_out_inline = False


@shared_task(name="generation.prepare", base=PrepareTask)
def generation_prepare(generation_id: int) -> None:
    with asynchronous_commits():
        pipeline.generation_prepare(generation_id=generation_id, inline=fan_out_inline)


class CandidatesTask(Task):  # type: ignore[misc]
    """Marks its candidates failed when the task itself fails (a bug, not the model: model
    errors are saved on the candidates), so no candidate is left running."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        candidate_ids = kwargs.get("candidate_ids", args[0] if args else [])
        if isinstance(candidate_ids, int):  # generation.candidate_generate: one id
            candidate_ids = [candidate_ids]
        pipeline.candidates_fail_on_bug(candidate_ids=candidate_ids)


@shared_task(name="generation.candidates_generate", base=CandidatesTask)
def candidates_generate(
    candidate_ids: list[int], woken: bool = False, place: float | None = None
) -> None:
    with asynchronous_commits():
        pipeline.candidates_generate(candidate_ids=candidate_ids, woken=woken, place=place)


@shared_task(name="generation.candidate_generate", base=CandidatesTask)
def candidate_generate(candidate_id: int) -> None:
    """One candidate: a transient failure's retry, a sweep, a reviewer's "try again"."""
    with asynchronous_commits():
        pipeline.candidate_generate(candidate_id=candidate_id)


@shared_task(name="generation.rank")
def generation_rank(generation_id: int) -> None:
    pipeline.generation_rank(generation_id=generation_id)


def broker_backlog() -> int:
    """Messages waiting in the broker queues the workers consume (generation work waits in
    both: candidates in the default queue, preparations in the memory queue)."""
    waiting = 0
    with current_app.connection_for_read() as connection:
        for queue in (settings.CELERY_TASK_DEFAULT_QUEUE, settings.CELERY_MEMORY_QUEUE):
            try:
                declared = connection.default_channel.queue_declare(queue=queue, passive=True)
            except ChannelError:  # Redis drops an empty queue's key: "no queue" means empty
                continue
            waiting += int(declared.message_count)
    return waiting


@shared_task(name="generation.sweep")
def generations_sweep() -> None:
    """Periodic: re-enqueue generation work a dead worker or a lost message left behind."""
    sweep = recovery.generations_sweep(broker_backlog=broker_backlog())
    # At the default priority, 0, served first: this work is overdue, and there is little of
    # it (the broker lost it, or a worker died holding it).
    for generation_id in sweep.prepare:
        generation_prepare.delay(generation_id)
    for candidate_id in sweep.generate:
        candidate_generate.delay(candidate_id)
    for generation_id in sweep.rank:
        generation_rank.delay(generation_id)
    if sweep.prepare or sweep.generate or sweep.rank:
        logger.warning(
            "Generation sweep: %d generations, %d candidates and %d rankings enqueued again",
            len(sweep.prepare),
            len(sweep.generate),
            len(sweep.rank),
        )
