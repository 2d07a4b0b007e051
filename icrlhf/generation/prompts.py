"""The prompt: system prompt, guidelines, retrieved preferred examples, then the request.

Examples go in as earlier user/assistant turns, most similar last, next to the new request:
with small models this did better than a list of examples inside the system prompt.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptExample:
    input_text: str
    output_text: str


EXAMPLES_PREAMBLE = (
    "The earlier turns of this conversation are requests similar to the new one, each "
    "followed by the answer reviewers preferred (reward 1.0). Answer the last request in the "
    "same way."
)


def messages_build(
    *,
    system_prompt: str,
    guidelines: str,
    guidelines_version: int,
    examples: Sequence[PromptExample],
    request: str,
    instructions: str = "",
    history: Sequence[dict[str, str]] = (),
) -> list[dict[str, str]]:
    """`examples` come most similar first, as retrieved; they are sent most similar last.
    `instructions` (the answer format of a triage queue) follow the system prompt. `history`
    (the earlier turns of a gateway caller's conversation) goes between the examples and the
    request, as the caller sent it."""
    system_parts = [system_prompt.strip(), instructions.strip()]
    if guidelines.strip():
        system_parts.append(f"Guidelines (version {guidelines_version}):\n{guidelines.strip()}")
    if examples:
        system_parts.append(EXAMPLES_PREAMBLE)
    messages = [{"role": "system", "content": "\n\n".join(part for part in system_parts if part)}]
    for example in reversed(examples):
        messages.append({"role": "user", "content": example.input_text})
        messages.append({"role": "assistant", "content": example.output_text})
    messages.extend(history)
    messages.append({"role": "user", "content": request})
    return messages
