"""Test double of the remote retrieval's socket: the store owner answers in the asking
thread."""

import time
from typing import Any


def recall_answered_here(query: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """Test double of `remote_recall.ask`: the store owner's round of one, in this thread."""
    from icrlhf.integrations.local_socket import Asked
    from icrlhf.memory import recall_owner, remote_recall

    asked = Asked(request=query, deadline=time.monotonic() + timeout_s)
    recall_owner.answer_round([asked])
    return remote_recall.answer_read(asked.answer)
