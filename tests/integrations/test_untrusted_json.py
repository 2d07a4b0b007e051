"""JSON someone else wrote: read when it is standard JSON nested within bounds, otherwise
`NotJson`, never another exception; written back as text both databases store."""

import json

import pytest

from icrlhf.integrations import untrusted_json
from icrlhf.integrations.text_checks import unstorable_text


def test_standard_json_is_read() -> None:
    assert untrusted_json.loads('{"order": "4821", "items": [1, 2.5, true, null]}') == {
        "order": "4821",
        "items": [1, 2.5, True, None],
    }
    nested = "[" * untrusted_json.MAX_DEPTH + "]" * untrusted_json.MAX_DEPTH
    assert untrusted_json.loads(nested) is not None


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "",
        None,
        42,
        '{"amount": NaN}',
        "[Infinity]",
        "[-Infinity]",
        '{"amount": 1e999}',  # past the float range: infinity to Python (found by review)
        "[-1E400]",
        "[" * (untrusted_json.MAX_DEPTH + 1) + "]" * (untrusted_json.MAX_DEPTH + 1),
        "[" * 100_000,
        "[" * 100_000 + "]" * 100_000,
        '{"a": ' * 5_000 + "1" + "}" * 5_000,
    ],
    ids=lambda text: repr(text)[:30],
)
def test_anything_else_is_not_json_and_nothing_else_is_raised(text: object) -> None:
    with pytest.raises(untrusted_json.NotJson):
        untrusted_json.loads(text)


def test_an_escaped_lone_surrogate_is_written_back_as_an_escape() -> None:
    value = untrusted_json.loads('{"a": "\\ud800 x", "b": "café"}')

    written = untrusted_json.dumps(value)

    assert unstorable_text(written) is None
    written.encode()  # UTF-8, as both databases store text
    assert json.loads(written) == value
    # Without one, other characters stay as they are, for people to read.
    assert untrusted_json.dumps({"b": "café"}) == '{"b": "café"}'
