"""The export's API: a queue's decisions as JSON lines, for the token's queue."""

from datetime import datetime
from typing import Literal

from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from ninja import Router

from icrlhf.export.selectors import ExportFilters
from icrlhf.export.services import export_lines
from icrlhf.export.trajectories import TrajectoryFilters, trajectory_export_lines
from icrlhf.ingest.auth import TokenAuth, token_of
from icrlhf.ingest.models import Scope
from icrlhf.ingest.schemas import ErrorOut

# The whole queue's decisions: only a token given the export scope.
router = Router(tags=["export"], auth=TokenAuth(scope=Scope.EXPORT))


@router.get(
    "/exports/preferences",
    summary="Export this queue's decisions as JSON lines (streamed)",
    response={200: None, 422: ErrorOut},
)
def preferences_export(
    request: HttpRequest,
    format: Literal["canonical", "trl", "openai", "kto"] = "canonical",  # noqa: A002
    decided_from: datetime | None = None,
    decided_to: datetime | None = None,
    reviewer: str = "",
    verdict: Literal["", "chosen", "edited", "none_acceptable"] = "",
    since_last_export: bool = False,
    anonymize: bool = False,
) -> HttpResponseBase:
    token = token_of(request)
    filters = ExportFilters(
        queue=token.queue,
        decided_from=decided_from,
        decided_to=decided_to,
        reviewer=reviewer,
        verdict=verdict,
        since_last_export=since_last_export,
        anonymize=anonymize,
    )
    lines = export_lines(fmt=format, filters=filters, consumer=f"token:{token.pk}")
    return StreamingHttpResponse(lines, content_type="application/x-ndjson")


@router.get(
    "/exports/trajectories",
    summary="Export this queue's agent runs as JSON lines (streamed)",
    description="canonical: every run with its steps, rewards and feedback; openai: OpenAI's "
    "chat fine-tuning format with tools, one line per run that succeeded; trl: TRL's "
    "conversational format with tools, the same runs; pairs: a step's corrected action over "
    "the one taken, in TRL's preference format. anonymize: the run's key is null and its "
    "text (goal, messages, tool calls and results, feedback) passes redaction.",
    response={200: None, 422: ErrorOut},
)
def trajectories_export(
    request: HttpRequest,
    format: Literal["canonical", "openai", "trl", "pairs"] = "canonical",  # noqa: A002
    outcome: Literal["", "succeeded", "failed", "open"] = "",
    anonymize: bool = False,
) -> HttpResponseBase:
    token = token_of(request)
    filters = TrajectoryFilters(queue=token.queue, outcome=outcome, anonymize=anonymize)
    lines = trajectory_export_lines(fmt=format, filters=filters, consumer=f"token:{token.pk}")
    return StreamingHttpResponse(lines, content_type="application/x-ndjson")
