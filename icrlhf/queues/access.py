"""Who may do what. A role belongs to one queue membership, never to the user:

- viewer: sees the queue's items and decisions, decides nothing;
- reviewer: also creates items, decides, and reads the gateway's call log;
- curator: also curates memory, routing, import and export — of that queue only;
- admin (superusers, and the install-wide `admin` group): every queue, every action.

Every check takes the queue it is about; the only queue-free questions are `is_admin` and
`queues_with_role` (the queues in which someone holds at least a role).
"""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from icrlhf.queues.models import Membership, Queue

ADMIN = "admin"
Role = Membership.Role
# Each role and the roles it includes.
_AT_LEAST: dict[str, set[str]] = {
    Role.VIEWER: {Role.VIEWER, Role.REVIEWER, Role.CURATOR},
    Role.REVIEWER: {Role.REVIEWER, Role.CURATOR},
    Role.CURATOR: {Role.CURATOR},
}

type AnyUser = AbstractBaseUser | AnonymousUser


def is_admin(user: AnyUser) -> bool:
    if not user.is_authenticated:
        return False
    if getattr(user, "is_superuser", False):
        return True
    cached: bool | None = getattr(user, "_icrlhf_admin", None)
    if cached is None:  # read once per request (the user object lives that long)
        cached = Group.objects.filter(user=user.pk, name=ADMIN).exists()
        setattr(user, "_icrlhf_admin", cached)  # noqa: B010 (a cache on a non-model attribute)
    return cached


def _roles(user: AnyUser) -> dict[int, str]:
    """The user's role in each of their queues, read once per request."""
    if not user.is_authenticated:
        return {}
    cached: dict[int, str] | None = getattr(user, "_icrlhf_roles", None)
    if cached is None:
        cached = dict(Membership.objects.filter(user=user.pk).values_list("queue_id", "role"))
        setattr(user, "_icrlhf_roles", cached)  # noqa: B010
    return cached


def role_in(user: AnyUser, queue: Queue) -> str | None:
    """The user's role in the queue (admins: curator), or None for a non-member."""
    if is_admin(user):
        return Role.CURATOR
    return _roles(user).get(queue.pk)


def has_role(user: AnyUser, queue: Queue, role: str) -> bool:
    """Whether the user holds `role`, or one that includes it, in this queue."""
    return role_in(user, queue) in _AT_LEAST[role]


def can_review(user: AnyUser, queue: Queue) -> bool:
    return has_role(user, queue, Role.REVIEWER)


def can_curate(user: AnyUser, queue: Queue) -> bool:
    return has_role(user, queue, Role.CURATOR)


def queues_with_role(user: AnyUser, role: str = Role.VIEWER) -> QuerySet[Queue]:
    """The queues in which the user holds `role` or more (every queue for an admin)."""
    if is_admin(user):
        return Queue.objects.all()
    if not user.is_authenticated:
        return Queue.objects.none()
    return Queue.objects.filter(
        membership__user=user.pk, membership__role__in=_AT_LEAST[role]
    ).distinct()


def queues_visible(user: AnyUser) -> QuerySet[Queue]:
    return queues_with_role(user, Role.VIEWER)


def curates_any(user: AnyUser) -> bool:
    """Whether to offer the curator's pages at all (each still asks about its queue)."""
    return is_admin(user) or Role.CURATOR in _roles(user).values()


def queue_for_member(user: AnyUser, **lookup: object) -> Queue:
    """The queue, if the user may see it: 404 otherwise, so queue names do not leak."""
    queue = queues_visible(user).filter(**lookup).first()
    if queue is None:
        raise Http404("No such queue.")
    return queue


def queue_for_curator(user: AnyUser, *, refusal: str, **lookup: object) -> Queue:
    """The queue, if the user curates it: 404 for a non-member (`queue_for_member`), 403
    with `refusal` for a member who does not curate it."""
    queue = queue_for_member(user, **lookup)
    if not can_curate(user, queue):
        raise PermissionDenied(refusal)
    return queue


def review_check(user: AnyUser, queue: Queue) -> None:
    if not can_review(user, queue):
        raise PermissionDenied("You are not a reviewer of this queue.")
