"""Who counts as ops (staff), asked one way by every service that only ops may use."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User

from .errors import NotAllowed


def is_ops(user: User | AnonymousUser | None) -> bool:
    """A signed-in staff account: ops. Nobody else, an anonymous caller included."""
    return bool(user is not None and user.is_authenticated and user.is_staff)


def require_ops(actor: User | AnonymousUser | None, *, what: str) -> None:
    """Refuse with 403 `permission_denied` unless `actor` is ops; `what` finishes the
    sentence "Only ops ..." ("manage incidents", "grant credit")."""
    if not is_ops(actor):
        raise NotAllowed(f"Only ops {what}.")
