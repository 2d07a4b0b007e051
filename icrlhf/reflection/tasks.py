from celery import shared_task

from icrlhf.reflection import services


@shared_task(name="reflection.proposal_reflect")
def proposal_reflect(proposal_id: int) -> None:
    services.proposal_reflect(proposal_id=proposal_id)


@shared_task(name="reflection.reflect_due")
def reflect_due() -> None:
    """Periodic: start a reflection for each queue with enough new evidence."""
    for proposal in services.proposals_due():
        proposal_reflect.delay(proposal.pk)
