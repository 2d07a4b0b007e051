from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from icrlhf.ingest.models import DEFAULT_SCOPES, IntegrationToken, Scope
from icrlhf.ingest.services import token_create
from icrlhf.queues.admin_scope import QueueScopedAdmin


class IntegrationTokenForm(forms.ModelForm[IntegrationToken]):
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices,
        initial=DEFAULT_SCOPES,
        widget=forms.CheckboxSelectMultiple,
        help_text="What the token may call. Give the export only to a trusted system: it "
        "hands out every decision of the queue.",
    )

    class Meta:
        model = IntegrationToken
        fields = ["queue", "name", "scopes"]


@admin.register(IntegrationToken)
class IntegrationTokenAdmin(QueueScopedAdmin[IntegrationToken]):
    form = IntegrationTokenForm
    list_display = [
        "name",
        "queue",
        "prefix",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["queue"]
    fields = ["queue", "name", "scopes", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def save_model(
        self, request: HttpRequest, obj: IntegrationToken, form: Any, change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        record, token = token_create(queue=obj.queue, name=obj.name, scopes=list(obj.scopes))
        obj.pk, obj.token_hash, obj.prefix = record.pk, record.token_hash, record.prefix
        # Messages live in the session (settings.MESSAGE_STORAGE), never in a cookie.
        messages.warning(request, f"The token, shown this once — copy it now: {token}")

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[IntegrationToken]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        messages.success(request, f"Revoked {count} token(s).")
