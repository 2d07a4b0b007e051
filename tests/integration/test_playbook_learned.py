"""End to end on the real stack: decisions the first candidate lost are read by the real local
model as the reflector (its answer held to the schema by the server's grammar, fixed seed), a
curator approves what it proposes, and the next item the real worker generates carries the
learned rule in its prompt and names the version."""

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from icrlhf.generation.services import item_create
from icrlhf.playbook.models import Version
from icrlhf.queues.models import Item
from icrlhf.reflection import services
from icrlhf.reflection.models import Proposal
from tests.factories import QueueFactory, UserFactory, playbook_write, ranked_decision
from tests.support.local_llm import local_llm_server
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.llm, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def local_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_llm_server(
        settings.LOCAL_LLM, log_dir=tmp_path_factory.mktemp("llm"), slots=settings.LOCAL_LLM_SLOTS
    ) as api_base:
        yield api_base


def test_a_rule_is_learned_approved_and_used(
    worker_process: WorkerProcess, local_llm: str, settings: Any
) -> None:
    settings.REFLECTOR_MODEL = f"openai/{settings.LOCAL_LLM}"
    settings.REFLECTOR_API_BASE = local_llm
    settings.LLM_TIMEOUT_S = 300  # a few hundred tokens, on a busy 2-core machine
    curator = UserFactory()
    queue = QueueFactory(
        curators=[curator],
        model=f"openai/{settings.LOCAL_LLM}",
        api_base=local_llm,
        n_candidates=1,
        max_tokens=30,
    )
    playbook_write(queue, [("Tone", "Be brief.")])
    batch = {
        ranked_decision(queue, curator, pick_first=False).pk,
        ranked_decision(
            queue,
            curator,
            pick_first=True,
            text="Freeze the card in the app, then order a new one.",
        ).pk,
    }
    proposal = services.proposal_reflect(proposal_id=services.proposal_start(queue_id=queue.pk).pk)

    assert proposal.status == Proposal.Status.OPEN, proposal.notes
    for mutation in proposal.mutations.all():
        assert set(mutation.cites) <= batch  # held to what it was shown
        services.mutation_decide(queue=queue, mutation_id=mutation.pk, approve=True, actor=curator)
    made = services.proposal_apply(queue=queue, proposal_id=proposal.pk, actor=curator)
    assert made is not None and made.origin == Version.Origin.REFLECTION

    item = item_create(queue=queue, input_text="I lost my card.", created_by=curator)
    wait_for(
        lambda: Item.objects.get(pk=item.pk).status == Item.Status.READY,
        timeout_s=180,
        what="the real worker's candidate with the learned playbook",
    )
    generation = item.generations.get()
    assert generation.playbook == made
    system = generation.messages[0]["content"]
    assert f"(version {made.number})" in system
    # Every rule of the learned version, as stored (trimmed and redacted), is in the prompt.
    assert all(f"- {entry.text}" in system for entry in made.entries.all())
