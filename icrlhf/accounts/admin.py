"""Users and groups are the install's, above every queue: only superusers manage them.

Django's own admins let any staff member with `auth.change_user` tick superuser on
themselves or join the `admin` group; queue roles live on memberships (the queue's page)."""

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.http import HttpRequest


class _SuperusersOnly:
    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(getattr(request.user, "is_superuser", False))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(getattr(request.user, "is_superuser", False))

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return bool(getattr(request.user, "is_superuser", False))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(getattr(request.user, "is_superuser", False))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(getattr(request.user, "is_superuser", False))


class InstallUserAdmin(_SuperusersOnly, UserAdmin):  # type: ignore[type-arg]
    pass


class InstallGroupAdmin(_SuperusersOnly, GroupAdmin):
    pass


User = get_user_model()
for model, model_admin in ((User, InstallUserAdmin), (Group, InstallGroupAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)
