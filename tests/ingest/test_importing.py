from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client

from icrlhf.ingest.importing import ImportFileError, tickets_import
from icrlhf.queues.models import Item
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

GOOD_CSV = (
    "subject,body,customer,priority,external_id,category\n"
    "Card late,My card has not arrived,ana@example.com,high,t-1,card_arrival\n"
    "Rate?,What rate do you use?,,,t-2,\n"
)


def test_a_csv_is_imported_and_importing_it_again_changes_nothing(triage_queue: Any) -> None:
    report = tickets_import(queue=triage_queue, data=GOOD_CSV.encode(), filename="t.csv")
    assert (report.created, report.existing, report.problems) == (2, 0, [])
    first = Item.objects.get(external_id="t-1")
    assert (first.priority, first.category, first.source) == ("high", "card_arrival", "import")
    assert Item.objects.get(external_id="t-2").priority == "normal"
    again = tickets_import(queue=triage_queue, data=GOOD_CSV.encode(), filename="t.csv")
    assert (again.created, again.existing) == (0, 2)
    assert Item.objects.count() == 2


def test_bad_rows_are_listed_and_good_rows_imported(triage_queue: Any) -> None:
    data = (
        b"subject,body,priority,sla_due_at,category\n"
        b"ok,fine ticket,low,,\n"
        b",no subject,,,\n"
        b"bad priority,text,asap,,\n"
        b"bad date,text,,tomorrow,\n"
        b"bad category,text,,,mortgages\n"
    )
    report = tickets_import(queue=triage_queue, data=data, filename="mixed.csv")
    assert report.created == 1
    assert [p.row for p in report.problems] == [3, 4, 5, 6]
    messages = " | ".join(p.message for p in report.problems)
    assert "subject" in messages and "priority" in messages and "sla_due_at" in messages
    assert "not one of the queue's categories" in messages
    assert Item.objects.count() == 1


def test_jsonl_with_broken_lines(triage_queue: Any) -> None:
    data = (
        b'{"subject": "one", "body": "first"}\n'
        b"{not json}\n"
        b"\n"
        b'["a", "list"]\n'
        b'{"subject": "two", "body": "second", "priority": "urgent"}\n'
        + b'{"subject": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}\n"
    )
    report = tickets_import(queue=triage_queue, data=data, filename="t.jsonl")
    assert report.created == 2
    assert [(p.row, p.message.split(" (")[0]) for p in report.problems] == [
        (2, "not valid JSON"),
        (4, "not a JSON object"),
        (6, "not valid JSON"),
    ]
    assert "nested too deeply" in report.problems[-1].message


@pytest.mark.parametrize(
    ("data", "filename", "message"),
    [
        (b"\xff\xfe\x00garbage", "t.csv", "not UTF-8"),
        (b"title,text\nx,y\n", "t.csv", "no subject or body column"),
        (b"subject,body\n", "t.csv", "no tickets in it"),
        (b"", "t.jsonl", "no tickets in it"),
        (b"subject,body\nx,y\n", "t.xlsx", "Upload a .csv or a .jsonl file"),
    ],
)
def test_an_unreadable_file_imports_nothing(
    triage_queue: Any, data: bytes, filename: str, message: str
) -> None:
    with pytest.raises(ImportFileError, match=message):
        tickets_import(queue=triage_queue, data=data, filename=filename)
    assert not Item.objects.exists()


def test_the_upload_page_is_for_curators(triage_queue: Any, logged_in: Client) -> None:
    upload = SimpleUploadedFile("t.csv", GOOD_CSV.encode(), content_type="text/csv")
    assert logged_in.post(f"/q/{triage_queue.slug}/import/", {"file": upload}).status_code == 403
    curator = UserFactory()
    triage_queue.members.add(curator, through_defaults={"role": "curator"})
    client = Client()
    client.force_login(curator)
    upload = SimpleUploadedFile("t.csv", GOOD_CSV.encode(), content_type="text/csv")
    page = client.post(f"/q/{triage_queue.slug}/import/", {"file": upload}).content.decode()
    assert "<strong>2</strong> imported" in page
    broken = SimpleUploadedFile("t.csv", b"title\nx\n", content_type="text/csv")
    response = client.post(f"/q/{triage_queue.slug}/import/", {"file": broken})
    assert response.status_code == 400
    assert "Nothing was imported." in response.content.decode()


def test_the_import_command_reports_and_fails_on_bad_rows(
    triage_queue: Any, tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "t.csv"
    path.write_text("subject,body\nok,fine\n,missing subject\n")
    with pytest.raises(SystemExit) as exit_info:
        call_command("import_tickets", str(path), queue=triage_queue.slug)
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert "2 rows: 1 imported, 0 already there, 1 refused" in out
    assert "row 3: subject" in out
