"""Queues are tenants in the admin too: a staff member who is not an admin sees, changes and
acts on the rows of the queues they belong to, and nothing else (lists, per-object pages,
bulk actions, search, filters, foreign-key choices)."""

from typing import Any, TypeVar

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from icrlhf.queues.access import is_admin, queues_visible
from icrlhf.queues.models import Queue

_M = TypeVar("_M", bound=Model)


class QueueScopedAdmin(admin.ModelAdmin[_M]):
    # How a row reaches its queue ("queue", "item__queue"; "pk" for the queue itself).
    queue_lookup = "queue"

    def get_queryset(self, request: HttpRequest) -> QuerySet[_M]:
        # Every list, change page, action and search starts from this queryset.
        queryset = super().get_queryset(request)
        if is_admin(request.user):
            return queryset
        return queryset.filter(**{f"{self.queue_lookup}__in": queues_visible(request.user)})

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.related_model is Queue and not is_admin(request.user):
            kwargs["queryset"] = queues_visible(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_list_filter(self, request: HttpRequest) -> Any:
        # A plain queue filter lists every queue's name: offer only the queues in view.
        return [
            (name, admin.RelatedOnlyFieldListFilter) if name == self.queue_lookup else name
            for name in super().get_list_filter(request)
        ]
