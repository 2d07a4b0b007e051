from celery import shared_task

from icrlhf.reflection import services


@shared_task(name="reflection.proposal_reflect")
def proposal_reflect(proposal_id: int) -> None:
    services.proposal_reflect(proposal_id=proposal_id)
