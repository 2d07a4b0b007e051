"""Who may do what. Roles are groups: reviewer, curator, admin (superusers are admins).

- reviewer: sees the queues they are a member of, creates items, decides.
- curator: a reviewer who may also curate memory and export (never a plain reviewer).
- admin: every queue, every action.
"""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.db.models import QuerySet

from icrlhf.queues.models import Queue

REVIEWER, CURATOR, ADMIN = "reviewer", "curator", "admin"

type AnyUser = AbstractBaseUser | AnonymousUser


def _groups(user: AnyUser) -> set[str]:
    """The user's role names, read once per request (the user object lives that long)."""
    if not user.is_authenticated:
        return set()
    cached: set[str] | None = getattr(user, "_icrlhf_groups", None)
    if cached is None:
        cached = set(Group.objects.filter(user=user.pk).values_list("name", flat=True))
        setattr(user, "_icrlhf_groups", cached)  # noqa: B010 (a cache on a non-model attribute)
    return cached


def is_admin(user: AnyUser) -> bool:
    return bool(getattr(user, "is_superuser", False)) or ADMIN in _groups(user)


def can_curate(user: AnyUser) -> bool:
    return is_admin(user) or CURATOR in _groups(user)


def queues_visible(user: AnyUser) -> QuerySet[Queue]:
    if is_admin(user):
        return Queue.objects.all()
    if not user.is_authenticated:
        return Queue.objects.none()
    return Queue.objects.filter(members=user.pk)


def can_review(user: AnyUser, queue: Queue) -> bool:
    if is_admin(user):
        return True
    roles = _groups(user)
    return bool(roles & {REVIEWER, CURATOR}) and queue.members.filter(pk=user.pk or 0).exists()


def queue_for_member(user: AnyUser, **lookup: object) -> Queue:
    """The queue, if the user may see it: 404 otherwise, so queue names do not leak."""
    from django.http import Http404

    queue = queues_visible(user).filter(**lookup).first()
    if queue is None:
        raise Http404("No such queue.")
    return queue


def review_check(user: AnyUser, queue: Queue) -> None:
    from django.core.exceptions import PermissionDenied

    if not can_review(user, queue):
        raise PermissionDenied("You are not a reviewer of this queue.")
