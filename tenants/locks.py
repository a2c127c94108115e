"""Row locks of the tenants app: every `SELECT ... FOR UPDATE` on its rows is taken here,
so the order they are taken in is written once.

A transaction that needs several takes them in this order (the order of this module):

    credit request -> tenant -> its owners' memberships (by pk) -> a membership
        -> an invitation -> an API token
    tenant -> slice -> purchase -> volume (by pk)
    tenant -> volume (by pk)
    image (alone)
    a registry rule (alone, by pattern)
    a registry login (alone, by tenant and registry)
    a user (their SSH keys: the cap on how many) -> one of their SSH keys

and only then rows of `nodes` (`nodes.locks`: a slice's allocation and GPU come after the
slice and its purchase). `incidents` takes its own rows before any of these. One known
exception, harmless: a launch locks its purchase and then inserts its slice; that row is
new, so nobody else can hold it (a second live slice on the purchase is refused by the
database's unique constraint, not by a lock).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User

from .models import (
    ApiToken,
    CreditRequest,
    Image,
    Invitation,
    LaunchTemplate,
    Membership,
    Purchase,
    RegistryCredential,
    RegistryRule,
    Role,
    Slice,
    SshKey,
    Tenant,
    Volume,
)


def credit_request_lock(pk: int) -> CreditRequest:
    return CreditRequest.objects.select_for_update().get(pk=pk)


def tenant_lock(pk: int) -> Tenant:
    return Tenant.objects.select_for_update().get(pk=pk)


def owners_lock(tenant: Tenant) -> list[Membership]:
    """The tenant's owners, by pk: two owners demoting each other serialise."""
    return list(
        Membership.objects.select_for_update().filter(tenant=tenant, role=Role.OWNER).order_by("pk")
    )


def membership_lock(pk: int) -> Membership:
    return Membership.objects.select_for_update().get(pk=pk)


def invitation_lock(pk: int, *, tenant: Tenant | None = None) -> Invitation:
    """The invitation; with `tenant`, only one of that tenant's (else DoesNotExist)."""
    invitations = (
        Invitation.objects.for_tenant(tenant) if tenant is not None else Invitation.objects
    )
    return (
        invitations.select_for_update(of=("self",))
        .select_related("tenant", "invited_by")
        .get(pk=pk)
    )


def api_token_lock(pk: int, *, user: User) -> ApiToken:
    """One of `user`'s tokens (another user's: DoesNotExist)."""
    return ApiToken.objects.select_for_update().get(pk=pk, user=user)


def slice_lock(pk: int) -> Slice:
    """The slice, with what its lifecycle reads (tier, image, allocation, GPU, node)."""
    return (
        Slice.objects.select_for_update(of=("self",))
        .select_related("purchase__tier", "image_entry", "allocation__gpu__node", "tenant")
        .get(pk=pk)
    )


def slice_queue_head_lock(vram_mb: int, *, interruptible: bool = False) -> Slice | None:
    """The queued slice of this tier that is next in line (first in, first out): of the
    full-price line, or with `interruptible`, of the interruptible one."""
    return (
        Slice.objects.select_for_update(of=("self",))
        .filter(
            state=Slice.State.QUEUED,
            vram_mb=vram_mb,
            purchase__interruptible=interruptible,
        )
        .select_related("tenant", "image_entry", "purchase")
        .order_by("queued_at", "pk")
        .first()
    )


def purchase_lock(pk: int, *, tenant: Tenant | None = None) -> Purchase:
    """The purchase, with its tier; with `tenant`, only one of that tenant's."""
    purchases = Purchase.objects.for_tenant(tenant) if tenant is not None else Purchase.objects
    return purchases.select_for_update(of=("self",)).select_related("tier").get(pk=pk)


def image_lock(pk: int) -> Image:
    return Image.objects.select_for_update().get(pk=pk)


def template_lock(pk: int) -> LaunchTemplate:
    return LaunchTemplate.objects.select_for_update().get(pk=pk)


def registry_rule_lock(pattern: str) -> RegistryRule | None:
    """The registry policy's rule for `pattern`, or None (there is none yet)."""
    return RegistryRule.objects.select_for_update().filter(pattern=pattern).first()


def registry_credential_lock(*, tenant_id: int, registry: str) -> RegistryCredential | None:
    """The tenant's login for `registry`, or None (it has none)."""
    return (
        RegistryCredential.objects.select_for_update()
        .filter(tenant_id=tenant_id, registry=registry)
        .first()
    )


def registry_credential_lock_by_pk(pk: int) -> RegistryCredential | None:
    return RegistryCredential.objects.select_for_update().filter(pk=pk).first()


def ssh_keys_owner_lock(user_id: int) -> User:
    """The user's row: adds of their SSH keys serialise, so the cap on how many holds."""
    return get_user_model().objects.select_for_update().get(pk=user_id)


def ssh_key_lock(pk: int, *, user_id: int) -> SshKey | None:
    """One of the user's SSH keys, or None (another user's, or already removed)."""
    return SshKey.objects.select_for_update().filter(pk=pk, user_id=user_id).first()


def volumes_lock(pks: list[int]) -> dict[int, Volume]:
    """Volumes a launch or resume mounts, by pk (after its slice and purchase): a delete,
    which locks the volume, waits for the slice to commit and then sees it mount it."""
    locked = Volume.objects.select_for_update(of=("self",)).filter(pk__in=pks).order_by("pk")
    return {v.pk: v for v in locked}


def volume_lock(pk: int, *, tenant: Tenant | None = None) -> Volume:
    """A volume's row; with `tenant`, only that tenant's (another's is DoesNotExist)."""
    volumes = Volume.objects.select_for_update(of=("self",)).select_related("node", "tenant")
    if tenant is not None:
        volumes = volumes.for_tenant(tenant)
    return volumes.get(pk=pk)
