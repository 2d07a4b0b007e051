"""Every benchmark that asks an LLM takes `--local-llm NAME` (one of the local catalogue's
models, started for the run) beside `--llm-api-base`, from one shared option helper."""

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError

from bench.world import llm_endpoint, local_llm_chosen
from icrlhf.ops.catalogue import LOCAL_MODELS, local_model

ASKING_AN_LLM = [
    "bench_agent",
    "bench_bfcl",
    "bench_learning",
    "bench_llm",
    "bench_pipeline",
    "bench_scienceworld",
    "bench_traffic",
    "bench_triage",
    "bench_workbench",
]


@pytest.mark.parametrize("command", ASKING_AN_LLM)
@pytest.mark.parametrize("name", sorted(LOCAL_MODELS))
def test_every_benchmark_asking_an_llm_takes_a_local_model_of_the_catalogue(
    command: str, name: str
) -> None:
    parser = load_command_class("bench", command).create_parser("manage.py", command)
    assert parser.parse_args(["--local-llm", name]).local_llm == name


@pytest.mark.parametrize("command", ["bench_triage", "bench_llm"])
def test_an_unknown_local_model_is_named_with_the_catalogues(command: str) -> None:
    with pytest.raises(CommandError) as refused:
        call_command(command, "--local-llm", "llama-70b")
    message = str(refused.value)
    assert "--local-llm" in message and "'llama-70b'" in message
    assert all(name in message for name in LOCAL_MODELS)


def test_a_local_model_and_another_endpoint_are_not_both_asked() -> None:
    options = {"local_llm": "qwen2.5-coder-0.5b", "llm_api_base": "http://127.0.0.1:9/v1"}
    with pytest.raises(CommandError, match="--local-llm starts a local model"):
        local_llm_chosen(options)


def test_without_the_option_the_local_llm_is_local_llms() -> None:
    model, path = local_llm_chosen({})
    assert model == local_model("smollm2-135m") and path.name == model.file_name


def test_another_endpoint_is_asked_for_the_model_named_else_the_local_ones_alias() -> None:
    with llm_endpoint({"llm_api_base": "http://127.0.0.1:9/v1"}) as chosen:
        assert chosen == {"LLM_API_BASE": "http://127.0.0.1:9/v1", "LLM_MODEL": "openai/smollm2"}
    with llm_endpoint({"llm_api_base": "http://h/v1", "llm_model": "openai/x"}) as chosen:
        assert chosen["LLM_MODEL"] == "openai/x"
