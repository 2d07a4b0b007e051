import logging

from celery import shared_task
from django.utils import timezone

from icrlhf.gateway import call_log, capture, retention

logger = logging.getLogger(__name__)


@shared_task(name="gateway.captures_sweep")
def captures_sweep() -> None:
    """Periodic: write the call log's rows no gateway process is writing (all of them were
    stopped or killed), then make the review items of captured calls whose capture was lost,
    and of agent steps rewarded below the bar."""
    if written := call_log.journal_sweep():
        logger.warning("Call log sweep: %d calls logged late", written)
    capture.low_reward_steps_mark()
    lost = capture.captures_lost()
    for call_id in lost:
        try:
            capture.call_capture(call_id=call_id)
        except Exception:
            logger.exception("Capturing gateway call %s failed again", call_id)
    if lost:
        logger.warning("Capture sweep: %d gateway calls captured late", len(lost))


@shared_task(name="gateway.calls_purge")
def calls_purge() -> None:
    """Periodic: what end users wrote leaves the call log after CALL_RETENTION_DAYS."""
    purged = retention.calls_purge(now=timezone.now())
    if purged:
        logger.info("Retention: the content of %d gateway calls was removed", purged)
