"""What a chat completion request may hold: OpenAI's Chat Completions fields that matter here.

Tools, tool calls and tool results, structured output and the sampling fields pass through
to the upstream as OpenAI defines them. Unknown fields are ignored, as OpenAI-compatible
servers do, except those that would change what an answer is (several choices, images, audio,
the legacy `functions`): those are refused with the field named, not silently dropped. So is
text the call log cannot store (NUL, lone surrogates), wherever in the body it is."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from icrlhf.integrations.text_checks import refuse_unstorable_text


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=200)
    arguments: str = Field(max_length=100_000)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)  # assistant
    tool_call_id: str | None = Field(default=None, max_length=200)  # tool
    name: str | None = Field(default=None, max_length=200)

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text":
                raise ValueError(f"content parts of type “{kind}” are not supported; send text")
        return content

    @model_validator(mode="after")
    def _tool_turns_complete(self) -> "Message":
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the `tool_call_id` it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry `tool_calls`")
        return self

    def upstream(self) -> dict[str, Any]:
        """The message as sent upstream: its text, and its tool calls or the call it answers."""
        message: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
            message["content"] = self.text or None
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.name and self.role in ("user", "assistant", "tool"):
            message["name"] = self.name
        return message

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")  # `strict` and what comes next pass through
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(default=None, max_length=10_000)
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = "function"
    function: FunctionDefinition

    @field_validator("type")
    @classmethod
    def _functions_only(cls, kind: str) -> str:
        if kind != "function":
            raise ValueError(f"tools of type “{kind}” are not supported; send function tools")
        return kind


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema_named(self) -> "ResponseFormat":
        if self.type == "json_schema" and not (self.json_schema and self.json_schema.get("name")):
            raise ValueError("`json_schema` needs a `name` and a `schema`")
        return self


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=200)
    messages: list[Message] = Field(min_length=1, max_length=500)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    n: int | None = Field(default=None, ge=1, le=1, description="One choice per call.")
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    user: str | None = Field(default=None, max_length=500)
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    functions: None = Field(default=None, description="Send `tools` instead.")
    audio: None = Field(default=None, description="Audio output is not supported.")

    # Every string in the body, keys and ignored fields too: the call log keeps much of it
    # (`user`, tools' schemas, tool calls' arguments, …) and is written after the answer, so
    # text it cannot store would leave a call served and unlogged.
    _storable = model_validator(mode="wrap")(refuse_unstorable_text)

    @field_validator("metadata")
    @classmethod
    def _metadata_plain(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        """OpenAI's limits: 16 keys of up to 64 characters, values of up to 512."""
        for key, value in (metadata or {}).items():
            if len(key) > 64 or len(value) > 512:
                raise ValueError("keys may have 64 characters, values 512")
        return metadata

    @field_validator("functions", "audio", mode="before")
    @classmethod
    def _refuse(cls, value: Any) -> None:
        if value:
            raise ValueError("not supported by the gateway (send `tools` for function calling)")
        return None

    @field_validator("messages")
    @classmethod
    def _ends_at_a_decision(cls, messages: list[Message]) -> list[Message]:
        """The model is asked for the next step: after the user's words, or after tool results."""
        last = messages[-1]
        if last.role == "tool":
            return messages
        if last.role != "user" or not last.text.strip():
            raise ValueError(
                "the last message must be a non-empty message from the user, or a tool result"
            )
        return messages

    @property
    def goal(self) -> str:
        """What the conversation is for: its first user message."""
        return next((m.text for m in self.messages if m.role == "user"), "")

    def upstream_options(self) -> dict[str, Any]:
        """The tool and output fields, as litellm passes them on."""
        values: dict[str, Any] = {
            "tools": None
            if self.tools is None
            else [t.model_dump(exclude_none=True) for t in self.tools],
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": (
                None
                if self.response_format is None
                else self.response_format.model_dump(exclude_none=True)
            ),
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "user": self.user,
        }
        return {key: value for key, value in values.items() if value is not None}

    def sampling(self) -> dict[str, Any]:
        """The caller's sampling parameters, as litellm names them."""
        values = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_completion_tokens or self.max_tokens,
            "seed": self.seed,
            "stop": self.stop,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }
        return {key: value for key, value in values.items() if value is not None}
