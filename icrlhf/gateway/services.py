"""What the gateway decides for a call: the queue's memory, the prompt or a memory answer,
the parameters sent upstream, and the log row. Blocking code: the views run it in threads."""

import hashlib
import json
import logging
import random
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from icrlhf.gateway.models import Call
from icrlhf.gateway.pace import queue_pace
from icrlhf.gateway.schemas import ChatRequest
from icrlhf.generation import ranking
from icrlhf.generation.context import PromptContext, Room, prompt_context, request_signature
from icrlhf.ingest.models import IntegrationToken
from icrlhf.integrations import llm
from icrlhf.integrations.redaction import Destination, scrub
from icrlhf.memory.selectors import Recall, RetrievedExample, examples_recall_anywhere
from icrlhf.memory.signatures import PLAIN, tool_names
from icrlhf.queues.models import Queue
from icrlhf.trajectories.services import (
    RunHashes,
    RunOwner,
    end_user_key,
    run_hashes,
    step_record,
)

logger = logging.getLogger(__name__)

# A memory answer is the most similar of this many nearest stored requests.
_ANSWER_POOL = 3


@dataclass(frozen=True)
class Plan:
    """What will answer a call, and what shaped it."""

    queue: Queue
    request_text: str
    # The caller's messages as sent upstream, and a digest of them.
    context: list[dict[str, Any]]
    request_hash: str
    memory: str  # a Call.Memory value
    # In the prompt as sent (those that fit the model's window), most similar first; for a
    # memory answer, the one example answering.
    examples: list[RetrievedExample]
    retrieval_ms: float
    # The nearest preferred example's similarity, whether or not the answer used it.
    top_score: float | None = None
    # Answered without memory, to measure what memory is worth (the caller cannot tell).
    holdout: bool = False
    # Why this call goes to review (a Call.Capture value), decided before it is answered.
    capture: str = ""
    # A memory answer: the example it came from (not in the prompt: there is no prompt).
    memory_answer: str | None = None
    # Its memory-only confidence, when the confidence rule chose it.
    memory_confidence: float | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    # The same prompt without its format examples: what is sent when the model answered with
    # a call to a tool the request does not offer (see `retry_upstream`).
    retry_messages: list[dict[str, Any]] = field(default_factory=list)
    model: str = ""
    api_base: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    # The caller's tool and output fields (tools, tool_choice, response_format, …), passed on.
    options: dict[str, Any] = field(default_factory=dict)
    # The agent run the caller names (X-Icrlhf-Trajectory, or metadata.trajectory_id), and
    # the end user the call names (`user`): with the token, the run's owner.
    trajectory_key: str = ""
    end_user: str = ""
    # The queue's playbook version the prompt carries (None: no playbook, or no prompt).
    playbook_version: int | None = None
    # How long the model is expected to take, at its pace now (pace.py); None: unknown.
    expected_s: float | None = None

    def upstream(self, *, timeout_s: float) -> dict[str, Any]:
        """The LLM call's arguments, as llm.acomplete and llm.astream take them. The upstream
        waits `timeout_s` (what is left of the call's deadline), not LLM_TIMEOUT_S: a call
        waiting for a free slot on a busy server was given up on before its deadline."""
        return {
            "messages": self.messages,
            "model": self.model,
            "params": self.params,
            "api_base": self.api_base,
            "options": self.options | {"timeout": max(1.0, timeout_s)},
        }

    def retry_upstream(self, *, timeout_s: float) -> dict[str, Any] | None:
        """The LLM call's arguments for asking again after the model called a tool the
        request does not offer: the prompt without the format examples (other tool sets'
        calls), which it most likely copied. None when that is the same prompt at
        temperature 0, which brings the same call back: asking would only double the call's
        time (a burst on the local model lost calls to the deadline that way)."""
        messages = self.retry_messages or self.messages
        if messages == self.messages and not self.params.get("temperature"):
            return None
        return self.upstream(timeout_s=timeout_s) | {"messages": messages}

    @property
    def source(self) -> str:
        return Call.Source.MODEL if self.memory_answer is None else Call.Source.MEMORY

    @property
    def served_memory(self) -> str:
        """What the caller is told memory did: a held-out call looks like one memory could
        not help, so that the caller cannot tell it apart."""
        return Call.Memory.EMPTY if self.holdout else self.memory


