"""What a chat completion request may hold: OpenAI's Chat Completions fields that matter here.

Unknown fields are ignored, as OpenAI-compatible servers do, except those that would change
what an answer is (tools, several choices, images): those are refused, not silently dropped."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    @field_validator("content")
    @classmethod
    def _no_nul(cls, content: str | list[TextPart] | None) -> str | list[TextPart] | None:
        parts = content if isinstance(content, list) else [content]
        if any(
            "\x00" in (part.text if isinstance(part, TextPart) else part or "") for part in parts
        ):
            raise ValueError("text must not contain NUL (0x00) characters")
        return content

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


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
    tools: None = Field(default=None, description="Tools are not supported.")
    functions: None = Field(default=None, description="Functions are not supported.")

    @field_validator("tools", "functions", mode="before")
    @classmethod
    def _refuse_tools(cls, value: Any) -> None:
        if value:
            raise ValueError("tool and function calls are not supported by the gateway")
        return None

    @field_validator("messages")
    @classmethod
    def _ends_with_user(cls, messages: list[Message]) -> list[Message]:
        if messages[-1].role != "user" or not messages[-1].text.strip():
            raise ValueError("the last message must be a non-empty message from the user")
        return messages

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
