import logging

from celery import shared_task

from icrlhf.gateway import capture

logger = logging.getLogger(__name__)


@shared_task(name="gateway.captures_sweep")
def captures_sweep() -> None:
    """Periodic: make the review items of captured calls whose capture was lost."""
    lost = capture.captures_lost()
    for call_id in lost:
        try:
            capture.call_capture(call_id=call_id)
        except Exception:
            logger.exception("Capturing gateway call %s failed again", call_id)
    if lost:
        logger.warning("Capture sweep: %d gateway calls captured late", len(lost))