def decision_point(request: ChatRequest) -> str:
    """What retrieval looks for: the user's last words, or, after tool results, the goal and
    the latest observation (the state an agent decides from, not the words that began it)."""
    last = request.messages[-1]
    if last.role != "tool":
        return last.text
    return f"{request.goal}\n\n{last.text}".strip()


def held_out(*, queue: Queue, run_key: str) -> bool:
    """Whether a call is answered without memory (the queue's holdout share). The calls of a
    run its caller names share one draw, so that the run's reward compares the two arms."""
    if run_key:
        digest = hashlib.sha256(f"{queue.pk}:{run_key}".encode()).digest()
        draw = int.from_bytes(digest[:8]) / 2**64
    else:
        draw = random.random()
    return draw * 100 < queue.holdout_percent


def call_plan(
    *, queue: Queue, request: ChatRequest, token_id: int | None = None, trajectory_key: str = ""
) -> Plan:
    """Retrieve the queue's preferred examples for the decision point; answer from the
    nearest one when it is similar enough (the queue's threshold) and a plain text answer is
    what the call asks for, else build the prompt with the review flow's builder: the queue's
    system prompt with its instructions and playbook (then the caller's system message), the
    examples, then the caller's turns with their tool calls and results. `token_id`: the
    caller's token, which decides whose calls may be its format examples."""
    request_text = decision_point(request)
    context = [m.upstream() for m in request.messages]
    options = request.upstream_options()
    run_key = trajectory_key or str((request.metadata or {}).get("trajectory_id") or "")
    holdout = held_out(queue=queue, run_key=run_key)
    # Only plain text is answered from memory, and never a held-out call.
    signature = request_signature(conversation=context, options=options)
    may_answer = not holdout and signature == PLAIN
    memory_fit = _memory_fit(queue) if may_answer else None
    prompt = prompt_context(
        queue=queue,
        query_text=request_text,
        conversation=context,
        signature=signature,
        # The confidence's votes are read off as many neighbours as a generation's.
        pool=ranking.MEMORY_NEIGHBOURS
        if memory_fit
        else _ANSWER_POOL
        if may_answer and queue.memory_answer_threshold is not None
        else 0,
        retrieve=examples_recall_anywhere,
        token_id=token_id,
    )
    retrieved = _plan_retrieved(
        queue=queue,
        request=request,
        request_text=request_text,
        context=context,
        options=options,
        run_key=run_key,
        holdout=holdout,
        prompt=prompt,
    )
    if may_answer:
        answered = _memory_answered(retrieved, recall=prompt.recall, memory_fit=memory_fit)
        if answered is not None:
            return answered
    return _plan_for_model(retrieved, request=request, prompt=prompt)


def _plan_retrieved(
    *,
    queue: Queue,
    request: ChatRequest,
    request_text: str,
    context: list[dict[str, Any]],
    options: dict[str, Any],
    run_key: str,
    holdout: bool,
    prompt: PromptContext,
) -> Plan:
    """The plan as retrieval left it: what memory did for the call (used, empty, or
    unavailable), its coverage, and whether it goes to review; neither answer nor prompt yet."""
    recall = prompt.recall
    if prompt.memory_error is not None:
        # The headers and the log say the answer was made without memory.
        logger.warning(
            "Gateway call to %s answered without memory: %s", queue.slug, prompt.memory_error
        )
        memory = Call.Memory.UNAVAILABLE
    else:
        # Format examples alone (other tool sets' calls) say nothing of this request.
        own = any(not r.format_only for r in recall.examples) or recall.neighbours
        memory = Call.Memory.USED if own else Call.Memory.EMPTY
    # Coverage counts what this request's own tools were used for: a format example, of
    # another tool set, teaches the form of a call and says nothing of this request.
    top_score = max(
        (r.score for r in recall.examples + recall.neighbours if not r.format_only), default=None
    )
    return Plan(
        queue=queue,
        request_text=request_text,
        context=context,
        request_hash=hashlib.sha256(json.dumps(context).encode()).hexdigest(),
        memory=memory,
        examples=[],
        retrieval_ms=prompt.retrieval_ms,
        top_score=top_score,
        holdout=holdout,
        capture=capture_reason(queue=queue, top_score=top_score, memory=memory),
        options=options,
        trajectory_key=run_key,
        end_user=request.user or "",
    )


