"""A real tool loop through the real gateway process (the openai client, the fixed-latency
endpoint as the model: it calls the first tool, then answers the tool's result) becomes a
trajectory the queue's members can open."""

import json
import uuid

import pytest
from django.test import Client

from icrlhf.trajectories.models import Trajectory
from tests.factories import QueueFactory, UserFactory
from tests.gateway.test_endpoint import client_for
from tests.gateway.test_tools import ORDER_TOOL, QUESTION
from tests.support.fixed_latency_llm import FixedLatencyLLM
from tests.support.processes import GatewayProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_agents_tool_loop_becomes_one_trajectory_grouped_with_or_without_an_id(
    gateway_process: GatewayProcess, fixed_llm: FixedLatencyLLM
) -> None:
    reviewer = UserFactory()
    queue = QueueFactory(members=[reviewer])
    client = client_for(gateway_process, queue)

    def run(**extra: object) -> None:
        messages: list[dict[str, object]] = [{"role": "user", "content": QUESTION}]
        for _ in range(2):
            answer = client.chat.completions.create(
                model=queue.slug, messages=messages, tools=[ORDER_TOOL], **extra
            )
            message = answer.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": "Shipped on Monday."}
                )
            if not message.tool_calls:
                break

    run()  # grouped by its messages
    run(extra_headers={"X-Icrlhf-Trajectory": f"run-{uuid.uuid4()}"})
    run(metadata={"trajectory_id": "run-from-metadata"})
    wait_for(lambda: queue.calls.count() == 6, what="six calls logged")
    trajectories = list(Trajectory.objects.filter(queue=queue).order_by("created_at"))
    assert [t.step_count for t in trajectories] == [2, 2, 2]
    assert [t.grouping for t in trajectories] == ["continuation", "key", "key"]
    assert trajectories[2].key == "run-from-metadata"
    grouped = trajectories[0]
    first, second = grouped.steps.order_by("position")
    assert first.tool_calls[0]["function"]["name"] == "look_up_order"
    assert json.loads(first.tool_calls[0]["function"]["arguments"]) == {"query": QUESTION}
    assert second.observation[0]["content"] == "Shipped on Monday."
    assert "tool result Shipped on Monday." in second.action_text
    assert first.call is not None and first.call.queue == queue

    browser = Client()
    browser.force_login(reviewer)
    page = browser.get(f"/q/{queue.slug}/trajectories/{grouped.pk}/").content.decode()
    assert "look_up_order" in page and "tool result Shipped on Monday." in page
