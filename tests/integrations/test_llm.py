"""The start-up warm-up of the LLM client (the gateway and the worker call it)."""

from tests.support.fresh_process import fresh_process_output


def test_warming_up_imports_what_a_first_call_to_an_openai_compatible_server_would() -> None:
    # In a fresh process: this one may have imported the client's resources already.
    output = fresh_process_output(
        "import sys; from icrlhf.integrations import llm; "
        "before = 'openai.resources.chat' in sys.modules; llm.warm_up(); "
        "print(before, 'openai.resources.chat' in sys.modules)"
    )

    assert output.split()[-2:] == ["False", "True"]
