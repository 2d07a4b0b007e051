"""What an anonymised export does to a value, whichever export it is in."""

import json
from typing import Any

from icrlhf.export import anonymity

EMAIL = "jane.doe@example.com"


def _call(arguments: str) -> dict[str, object]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": "mail", "arguments": arguments},
    }


def test_not_anonymised_words_pass_the_redaction_mode_and_identities_stay(
    settings: Any,
) -> None:
    assert anonymity.text(EMAIL, anonymize=False) == "[email]"  # REDACTION=captured
    assert anonymity.identity("user-jane-42", anonymize=False) == "user-jane-42"
    settings.REDACTION = "off"
    message = {"role": "user", "name": "jane_doe", "content": f"I am {EMAIL}."}
    call = _call(json.dumps({"to": EMAIL}))
    assert anonymity.identity("user-jane-42", anonymize=False) == "user-jane-42"
    assert anonymity.text(EMAIL, anonymize=False) == EMAIL
    assert anonymity.messages([message], anonymize=False) == [message]
    assert anonymity.tool_calls([call], anonymize=False) == [call]
    assert anonymity.action({"tool_calls": [call]}, anonymize=False) == {"tool_calls": [call]}


def test_an_identity_is_left_out_and_text_is_redacted() -> None:
    assert anonymity.identity("user-jane-42", anonymize=True) is None
    assert anonymity.text("Card 4111 1111 1111 1111.", anonymize=True) == "Card [card number]."
    assert anonymity.text("", anonymize=True) == ""


def test_compact_json_text_is_redacted_and_stays_json() -> None:
    compact = json.dumps({"to": EMAIL, "n": 3}, separators=(",", ":"))
    [call] = anonymity.tool_calls([_call(compact)], anonymize=True)
    assert json.loads(call["function"]["arguments"]) == {"to": "[email]", "n": 3}
    result = {"role": "tool", "tool_call_id": "call_1", "content": compact}
    [redacted] = anonymity.messages([result], anonymize=True)
    assert json.loads(redacted["content"]) == {"to": "[email]", "n": 3}
    corrected = anonymity.action({"tool_calls": [_call(compact)]}, anonymize=True)
    assert EMAIL not in json.dumps(corrected)
    # Nothing personal in it: the text is kept byte for byte, spacing and all.
    untouched = '{"order_id":"4821",  "amount":20}'
    assert anonymity.tool_calls([_call(untouched)], anonymize=True) == [_call(untouched)]


def test_a_user_messages_name_is_left_out_and_an_assistants_kept() -> None:
    messages = [
        {"role": "user", "name": "jane_doe", "content": f"Mail {EMAIL}."},
        {"role": "assistant", "name": "desk", "content": "Done."},
    ]
    assert anonymity.messages(messages, anonymize=True) == [
        {"role": "user", "content": "Mail [email]."},
        {"role": "assistant", "name": "desk", "content": "Done."},
    ]
