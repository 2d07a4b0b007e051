"""A model's reply as the product reads it: its text, its tool calls (also those written as
text), its tokens and cost."""

from dataclasses import dataclass
from typing import Any

from icrlhf.integrations.llm.errors import PermanentLLMError
from icrlhf.integrations.llm.tokens import count_tokens
from icrlhf.integrations.text_checks import storable
from icrlhf.integrations.text_tool_calls import (
    calls_in_text,
)


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_ms: int
    finish_reason: str = "stop"  # "length": cut at the token limit; "tool_calls"
    # In OpenAI's shape: [{"id", "type": "function", "function": {"name", "arguments"}}].
    tool_calls: tuple[dict[str, Any], ...] = ()
    logprobs: dict[str, Any] | None = None  # where the upstream returned them
    # Where the upstream reports them (llama.cpp's `timings`): the model's time reading the
    # prompt and writing the answer. The rest of the call's time was spent before the model
    # started: waiting for a free slot on its server, and the network.
    model_prompt_ms: float | None = None
    model_generation_ms: float | None = None
    cached_prompt_tokens: int = 0  # prompt tokens the server reused instead of reading again


def completion_from(
    response: Any, *, model: str, latency_ms: int, offered: frozenset[str] = frozenset()
) -> Completion:
    return completions_from(response, model=model, latency_ms=latency_ms, offered=offered)[0]


def completions_from(
    response: Any, *, model: str, latency_ms: int, offered: frozenset[str] = frozenset()
) -> list[Completion]:
    """One completion per choice of the response (several when `n` asked for several).
    An answer that is nothing but calls of the `offered` tools, written as text, is those
    calls (integrations/text_tool_calls.py).

    With several, each answer's completion tokens are estimated from its text (servers
    disagree on what their usage counts: OpenAI the sum, llama.cpp one answer's) and the
    call's cost is shared out in proportion; each counts the prompt it was written for."""
    try:
        choices = list(response.choices)
        contents = [choice.message.content for choice in choices]
        tool_calls = [_tool_calls_of(choice.message) for choice in choices]
    except (AttributeError, TypeError) as error:
        raise PermanentLLMError("The model's answer had no message in it.") from error
    if not choices:
        raise PermanentLLMError("The model's answer had no message in it.")
    # An answer is untrusted text, which must reach the call log as it reaches the caller.
    texts = [storable(c).strip() if isinstance(c, str) else "" for c in contents]
    finish_reasons = [str(choice.finish_reason or "") for choice in choices]
    for index, (text, calls) in enumerate(zip(texts, tool_calls, strict=True)):
        written = () if calls else calls_in_text(text, offered)
        if written:
            texts[index], tool_calls[index], finish_reasons[index] = "", written, "tool_calls"
    if not all(text or calls for text, calls in zip(texts, tool_calls, strict=True)):
        raise PermanentLLMError("The model returned an empty answer.")
    usage = getattr(response, "usage", None)
    reported = int(getattr(usage, "completion_tokens", 0) or 0)
    tokens = [reported] if len(texts) == 1 else [count_tokens(text) for text in texts]
    # litellm prices the call itself; unknown models (local ones) have no price.
    cost = float((getattr(response, "_hidden_params", None) or {}).get("response_cost") or 0.0)
    prompt_ms, generation_ms = _model_times(response)
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", 0)
    return [
        Completion(
            text=text,
            model=str(getattr(response, "model", None) or model),
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=answer_tokens,
            cost_usd=cost * answer_tokens / max(1, sum(tokens)),
            latency_ms=latency_ms,
            finish_reason=finish_reason or ("tool_calls" if calls else "stop"),
            tool_calls=calls,
            logprobs=_plain(getattr(choice, "logprobs", None)),
            model_prompt_ms=prompt_ms,
            model_generation_ms=generation_ms,
            cached_prompt_tokens=_count(cached),
        )
        for text, choice, answer_tokens, calls, finish_reason in zip(
            texts, choices, tokens, tool_calls, finish_reasons, strict=True
        )
    ]


def _model_times(response: Any) -> tuple[float | None, float | None]:
    """The model's prompt and generation times in ms, where the server reports them (llama.cpp
    adds `timings` to its answer, which litellm keeps as an attribute), else None."""
    timings = getattr(response, "timings", None)
    if not isinstance(timings, dict):
        return None, None
    return _ms(timings.get("prompt_ms")), _ms(timings.get("predicted_ms"))


def _ms(value: Any) -> float | None:
    # An upstream's figure is untrusted: a number of ms or nothing.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < 86_400_000 else None


def _count(value: Any) -> int:
    # Untrusted too: a count, below what the call log's column holds.
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return value if 0 < value < 1_000_000_000 else 0


def _tool_calls_of(message: Any) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "id": storable(str(call.id)),
            "type": "function",
            "function": {
                "name": storable(str(call.function.name)),
                "arguments": storable(str(call.function.arguments or "")),
            },
        }
        for call in getattr(message, "tool_calls", None) or []
    )


def _plain(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    dumped = value.model_dump() if hasattr(value, "model_dump") else value
    return dumped if isinstance(dumped, dict) else None
