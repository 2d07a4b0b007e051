"""A streamed answer: its pieces as they arrive, the tool calls assembled, the tokens counted
at the end."""

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from icrlhf.integrations.llm.client import (
    call_options,
    extra_options,
    litellm_module,
    register_if_unlisted,
)
from icrlhf.integrations.llm.errors import failure
from icrlhf.integrations.llm.tokens import count_tokens
from icrlhf.integrations.text_checks import storable
from icrlhf.integrations.text_tool_calls import (
    calls_in_text,
    could_become_calls,
    offered_tools,
)


class Stream:
    """A streamed completion: iterate for the text as it comes; once the iteration ends,
    `prompt_tokens` and `completion_tokens` hold the usage (estimated if the model sent none).
    A failure before or during the stream raises LLMError."""

    def __init__(
        self,
        *,
        messages: list[dict[str, Any]],
        chunks: AsyncIterator[Any],
        offered: frozenset[str] = frozenset(),
    ) -> None:
        self._messages = messages
        self._chunks = chunks
        # The request's tools: words that may yet turn out to be calls of them are held back.
        self._offered = offered
        self._held = ""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.text = ""
        self.finish_reason = "stop"
        self.tool_calls: list[dict[str, Any]] = []  # assembled from the deltas, by index

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        """Each delta to pass on, in OpenAI's shape: {"content": …} or {"tool_calls": […]}."""
        try:
            async for chunk in self._chunks:
                usage = getattr(chunk, "usage", None)
                if usage is not None:
                    self.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
                    self.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
                choices = getattr(chunk, "choices", None) or []
                if choices and getattr(choices[0], "finish_reason", None):
                    self.finish_reason = str(choices[0].finish_reason)
                delta = getattr(choices[0], "delta", None) if choices else None
                piece = getattr(delta, "content", None) or ""
                if piece:
                    for words in self._words(storable(piece)):
                        yield words
                calls = [
                    _tool_call_delta(call) for call in getattr(delta, "tool_calls", None) or []
                ]
                if calls:
                    self._assemble(calls)
                    yield {"tool_calls": calls}
        except Exception as error:
            raise failure(error) from error
        if self._held:
            yield self._held_answer()
        if self.tool_calls and self.finish_reason == "stop":
            self.finish_reason = "tool_calls"  # some servers say "stop" after tool calls
        if not self.prompt_tokens:
            self.prompt_tokens = sum(count_tokens(text_of(m)) for m in self._messages)
        if not self.completion_tokens and (self.text or self.tool_calls):
            self.completion_tokens = count_tokens(self.text + json.dumps(self.tool_calls))

    def _words(self, piece: str) -> Iterator[dict[str, Any]]:
        """The words to pass on now: none while what has come may still be calls only."""
        if self._offered and not self.text and could_become_calls(self._held + piece):
            self._held += piece
            return
        piece, self._held = self._held + piece, ""
        self.text += piece
        yield {"content": piece}

    def _held_answer(self) -> dict[str, Any]:
        """The held-back answer, once it has ended: calls, when it is calls only."""
        held, self._held = self._held, ""
        calls = [] if self.tool_calls else calls_in_text(held, self._offered)
        if not calls:
            self.text += held
            return {"content": held}
        self.tool_calls = [dict(call) for call in calls]
        self.finish_reason = "tool_calls"
        return {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}

    def _assemble(self, deltas: list[dict[str, Any]]) -> None:
        for delta in deltas:
            index = int(delta.get("index") or 0)
            while len(self.tool_calls) <= index:
                empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                self.tool_calls.append(empty)
            call = self.tool_calls[index]
            call["id"] = delta.get("id") or call["id"]
            function = delta.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _tool_call_delta(call: Any) -> dict[str, Any]:
    """A streamed tool call's piece as OpenAI streams it: index, and what this piece adds."""
    function = getattr(call, "function", None)
    delta: dict[str, Any] = {"index": int(getattr(call, "index", 0) or 0)}
    if getattr(call, "id", None):
        delta["id"] = storable(str(call.id))
        delta["type"] = "function"
    pieces = {
        "name": getattr(function, "name", None),
        "arguments": getattr(function, "arguments", None),
    }
    delta["function"] = {
        key: storable(str(value)) for key, value in pieces.items() if value is not None
    }
    return delta


async def astream(
    *,
    messages: list[dict[str, Any]],
    model: str,
    params: dict[str, Any],
    api_base: str = "",
    options: dict[str, Any] | None = None,
    mock_response: str | None = None,
) -> Stream:
    """Starts a streamed completion. Connection and request errors raise here, before
    anything is sent to the caller, so they can still become a proper error response."""
    litellm = litellm_module()
    register_if_unlisted(model)
    extra = extra_options(mock_response)
    try:
        chunks = await litellm.acompletion(
            model=model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **(call_options(params, api_base) | (options or {})),
            **extra,
        )
    except Exception as error:
        raise failure(error) from error
    return Stream(messages=messages, chunks=chunks, offered=offered_tools(options))