def _memory_answered(
    retrieved: Plan, *, recall: Recall, memory_fit: dict[str, Any] | None
) -> Plan | None:
    """The plan of a call memory answers (a plain-text call, not held out): by the nearest
    servable answer when it is within the queue's similarity threshold, else by the answer
    memory's own confidence is surest of, above the queue's. None: the model answers.

    Only plain text is answered from memory (and only plain examples are found for it). A
    stored tool call is never replayed, even to a call with the same tools: its arguments
    were right for its own state (an order number, a path), and a similar state is not the
    same one; the model, shown the example, writes the call for this one."""
    queue = retrieved.queue
    # Served as is, with no one reviewing it: only an approved example, where the queue asks.
    servable = [
        r
        for r in recall.neighbours
        if not queue.memory_answers_need_approval or r.example.approved_for_answers_at
    ]
    nearest = max(servable, key=lambda r: r.score, default=None)
    if nearest is None:
        return None
    threshold = queue.memory_answer_threshold
    if threshold is not None and nearest.score >= threshold:
        return replace(retrieved, examples=[nearest], memory_answer=nearest.example.output_text)
    if memory_fit is None or queue.memory_answer_confidence is None:
        return None
    best = ranking.memory_answer_best(
        queue=queue,
        recall=recall,
        # As the fit saw them: memory candidates are offered from this similarity up.
        offered=[r for r in servable if r.score >= queue.memory_min_similarity],
        memory_fit=memory_fit,
    )
    if best is None or best[1] < queue.memory_answer_confidence:
        return None
    hit, confidence = best
    return replace(
        retrieved,
        examples=[hit],
        memory_answer=hit.example.output_text,
        memory_confidence=confidence,
    )


def _plan_for_model(retrieved: Plan, *, request: ChatRequest, prompt: PromptContext) -> Plan:
    """The plan of a call the model answers: the caller's sampling parameters within the
    queue's limit on answer length, and the prompt with what fits the model's window (and the
    same without format examples, for the retry when the model calls a tool not offered)."""
    queue = retrieved.queue
    params = {"temperature": queue.temperature, "max_tokens": queue.max_tokens}
    params |= request.sampling()
    params["max_tokens"] = min(int(params["max_tokens"]), queue.max_tokens)
    model = queue.llm_model
    # A held-out call is retrieved for all the same (its coverage is measured alike), but
    # nothing retrieved reaches its prompt; of the rest, what fits the model's window.
    room = Room.of_call(
        model=model, api_base=queue.api_base, params=params, options=retrieved.options
    )
    sent = prompt.fitted(examples=[] if retrieved.holdout else prompt.recall.examples, room=room)
    own = [r for r in sent.examples if not r.format_only]
    retry = sent if len(own) == len(sent.examples) else prompt.fitted(examples=own, room=room)
    pace = queue_pace(queue.pk)
    expected_s = (
        None
        if pace is None
        else pace.expected_s(
            prompt_tokens=llm.prompt_tokens(sent.messages, tools=room.tools),
            max_tokens=int(params["max_tokens"]),
        )
    )
    return replace(
        retrieved,
        examples=sent.examples,
        messages=sent.messages,
        retry_messages=retry.messages,
        model=model,
        api_base=queue.api_base,
        params=params,
        playbook_version=prompt.playbook.number,
        expected_s=expected_s,
    )


def _memory_fit(queue: Queue) -> dict[str, Any] | None:
    """The queue's memory-only confidence, when it answers from memory by confidence and has
    one fitted (until then, only its similarity rule can answer from memory)."""
    if queue.memory_answer_confidence is None:
        return None
    return ranking.memory_fit_latest(queue_id=queue.pk)


def capture_reason(*, queue: Queue, top_score: float | None, memory: str) -> str:
    """Why a call goes to review: memory did not cover it (its nearest preferred example is
    below the queue's coverage threshold, or there is none), or the random sample took it.
    While memory is unavailable, coverage is unknown: only the sample is taken (else an
    outage would send every call to review, each costing N−1 more model calls)."""
    coverage = queue.capture_below_similarity
    known = memory != Call.Memory.UNAVAILABLE
    if known and coverage is not None and (top_score is None or top_score < coverage):
        return Call.Capture.UNCOVERED
    if random.random() * 100 < queue.capture_percent:
        return Call.Capture.SAMPLED
    return Call.Capture.NONE


