import copy
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from icrlhf.integrations import llm
from icrlhf.queues.access import can_curate, is_admin, queues_visible, role_in
from icrlhf.queues.admin_scope import QueueScopedAdmin
from icrlhf.queues.models import Item, Membership, Queue
from icrlhf.queues.services import queue_save


class QueueAdminForm(forms.ModelForm[Queue]):
    # Write-only: a secret once saved is never sent to a browser again; empty keeps it.
    webhook_secret = forms.CharField(
        required=False,
        max_length=200,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Signs each webhook (HMAC-SHA256 of the timestamp and the body). Never shown "
        "again once saved; leave empty to keep the current one.",
    )

    # Where the prompts (and a key) go: one of the install's named endpoints (LLM_ENDPOINTS).
    endpoint = forms.ChoiceField(
        required=False,
        help_text="The install's endpoints (LLM_ENDPOINTS); only superusers choose.",
    )

    class Meta:
        model = Queue
        fields = "__all__"  # noqa: DJ007 (the admin's form: the admin chooses the fields)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = llm.endpoint_named(self.instance.api_base, self.instance.model)
        choices = [
            (name, f"{name}: {endpoint['model']} at {endpoint['api_base']}")
            for name, endpoint in llm.endpoints().items()
        ]
        if not current and self.instance.pk:  # set outside the list (a shell): kept as it is
            choices.insert(0, ("", f"as set: {self.instance.model} at {self.instance.api_base}"))
        field = self.fields["endpoint"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = choices
        field.initial = current or ("" if self.instance.pk else "default")

    def clean_webhook_secret(self) -> str:
        return str(self.cleaned_data.get("webhook_secret") or self.instance.webhook_secret)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        name = str(cleaned.get("endpoint") or "")
        chosen = llm.endpoints().get(name)
        if chosen is not None and "endpoint" in self.changed_data:
            # The install's own is stored empty, so that it follows LLM_MODEL and LLM_API_BASE.
            own = name == "default"
            self.instance.model = "" if own else chosen["model"]
            self.instance.api_base = "" if own else chosen["api_base"]
        return cleaned


class MembershipInline(admin.TabularInline[Membership, Queue]):
    model = Membership
    extra = 1
    verbose_name = "member"
    verbose_name_plural = "members and their roles in this queue"

    # Membership is managed with its queue: curating the queue is the permission.
    def _curates(self, request: HttpRequest, queue: Queue | None) -> bool:
        return is_admin(request.user) or (queue is not None and can_curate(request.user, queue))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None or is_admin(request.user) or role_in(request.user, obj) is not None

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._curates(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._curates(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._curates(request, obj)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # The picker lists only people the editor already shares a queue with: a curator can
        # bring a colleague in, never browse the install's user list.
        if db_field.name == "user" and not is_admin(request.user):
            kwargs["queryset"] = (
                get_user_model()
                .objects.filter(queues__in=queues_visible(request.user))
                .distinct()
                .order_by("username")
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Queue)
class QueueAdmin(QueueScopedAdmin[Queue]):
    form = QueueAdminForm
    queue_lookup = "pk"
    list_display = ["name", "slug", "kind", "n_candidates", "k_examples", "model"]
    prepopulated_fields = {"slug": ["name"]}
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]
    readonly_fields = ["playbook"]

    @admin.display(description="playbook")
    def playbook(self, queue: Queue) -> str:
        if queue.pk is None:
            return "Written on the queue's playbook page once the queue is saved."
        return format_html(
            '<a href="{}">The rules its answers follow: read and edit them on the playbook '
            "page</a>",
            reverse("playbook:page", args=[queue.slug]),
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # Where the prompts (and a key) go is the install's choice, made by name (the form's
        # endpoint), by superusers only.
        return [*super().get_readonly_fields(request, obj), "model", "api_base"]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        if not getattr(request.user, "is_superuser", False):
            # A copy: the declared field is shared by every form class built from this one.
            field = copy.deepcopy(form.base_fields["endpoint"])
            field.disabled = True  # shown, never taken from a post
            form.base_fields["endpoint"] = field
        return form

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        queue_save(queue=obj, actor=request.user)  # type: ignore[arg-type]


@admin.register(Item)
class ItemAdmin(QueueScopedAdmin[Item]):
    list_display = ["pk", "queue", "status", "source", "created_at"]
    list_filter = ["queue", "status", "source"]
    search_fields = ["input_text", "external_id"]
    readonly_fields = ["created_by", "created_at", "updated_at"]
