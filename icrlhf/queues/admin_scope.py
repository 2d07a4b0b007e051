"""Queues are tenants in the admin too. A staff member who is not an admin sees the rows of
the queues they belong to, and nothing else (lists, per-object pages, bulk actions, search,
filters, foreign-key choices); they change, add and delete only in the queues they curate.
Django's model permissions still decide which models a staff member may open at all."""

from typing import Any, TypeVar

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from icrlhf.queues.access import Role, is_admin, queues_visible, queues_with_role
from icrlhf.queues.models import Queue

_M = TypeVar("_M", bound=Model)


class QueueScopedAdmin(admin.ModelAdmin[_M]):
    # How a row reaches its queue ("queue", "item__queue"; "pk" for the queue itself).
    queue_lookup = "queue"
    # True for the curation models (stored examples, their history): a staff member who
    # curates a queue may view, change and delete its rows without any Django permission.
    curators_manage = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[_M]:
        # Every list, change page, action and search starts from this queryset.
        queryset = super().get_queryset(request)
        if is_admin(request.user):
            return queryset
        queues = (
            queues_with_role(request.user, Role.CURATOR)
            if self.curators_manage
            else queues_visible(request.user)
        )
        return queryset.filter(**{f"{self.queue_lookup}__in": queues})

    def _curates(self, request: HttpRequest, obj: Any) -> bool:
        """Whether the user curates the row's queue (with no row: any queue at all)."""
        if is_admin(request.user):
            return True
        curated = queues_with_role(request.user, Role.CURATOR)
        if obj is None:
            return curated.exists()
        model: type[Model] = type(obj)
        return model._default_manager.filter(
            pk=obj.pk, **{f"{self.queue_lookup}__in": curated}
        ).exists()

    def _model_permission(self, request: HttpRequest, granted: bool) -> bool:
        # Curation models: curating a queue is the permission (a staff member needs no group).
        return granted or (self.curators_manage and bool(getattr(request.user, "is_staff", False)))

    def has_module_permission(self, request: HttpRequest) -> bool:
        granted = super().has_module_permission(request)
        return granted or (self._model_permission(request, False) and self._curates(request, None))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        granted = super().has_view_permission(request, obj)
        if not self.curators_manage:
            return granted  # the queryset keeps it to the member's queues
        return self._model_permission(request, granted) and self._curates(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        granted = super().has_change_permission(request, obj)
        return self._model_permission(request, granted) and self._curates(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        granted = super().has_delete_permission(request, obj)
        return self._model_permission(request, granted) and self._curates(request, obj)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return bool(super().has_add_permission(request, *args)) and self._curates(request, None)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # A row can only be put into a queue its editor curates.
        if db_field.related_model is Queue and not is_admin(request.user):
            kwargs["queryset"] = queues_with_role(request.user, Role.CURATOR)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_list_filter(self, request: HttpRequest) -> Any:
        # A plain queue filter lists every queue's name: offer only the queues in view.
        return [
            (name, admin.RelatedOnlyFieldListFilter) if name == self.queue_lookup else name
            for name in super().get_list_filter(request)
        ]
