"""A queue's playbook: every change a new version, kept; an entry's words never change under
it; a refused entry saves nothing; the counts follow reviewed generations; a file goes out
and comes back."""

import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from icrlhf.playbook import services
from icrlhf.playbook.models import Entry, Version
from icrlhf.playbook.selectors import playbook_in_force, versions_history
from icrlhf.playbook.services import EntryDraft
from tests.factories import QueueFactory, UserFactory, playbook_write

pytestmark = pytest.mark.django_db


def _texts(version: Version) -> list[str]:
    return [e.text for e in version.entries.order_by("section", "key")]


def test_each_change_is_a_new_version_and_the_entries_keep_their_keys() -> None:
    queue, curator = QueueFactory(), UserFactory()
    first = playbook_write(queue, [("Tone", "Be brief."), ("Cards", "Ask for the last four.")])
    assert first.number == 1 and sorted(e.name for e in first.entries.all()) == ["E1", "E2"]

    tone = Entry.objects.get(queue=queue, text="Be brief.")
    edited = services.entry_edit(
        queue=queue, key=tone.key, section="Tone", text="Be brief and kind.", author=curator
    )
    assert edited.number == 2 and edited.author == curator
    new_tone = edited.entries.get(key=tone.key)
    assert new_tone.pk != tone.pk and new_tone.revises == tone
    # The earlier version still says what its prompts carried.
    assert _texts(Version.objects.get(queue=queue, number=1)) == [
        "Ask for the last four.",
        "Be brief.",
    ]

    added = services.entry_add(queue=queue, section="Refunds", text="No dates.", author=curator)
    retired = services.entry_retire(queue=queue, key=tone.key, author=curator)
    assert (added.number, retired.number) == (3, 4)
    assert _texts(retired) == ["Ask for the last four.", "No dates."]
    history = {change.version.number: change for change in versions_history(queue)}
    assert [e.name for e in history[2].edited] == ["E1"]
    assert [e.name for e in history[3].added] == ["E3"]
    assert [e.name for e in history[4].retired] == ["E1"]


def test_a_rollback_is_one_action_and_brings_the_same_entries_back() -> None:
    queue, curator = QueueFactory(), UserFactory()
    first = playbook_write(queue, [("Tone", "Be brief.")])
    services.entry_add(queue=queue, section="Tone", text="Say sorry once.", author=curator)
    restored = services.version_restore(queue=queue, number=1, author=curator)
    assert restored.number == 3 and restored.origin == Version.Origin.ROLLBACK
    assert restored.restored_from == first
    # The very entry rows: their counts go on.
    assert set(restored.entries.all()) == set(first.entries.all())
    with pytest.raises(ValidationError, match="Nothing changed"):
        services.version_restore(queue=queue, number=1, author=curator)
    with pytest.raises(ValidationError, match="no version 9"):
        services.version_restore(queue=queue, number=9, author=curator)


def test_a_refused_entry_saves_nothing_and_says_which_and_why() -> None:
    queue = QueueFactory()
    playbook_write(queue, [("Tone", "Be brief.")])
    with pytest.raises(ValidationError, match=r"Entry 2: .*link"):
        playbook_write(queue, [("Tone", "Be brief."), ("Tone", "See https://evil.example")])
    assert Version.objects.filter(queue=queue).count() == 1
    assert Entry.objects.filter(queue=queue).count() == 1


def test_what_end_users_wrote_is_redacted_before_it_is_stored() -> None:
    queue = QueueFactory()
    version = playbook_write(queue, [("Cards", "Like ana@example.com, confirm the e-mail.")])
    text = version.entries.get().text
    assert "ana@example.com" not in text and "confirm the e-mail" in text
    assert "ana@example.com" not in version.prompt_text


def test_the_prompt_reads_the_version_in_force_in_one_query(
    django_assert_num_queries: Any,
) -> None:
    queue = QueueFactory()
    assert playbook_in_force(queue).text == "" and playbook_in_force(queue).number is None
    playbook_write(queue, [("Tone", "Be brief."), ("Cards", "Ask for the last four.")])
    with django_assert_num_queries(1):
        in_force = playbook_in_force(queue)
    assert in_force.number == 1
    assert in_force.text == "Cards:\n- Ask for the last four.\nTone:\n- Be brief."


def test_a_playbook_holds_at_most_its_limit() -> None:
    queue = QueueFactory()
    with pytest.raises(ValidationError, match="at most 40 entries"):
        playbook_write(queue, [("Rules", f"Rule number {n}.") for n in range(41)])


def test_export_then_import_into_another_queue_keeps_the_words_not_the_sources() -> None:
    source, target, curator = QueueFactory(), QueueFactory(), UserFactory()
    services.version_create(
        queue_id=source.pk,
        drafts=[EntryDraft(section="Tone", text="Be brief.", sources=(7, 9))],
        origin=Version.Origin.WRITTEN,
        author=None,
    )
    exported = services.playbook_export(source)
    assert exported["version"] == 1 and exported["entries"][0]["sources"] == [7, 9]
    imported = services.playbook_import(
        queue=target, raw=json.dumps(exported).encode(), author=curator
    )
    entry = imported.entries.get()
    assert (entry.queue, entry.text, entry.sources) == (target, "Be brief.", [])
    assert imported.origin == Version.Origin.IMPORTED
    # Into its own queue, an entry it holds word for word is that entry again.
    playbook_write(source, [("Tone", "Be brief."), ("Tone", "Say sorry once.")])
    assert Entry.objects.filter(queue=source, text="Be brief.").count() == 1
    back = services.playbook_import(queue=source, raw=json.dumps(exported).encode(), author=curator)
    assert back.entries.get() == Entry.objects.get(queue=source, key=1, text="Be brief.")


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"not json", "not JSON"),
        (b'{"entries": []}', "not a playbook"),
        (b'{"format": "icrlhf-playbook", "entries": {}}', "must be a list"),
        (b'{"format": "icrlhf-playbook", "entries": [{"section": 1, "text": "x"}]}', "Entry 1"),
        (
            b'{"format": "icrlhf-playbook", "entries": [{"section": "A", "text": "<b>x</b>"}]}',
            "markup",
        ),
    ],
)
def test_a_bad_file_is_refused_with_a_reason_and_nothing_changes(raw: bytes, said: str) -> None:
    queue = QueueFactory()
    playbook_write(queue, [("Tone", "Be brief.")])
    with pytest.raises(ValidationError, match=said):
        services.playbook_import(queue=queue, raw=raw, author=UserFactory())
    assert Version.objects.filter(queue=queue).count() == 1


def test_outcomes_count_on_the_entries_the_prompt_held_and_an_undo_takes_them_back() -> None:
    queue = QueueFactory()
    first = playbook_write(queue, [("Tone", "Be brief.")])
    services.outcome_record(version_id=first.pk, first_chosen=True)
    services.outcome_record(version_id=first.pk, first_chosen=False)
    services.outcome_record(version_id=first.pk, first_chosen=False)
    services.outcome_record(version_id=first.pk, first_chosen=False, undo=True)
    services.outcome_record(version_id=None, first_chosen=True)  # no playbook: nothing
    entry = first.entries.get()
    entry.refresh_from_db()
    assert (entry.first_chosen, entry.first_not_chosen) == (1, 1)


def test_a_queues_playbook_goes_with_the_queue() -> None:
    queue = QueueFactory()
    playbook_write(queue, [("Tone", "Be brief.")])
    queue.delete()
    assert not Entry.objects.exists() and not Version.objects.exists()