@dataclass(frozen=True)
class CallLogged:
    """What a call's log row and its run's step are written from, in JSON's types, so that
    it can wait in the journal (`call_log`) until a writer writes it. Kept as it will be
    stored: the texts redacted (as REDACTION says for where the call goes), the end user as
    its keyed hash, and the run's digests taken from the call as it arrived, so that nothing
    the caller sent waits anywhere unredacted."""

    call_id: str
    queue_id: int
    token_id: int | None  # None: the token was deleted before the row was written
    answered_at: str  # ISO 8601: the row's created_at, whenever it is written
    stream: bool
    source: str
    memory: str  # what the caller was told memory did (a held-out call: nothing)
    request_text: str
    context: list[dict[str, Any]]
    request_hash: str
    options: dict[str, Any]
    examples: list[dict[str, Any]]
    top_score: float | None
    retrieval_ms: float
    holdout: bool
    capture: str
    memory_confidence: float | None
    trajectory_key: str
    end_user: str  # trajectories.services.end_user_key of the call's `user`
    model: str
    answer_text: str
    total_ms: float
    # What recognises the call's run (trajectories.services.RunHashes), and its tools' names.
    continuation_hash: str
    prefix_hashes: dict[str, int]
    tool_names: list[str]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    upstream_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    status_code: int = 200
    error: str = ""
    playbook_version: int | None = None
    # Where the time went upstream (`llm.Completion`); `asks`: 2 when the model was asked again.
    model_prompt_ms: float | None = None
    model_generation_ms: float | None = None
    cached_prompt_tokens: int = 0
    asks: int = 1

    @classmethod
    def of(
        cls,
        *,
        call_id: uuid.UUID,
        plan: Plan,
        token: IntegrationToken,
        stream: bool,
        answer_text: str,
        total_ms: float,
        tool_calls: list[dict[str, Any]] | None = None,
        upstream_ms: float | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        model: str = "",
        status_code: int = 200,
        error: str = "",
        model_prompt_ms: float | None = None,
        model_generation_ms: float | None = None,
        cached_prompt_tokens: int = 0,
        asks: int = 1,
    ) -> "CallLogged":
        """Blocking: the redaction takes its time (run it on a thread, not the event loop)."""
        kept = _kept(
            capture=plan.capture,
            status_code=status_code,
            request_text=plan.request_text,
            context=plan.context,
            options=plan.options,
            end_user=plan.end_user,
            answer_text=answer_text,
            tool_calls=tool_calls or [],
            error=error,
        )
        return cls(
            call_id=str(call_id),
            queue_id=plan.queue.pk,
            token_id=token.pk,
            answered_at=timezone.now().isoformat(),
            stream=stream,
            source=plan.source,
            memory=plan.served_memory,
            request_hash=plan.request_hash,
            examples=[
                {"id": str(r.example.pk), "score": round(r.score, 4)}
                | ({"format": True} if r.format_only else {})
                for r in plan.examples
            ],
            top_score=plan.top_score,
            retrieval_ms=plan.retrieval_ms,
            holdout=plan.holdout,
            capture=plan.capture,
            memory_confidence=plan.memory_confidence,
            playbook_version=plan.playbook_version,
            trajectory_key=plan.trajectory_key,
            model=model or plan.model or Call.Source.MEMORY,
            total_ms=total_ms,
            upstream_ms=upstream_ms,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            status_code=status_code,
            model_prompt_ms=model_prompt_ms,
            model_generation_ms=model_generation_ms,
            cached_prompt_tokens=cached_prompt_tokens,
            asks=asks,
            **kept,
        )

    @classmethod
    def of_entry(cls, entry: dict[str, Any]) -> "CallLogged":
        """A journal entry, as the writer reads it. One journaled by an earlier version holds
        the call as it arrived: it is redacted and hashed now, as `of` would have."""
        if "continuation_hash" in entry:
            return cls(**entry)
        kept = _kept(
            capture=entry["capture"],
            status_code=entry.get("status_code", 200),
            request_text=entry["request_text"],
            context=entry["context"],
            options=entry["options"],
            end_user=entry["end_user"],
            answer_text=entry["answer_text"],
            tool_calls=entry.get("tool_calls") or [],
            error=entry.get("error", ""),
        )
        return cls(**(entry | kept))


