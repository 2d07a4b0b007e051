from django.db import migrations

from icrlhf.playbook.guidelines import guidelines_entries


def guidelines_to_playbooks(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Each queue's guidelines become its playbook's first version, numbered as the
    guidelines were (decisions name that number)."""
    Queue = apps.get_model("queues", "Queue")
    Entry = apps.get_model("playbook", "Entry")
    Version = apps.get_model("playbook", "Version")
    for queue in Queue.objects.exclude(guidelines=""):
        parts = guidelines_entries(queue.guidelines)
        if not parts:
            continue
        sections: dict[str, list[str]] = {}
        for section, text in parts:
            sections.setdefault(section, []).append(f"- {text}")
        version = Version.objects.create(
            queue=queue,
            number=queue.guidelines_version,
            origin="guidelines",
            prompt_text="\n".join(
                f"{section}:\n" + "\n".join(lines) for section, lines in sorted(sections.items())
            ),
        )
        version.entries.set(
            [
                Entry.objects.create(queue=queue, key=key, section=section, text=text)
                for key, (section, text) in enumerate(parts, start=1)
            ]
        )


def playbooks_to_guidelines(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Back: each queue's newest version as markdown guidelines, with its number (the
    versions go: the way forward makes them again from the guidelines)."""
    Version = apps.get_model("playbook", "Version")
    Entry = apps.get_model("playbook", "Entry")
    newest = {}
    for version in Version.objects.order_by("number"):
        newest[version.queue_id] = version
    for version in newest.values():
        sections: dict[str, list[str]] = {}
        for entry in version.entries.order_by("section", "key"):
            sections.setdefault(entry.section, []).append(f"- {entry.text}")
        version.queue.guidelines = "\n\n".join(
            f"## {section}\n" + "\n".join(lines) for section, lines in sorted(sections.items())
        )
        version.queue.guidelines_version = version.number
        version.queue.save(update_fields=["guidelines", "guidelines_version"])
    Version.objects.all().delete()
    Entry.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("playbook", "0001_initial"), ("queues", "0023_format_examples_off_by_default")]

    operations = [migrations.RunPython(guidelines_to_playbooks, playbooks_to_guidelines)]
