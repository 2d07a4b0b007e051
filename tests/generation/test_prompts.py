from icrlhf.generation.prompts import EXAMPLES_PREAMBLE, PromptExample, messages_build


def test_examples_become_earlier_turns_most_similar_last() -> None:
    messages = messages_build(
        system_prompt="Be helpful.",
        guidelines="",
        guidelines_version=3,
        examples=[PromptExample("closest?", "closest answer"), PromptExample("far?", "far answer")],
        request="new question?",
    )
    assert messages == [
        {"role": "system", "content": f"Be helpful.\n\n{EXAMPLES_PREAMBLE}"},
        {"role": "user", "content": "far?"},
        {"role": "assistant", "content": "far answer"},
        {"role": "user", "content": "closest?"},
        {"role": "assistant", "content": "closest answer"},
        {"role": "user", "content": "new question?"},
    ]


def test_without_examples_the_prompt_has_no_examples_preamble() -> None:
    messages = messages_build(
        system_prompt="Be helpful.",
        guidelines="Cite the policy.",
        guidelines_version=2,
        examples=[],
        request="q",
    )
    assert messages == [
        {"role": "system", "content": "Be helpful.\n\nGuidelines (version 2):\nCite the policy."},
        {"role": "user", "content": "q"},
    ]
