"""The `llm_answer` fixture's type (tests/conftest.py): a test double of the model's answer,
through litellm's own offline switch, so litellm's real code path runs with no network."""

from collections.abc import Callable

# Called with the text every later LLM call answers ("litellm.RateLimitError" raises it).
LLMAnswer = Callable[[str], None]
