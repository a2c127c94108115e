"""SSH keys people sign in to the gateway with: add (the pasted key read by
`tenants.ssh_keys`), remove, and the gateway's note of each key's last use.

A key is the person's, not the tenant's: the gateway finds the person by the key's
fingerprint and decides from their membership what they may reach. So one key belongs
to one account (the fingerprint is unique across users), and removing it shuts that
person out at once (the gateway re-checks open streams against it).
"""

from __future__ import annotations

import ipaddress
import unicodedata

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from gpuplatform.ops import is_ops

from ..locks import ssh_key_lock, ssh_keys_owner_lock
from ..models import Membership, SshKey
from ..ssh_keys import ssh_public_key_parse
from .audit import audit_event_record

MAX_SSH_KEYS_PER_USER = 50
SSH_KEY_NAME_MAX = 64


def _clean_name(name: str) -> str:
    name = (name if isinstance(name, str) else "").strip()
    if not name:
        raise ServiceError("Give the key a name, e.g. laptop.", code="required", field="name")
    if len(name) > SSH_KEY_NAME_MAX:
        raise ServiceError(
            f"Ensure this field has no more than {SSH_KEY_NAME_MAX} characters.",
            code="max_length",
            field="name",
        )
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        raise ServiceError("A name is one line of plain text.", code="invalid", field="name")
    return name


def _duplicate(existing: SshKey, user: User) -> Conflict:
    if existing.user_id == user.pk:
        message = f"You already added this key, as {existing.name!r}."
    else:
        # Never who: only that the key is taken, so a key signs in one person.
        message = (
            "This key is registered to another account. A key identifies one person at "
            "the gateway: make a new key pair for this account (ssh-keygen -t ed25519)."
        )
    return Conflict(message, code="duplicate_key", field="public_key")


def _key_summary(key: SshKey) -> dict[str, object]:
    return {
        "ssh_key_id": key.pk,
        "name": key.name,
        "type": key.key_type,
        "fingerprint": key.fingerprint,
    }


@transaction.atomic
def ssh_key_add(*, user: User, name: str, public_key: str) -> SshKey:
    """Register a public key on `user`'s account; nothing is stored unless all is well."""
    name = _clean_name(name)
    parsed = ssh_public_key_parse(public_key)
    membership = Membership.objects.select_related("tenant").filter(user=user).first()
    if membership is None and not is_ops(user):
        raise NotAllowed("Join or create a tenant before adding SSH keys.", code="no_tenant")
    if membership is not None and not membership.tenant.is_active:
        raise NotAllowed("This tenant is suspended: no new SSH keys.", code="tenant_suspended")
    ssh_keys_owner_lock(user.pk)
    existing = SshKey.objects.filter(fingerprint=parsed.fingerprint).first()
    if existing is not None:
        raise _duplicate(existing, user)
    if SshKey.objects.filter(user=user).count() >= MAX_SSH_KEYS_PER_USER:
        raise Conflict(
            f"An account holds at most {MAX_SSH_KEYS_PER_USER} SSH keys: remove one first.",
            code="too_many_keys",
        )
    try:
        with transaction.atomic():
            key = SshKey.objects.create(
                user=user,
                name=name,
                key_type=parsed.key_type,
                public_key=parsed.public_key,
                comment=parsed.comment,
                fingerprint=parsed.fingerprint,
            )
    except IntegrityError:  # another account registered it between the check and here
        existing = SshKey.objects.filter(fingerprint=parsed.fingerprint).first()
        raise (
            _duplicate(existing, user)
            if existing
            else Conflict("This key is already registered.", code="duplicate_key")
        ) from None
    if membership is not None:
        audit_event_record(
            tenant=membership.tenant,
            actor=user,
            action="ssh_key.added",
            summary=f"{user.email} added SSH key {name!r} ({key.fingerprint})",
            data=_key_summary(key),
        )
    return key


@transaction.atomic
def ssh_key_remove(*, user: User, key_id: int) -> bool:
    """Remove one of `user`'s keys; False when there is none by that id (another user's,
    or already removed: removing twice is harmless)."""
    key = ssh_key_lock(key_id, user_id=user.pk)
    if key is None:
        return False
    summary = _key_summary(key)
    key_name = key.name
    key.delete()
    membership = Membership.objects.select_related("tenant").filter(user=user).first()
    if membership is not None:
        audit_event_record(
            tenant=membership.tenant,
            actor=user,
            action="ssh_key.removed",
            summary=f"{user.email} removed SSH key {key_name!r} ({summary['fingerprint']})",
            data=summary,
        )
    return True


def _address(address: str | None) -> str | None:
    """The IP address alone (an IPv6 zone dropped), or None when it is not one."""
    if not address:
        return None
    try:
        return str(ipaddress.ip_address(str(address).split("%", 1)[0]))
    except ValueError:
        return None


@transaction.atomic
def ssh_key_touch(*, key_id: int, address: str | None) -> bool:
    """The gateway's note that the key just signed someone in from `address` (an IP
    address; anything else is recorded as unknown). False when the key is gone."""
    updated = SshKey.objects.filter(pk=key_id).update(
        last_used_at=timezone.now(), last_used_address=_address(address)
    )
    return updated == 1
