"""The feedback API: the application says how a call or a whole run went. Mounted by
icrlhf/api.py; a token with the `feedback` scope, for the runs its own gateway calls made
only (another token's run or call: 404)."""

import math
import uuid
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import field_validator, model_validator

from icrlhf.ingest.api import not_json
from icrlhf.ingest.auth import TokenAuth, token_of
from icrlhf.ingest.models import Scope
from icrlhf.ingest.schemas import ErrorOut
from icrlhf.integrations.text_checks import refuse_unstorable_text, unstorable_text
from icrlhf.trajectories.feedback import (
    CorrectionRefused,
    FeedbackKeyConflict,
    FeedbackTargetMissing,
    feedback_record,
)

router = Router(tags=["feedback"], auth=TokenAuth(scope=Scope.FEEDBACK))

REWARD_LIMIT = 1e6
KEY_MAX_LENGTH = 200


class FunctionIn(Schema):
    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    arguments: str = Field("{}", max_length=100_000)


class ToolCallIn(Schema):
    id: str = Field("", max_length=200)
    type: Literal["function"] = "function"
    function: FunctionIn


class ActionIn(Schema):
    content: str | None = Field(None, max_length=100_000)
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=32)

    @model_validator(mode="after")
    def _one_action(self) -> "ActionIn":
        if not self.content and not self.tool_calls:
            raise ValueError("give the right action as `content` or `tool_calls`")
        return self


class FeedbackIn(Schema):
    call_id: uuid.UUID | None = Field(
        None, description="The call (X-Icrlhf-Call of its answer): feedback on that one step."
    )
    trajectory_id: str | None = Field(
        None,
        max_length=200,
        description="The run: the id you sent as X-Icrlhf-Trajectory or metadata.trajectory_id, "
        "or the trajectory's own id. Give this or call_id.",
    )
    reward: float | None = Field(
        None, description="A scalar reward, any scale your application uses (e.g. 0 to 1)."
    )
    success: bool | None = Field(None, description="Whether the call or run achieved its goal.")
    comment: str = Field("", max_length=5000)
    corrected_action: ActionIn | None = Field(
        None,
        description="What would have been right at that step, as text or tool calls (only "
        "tools the call offered). On a call, under the queue's reward rule, it becomes the "
        "step's preferred example and the served action its rejected rival.",
    )
    feedback_id: str = Field(
        "",
        max_length=200,
        description="Your id for this feedback, unique among this token's: sending it "
        "again with the same body changes nothing (200, the first answer); with another body "
        "it is refused (409). The Idempotency-Key header does the same. Without either, "
        "identical feedback is recorded once.",
    )

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and (not math.isfinite(value) or abs(value) > REWARD_LIMIT):
            raise ValueError(f"must be a finite number within ±{REWARD_LIMIT:g}")
        return value

    # Every string in the body, keys and ignored fields too, walked once: text the
    # database cannot store (NUL, lone surrogates) is refused before anything is written.
    _storable = model_validator(mode="wrap")(refuse_unstorable_text)

    @model_validator(mode="after")
    def _complete(self) -> "FeedbackIn":
        if (self.call_id is None) == (not (self.trajectory_id or "").strip()):
            raise ValueError("give either call_id or trajectory_id")
        if self.reward is None and self.success is None:
            raise ValueError("give a reward, success, or both")
        return self


class FeedbackOut(Schema):
    id: uuid.UUID
    trajectory_id: uuid.UUID
    step: int | None = Field(None, description="The step's position (0 first) for a call.")
    reward: float | None
    success: bool | None
    created: bool = Field(description="False when this feedback had been posted before.")


@router.post(
    "/feedback",
    response={
        201: FeedbackOut,
        200: FeedbackOut,
        404: ErrorOut,
        409: ErrorOut,
        415: ErrorOut,
        422: ErrorOut,
    },
    summary="Say how a call or a run went (a reward, success; idempotent)",
)
def feedback_post(request: HttpRequest, payload: FeedbackIn) -> Status[object]:
    token = token_of(request)
    if (wrong_type := not_json(request)) is not None:
        return wrong_type
    corrected: dict[str, Any] = (
        payload.corrected_action.model_dump(exclude_none=True) if payload.corrected_action else {}
    )
    key = request.headers.get("Idempotency-Key", "") or payload.feedback_id
    if len(key) > KEY_MAX_LENGTH or unstorable_text(key):
        problem = {"field": "Idempotency-Key", "message": "at most 200 characters, no NUL"}
        invalid = "The request is invalid; nothing was saved."
        return Status(422, {"detail": invalid, "errors": [problem]})
    try:
        recorded = feedback_record(
            queue=token.queue,
            token=token,
            call_id=payload.call_id,
            trajectory_ref=payload.trajectory_id,
            reward=payload.reward,
            success=payload.success,
            comment=payload.comment,
            corrected_action=corrected,
            key=key,
        )
    except FeedbackTargetMissing as missing:
        return Status(404, {"detail": f"{missing} Nothing was saved.", "errors": []})
    except FeedbackKeyConflict as conflict:
        return Status(409, {"detail": f"{conflict} Nothing was saved.", "errors": []})
    except CorrectionRefused as refused:
        problem = {"field": refused.field, "message": str(refused)}
        return Status(422, {"detail": f"{refused} Nothing was saved.", "errors": [problem]})
    feedback = recorded.feedback
    body = FeedbackOut(
        id=feedback.pk,
        trajectory_id=feedback.trajectory_id,
        step=feedback.step.position if feedback.step else None,
        reward=feedback.reward,
        success=feedback.success,
        created=recorded.created,
    )
    return Status(201 if recorded.created else 200, body)