def _kept(
    *,
    capture: str,
    status_code: int,
    request_text: str,
    context: list[dict[str, Any]],
    options: dict[str, Any],
    end_user: str,
    answer_text: str,
    tool_calls: list[dict[str, Any]],
    error: str,
) -> dict[str, Any]:
    """A call's CallLogged fields that hold what its caller sent, as they are kept."""
    # Redacted for where the call goes: review (its item, then memory) or only the log. The
    # caller gets its answer whole; what is kept has placeholders where the personal data was
    # (under REDACTION="captured", a call not captured is kept as sent: nothing to do).
    into: Destination = "review" if capture and status_code == 200 else "log"
    hashes = run_hashes(messages=context, answer_text=answer_text, tool_calls=tool_calls)
    user = options.get("user")
    return {
        "request_text": scrub(request_text, into=into),
        "context": scrub(context, into=into),
        "answer_text": scrub(answer_text, into=into),
        "tool_calls": scrub(tool_calls, into=into),
        "error": scrub(error, into=into)[:500],  # an upstream may quote the request
        # `user` names the end user, as their runs do: by its keyed hash.
        "options": scrub(options, into=into) | ({"user": end_user_key(str(user))} if user else {}),
        "end_user": end_user_key(end_user),
        "continuation_hash": hashes.continuation,
        "prefix_hashes": hashes.prefixes,
        "tool_names": tool_names(options.get("tools")),
    }


def call_record(logged: CallLogged) -> Call | None:
    """Write the call's log row and, for a whole answer, its run's step; None when the row
    was written already (a journal entry is written at least once). What `logged` holds is
    stored as it is: it was redacted when it was made."""
    capture = logged.capture if logged.status_code == 200 else Call.Capture.NONE
    answered_at = datetime.fromisoformat(logged.answered_at)
    with transaction.atomic():
        try:
            with transaction.atomic():
                call = Call.objects.create(
                    id=uuid.UUID(logged.call_id),
                    created_at=answered_at,
                    queue_id=logged.queue_id,
                    token_id=logged.token_id,
                    source=logged.source,
                    memory=logged.memory,
                    stream=logged.stream,
                    status_code=logged.status_code,
                    error=logged.error,
                    request_text=logged.request_text,
                    context=logged.context,
                    request_hash=logged.request_hash,
                    answer_text=logged.answer_text,
                    tool_calls=logged.tool_calls,
                    options=logged.options,
                    examples=logged.examples,
                    top_score=logged.top_score,
                    model=logged.model,
                    retrieval_ms=round(logged.retrieval_ms),
                    upstream_ms=_rounded(logged.upstream_ms),
                    total_ms=round(logged.total_ms),
                    prompt_tokens=logged.prompt_tokens,
                    completion_tokens=logged.completion_tokens,
                    model_prompt_ms=_rounded(logged.model_prompt_ms),
                    model_generation_ms=_rounded(logged.model_generation_ms),
                    cached_prompt_tokens=logged.cached_prompt_tokens,
                    asks=logged.asks,
                    holdout=logged.holdout,
                    capture=capture,
                    memory_confidence=logged.memory_confidence,
                    playbook_version=logged.playbook_version,
                )
        except IntegrityError:
            if Call.objects.filter(pk=logged.call_id).exists():
                return None  # another writer wrote it: its step with it
            raise
        # A deleted token's runs have no owner left to continue them: no step.
        if logged.status_code == 200 and logged.token_id is not None:
            try:
                with transaction.atomic():
                    step_record(
                        queue=Queue(pk=logged.queue_id),
                        owner=RunOwner(token_id=logged.token_id, end_user=logged.end_user),
                        key=logged.trajectory_key,
                        messages=logged.context,
                        hashes=RunHashes(
                            continuation=logged.continuation_hash,
                            prefixes=logged.prefix_hashes,
                        ),
                        decision_point=logged.request_text,
                        action_text=logged.answer_text,
                        tool_calls=logged.tool_calls,
                        tool_names=logged.tool_names,
                        call_id=call.pk,
                        created_at=call.created_at,
                    )
            except DatabaseError:  # the call is logged and answered: its step is what is lost
                logger.exception("Call %s was logged without its trajectory step", call.pk)
    return call


def _rounded(ms: float | None) -> int | None:
    return None if ms is None else round(ms)
