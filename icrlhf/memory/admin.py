"""Curation in the admin. Every action goes through icrlhf.memory.curation, which logs it and
sends the change to the vector store through the worker."""

import json
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.options import ActionLocation
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from icrlhf.memory import curation
from icrlhf.memory.models import CurationEvent, Example
from icrlhf.queues.admin_scope import QueueScopedAdmin


def _actor(request: HttpRequest) -> User:
    return cast(User, request.user)  # the admin only lets logged-in staff in


class UtilityFilter(admin.SimpleListFilter):
    title = "utility"
    parameter_name = "utility"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("low", "below 0.3"), ("mid", "0.3 to 0.7"), ("high", "above 0.7")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Example]) -> QuerySet[Example]:
        ranges = {"low": (0, 0.3), "mid": (0.3, 0.7), "high": (0.7, 1.01)}
        if self.value() not in ranges:
            return queryset
        low, high = ranges[self.value()]  # type: ignore[index]
        return queryset.filter(utility__gte=low, utility__lt=high)


class RewardFilter(admin.SimpleListFilter):
    title = "reward"
    parameter_name = "reward"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("1", "1.0 (preferred)"), ("0", "0.0 (rejected)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Example]) -> QuerySet[Example]:
        if self.value() in {"0", "1"}:
            return queryset.filter(reward=float(self.value()))  # type: ignore[arg-type]
        return queryset


class WeightActionForm(ActionForm):
    # Shown only while "Reweight" is the action chosen (admin.css).
    weight = forms.FloatField(
        required=False,
        min_value=0,
        max_value=curation.MAX_WEIGHT,
        widget=forms.NumberInput(attrs={"step": "0.1", "min": "0", "class": "weight"}),
    )


@admin.register(Example)
class ExampleAdmin(QueueScopedAdmin[Example]):
    curators_manage = True

    class Media:
        css = {"all": ["css/admin.css"]}

    # Fits 1,366 px (without the admin's side navigation, which this list needs the room
    # of): the texts get the room, the rest is short (role and status in one column, the
    # index state and near-duplicate flag in another).
    list_display = [
        "short_input",
        "short_output",
        "queue",
        "status_shown",
        "weight_shown",
        "utility_shown",
        "retrieved_shown",
        "index_shown",
    ]
    list_filter = [
        "queue",
        "role",
        "status",
        RewardFilter,
        UtilityFilter,
        "index_state",
        "created_at",
    ]
    search_fields = ["input_text", "output_text"]
    action_form = WeightActionForm
    actions = [
        "pin",
        "retire",
        "restore",
        "approve",
        "withdraw_approval",
        "reweight",
        "merge",
        "delete_selected_examples",
    ]
    fields = [
        "queue",
        "role",
        "status",
        "input_text",
        "output_text",
        "step_shown",
        "weight_shown",
        "provenance",
        "usage",
        "similar_examples",
        "retired_reason",
    ]
    readonly_fields = [
        "queue",
        "role",
        "status",
        "input_text",
        "step_shown",
        "weight_shown",
        "provenance",
        "usage",
        "similar_examples",
        "retired_reason",
    ]

    def get_actions(
        self, request: HttpRequest, action_location: ActionLocation = ActionLocation.CHANGE_LIST
    ) -> dict[str, Any]:
        actions = super().get_actions(request, action_location)
        actions.pop("delete_selected", None)  # ours logs and cleans the store
        return actions

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # examples come from decisions

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> Any:
        return super().changelist_view(
            request, {**(extra_context or {}), "is_nav_sidebar_enabled": False}
        )

    @admin.display(description="input")
    def short_input(self, example: Example) -> str:
        return Truncator(example.input_text).chars(90)

    @admin.display(description="output")
    def short_output(self, example: Example) -> str:
        return Truncator(example.output_text).chars(90)

    @admin.display(description="role · status", ordering="status")
    def status_shown(self, example: Example) -> str:
        status = example.get_status_display()
        if example.status == Example.Status.RETIRED and example.retired_reason:
            status = f"Retired: {example.retired_reason}"
        if example.role == Example.Role.REJECTED and example.status == Example.Status.ACTIVE:
            return example.get_role_display()  # kept as it came: nothing more to say
        return f"{example.get_role_display()} · {status}"

    @admin.display(description="weight", ordering="weight")
    def weight_shown(self, example: Example) -> str:
        # Only preferred examples are retrieved, ranked by similarity × weight: a rejected
        # one has no weight to show or change.
        if example.role != Example.Role.PREFERRED:
            return "–"
        return f"{example.weight:g}"

    @admin.display(description="retrieved", ordering="times_retrieved")
    def retrieved_shown(self, example: Example) -> int:
        return example.times_retrieved

    @admin.display(description="utility", ordering="utility")
    def utility_shown(self, example: Example) -> str:
        return f"{example.utility:.2f}"

    @admin.display(description="index", ordering="index_state")
    def index_shown(self, example: Example) -> str:
        shown = example.get_index_state_display()
        return f"{shown} · near-duplicate" if example.duplicate_of_id is not None else shown

    @admin.display(description="provenance")
    def provenance(self, example: Example) -> str:
        decision = example.decision
        if decision is None:  # learnt from the application's reward on an agent's step
            step = example.step
            if step is None:
                return "–"
            url = reverse("trajectories:detail", args=[example.queue.slug, step.trajectory_id])
            return format_html(
                "Rewarded {} by the application: <a href='{}#step-{}'>step {} of its run</a>",
                example.reward,
                url,
                step.position,
                step.position + 1,
            )
        generation = decision.generation
        item_url = reverse("review:item", args=[decision.item_id])
        prompt = "\n\n".join(f"[{m['role']}] {m['content']}" for m in generation.messages)
        return format_html(
            "Decision: {} by {} on {} (<a href='{}'>item {}</a>)<br>Generation {}: model {}, "
            "params {}<br>Candidate: {}<details><summary>Prompt</summary><pre>{}</pre></details>",
            decision.get_verdict_display(),
            decision.reviewer,
            decision.created_at,
            item_url,
            decision.item_id,
            generation.pk,
            generation.model,
            generation.params,
            example.candidate_id or "–",
            prompt,
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Example | None = None) -> list[str]:
        # An agent's step is its turns: a new text would not change the tool call it shows.
        extra = ["output_text"] if obj is not None and obj.turns else []
        return [*self.readonly_fields, *extra]

    @admin.display(description="agent step")
    def step_shown(self, example: Example) -> str:
        if not example.tool_names and not example.output_format:
            return "A plain answer: offered to requests without tools or a required format."
        return format_html(
            "Made with the tools {}; output format {}. Offered only to requests that offer all "
            "of these tools and require the same format.<details><summary>Its turns, as "
            "prompts get them</summary><pre>{}</pre></details>",
            ", ".join(example.tool_names) or "none",
            example.output_format.get("type", "text"),
            json.dumps(example.turns, indent=2, ensure_ascii=False),
        )

    @admin.display(description="usage")
    def usage(self, example: Example) -> str:
        # format_html escapes its arguments into strings first: numbers are formatted here.
        return format_html(
            "Retrieved into {} generation(s); counted at decision: {} retrieval(s), {} "
            "accepted; utility {}; last retrieved {}",
            example.retrievals.count(),
            example.times_retrieved,
            example.times_accepted,
            f"{example.utility:.2f}",
            example.last_retrieved_at or "never",
        )

    @admin.display(description="similar examples")
    def similar_examples(self, example: Example) -> str:
        if example.role != Example.Role.PREFERRED:
            return "Only preferred examples are compared with each other."
        if example.index_state != Example.IndexState.INDEXED:
            return "Not computed yet (the worker does it after indexing)."
        if not example.similar:
            return "None: no other preferred example was close when it was indexed."
        return format_html_join(
            "",
            "<div><a href='{}'>{}</a> cosine {}</div>",
            (
                (reverse("admin:memory_example_change", args=[s["id"]]), s["id"][:8], s["score"])
                for s in example.similar
            ),
        )

    def save_model(self, request: HttpRequest, obj: Example, form: Any, change: bool) -> None:
        if "output_text" in form.changed_data:
            curation.example_output_edit(
                example_id=obj.pk,
                output_text=obj.output_text,
                actor=_actor(request),
            )

    def delete_model(self, request: HttpRequest, obj: Example) -> None:
        curation.examples_delete(ids=[obj.pk], actor=_actor(request))

    def _set(
        self, request: HttpRequest, queryset: QuerySet[Example], status: str, verb: str
    ) -> None:
        count = curation.examples_status_set(
            ids=list(queryset.values_list("pk", flat=True)),
            status=status,
            actor=_actor(request),
            reason=f"{verb} by {request.user}",
        )
        messages.success(request, f"{verb.capitalize()} {count} example(s).")

    @admin.action(description="Pin (always in the prompt)")
    def pin(self, request: HttpRequest, queryset: QuerySet[Example]) -> None:
        self._set(request, queryset, Example.Status.PINNED, "pinned")

    @admin.action(description="Retire (never retrieved)")
    def retire(self, request: HttpRequest, queryset: QuerySet[Example]) -> None:
        self._set(request, queryset, Example.Status.RETIRED, "retired")

    @admin.action(description="Restore (active again)")
    def restore(self, request: HttpRequest, queryset: QuerySet[Example]) -> None:
        self._set(request, queryset, Example.Status.ACTIVE, "restored")

    @admin.action(description="Approve as an answer from memory (served as is)")
    def approve(self, request: HttpRequest, queryset: QuerySet[Example]) -> None:
        count = curation.examples_approve(
            ids=list(queryset.values_list("pk", flat=True)), approved=True, actor=_actor(request)
        )
        messages.success(request, f"Approved {count} example(s) as answers from memory.")

    @admin.action(description="Withdraw the approval as an answer from memory")
    def withdraw_approval(self, request: HttpRequest, queryset: QuerySet[Example]) -> None:
        count = curation.examples_approve(
            ids=list(queryset.values_list("pk", flat=True)), approved=False, actor=_actor(request)
        )
        messages.success(request, f"Withdrew the approval of {count} example(s).")

    @admin.action(description="Reweight (to the weight given)")
    def reweight(self, request: HttpRequest, queryset: QuerySet[Example]) -> None:
        raw = request.POST.get("weight", "")
        preferred = queryset.filter(role=Example.Role.PREFERRED)
        rejected = queryset.count() - preferred.count()
        try:
            count = curation.examples_reweight(
                ids=list(preferred.values_list("pk", flat=True)),
                weight=float(raw),
                actor=_actor(request),
            )
        except (ValueError, ValidationError):
            messages.error(request, f"Give a weight between 0 and {curation.MAX_WEIGHT:g}.")
            return
        left = (
            f" {rejected} rejected example(s) have no weight: left as they were."
            if rejected
            else ""
        )
        messages.success(request, f"Reweighted {count} example(s) to {float(raw):g}.{left}")

    @admin.action(description="Merge near-duplicates into the oldest")
    def merge(self, request: HttpRequest, queryset: QuerySet[Example]) -> None:
        try:
            kept = curation.examples_merge(
                ids=list(queryset.values_list("pk", flat=True)),
                actor=_actor(request),
            )
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
            return
        messages.success(request, f"Merged into {kept.pk}.")

    @admin.action(description="Delete (from the database and the store)")
    def delete_selected_examples(self, request: HttpRequest, queryset: QuerySet[Example]) -> None:
        count = curation.examples_delete(
            ids=list(queryset.values_list("pk", flat=True)),
            actor=_actor(request),
        )
        messages.success(request, f"Deleted {count} example(s).")


@admin.register(CurationEvent)
class CurationEventAdmin(QueueScopedAdmin[CurationEvent]):
    """The audit log: read-only."""

    curators_manage = True

    list_display = ["created_at", "actor", "action", "example_id", "queue", "detail"]
    list_filter = ["action", "queue", "created_at"]
    search_fields = ["example_id"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
