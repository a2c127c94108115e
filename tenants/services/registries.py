"""Images renters bring (docs/images.md): ops' registry policy, each change kept with who,
when and why (RegistryRuleChange); and each tenant's registry logins, sealed
(tenants.sealing), written only, audited in the tenant's trail, never shown again."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from gpuplatform.errors import NotAllowed, ServiceError
from gpuplatform.ops import require_ops

from .. import sealing
from ..image_policy import MODES, clean_pattern, clean_registry
from ..locks import registry_credential_lock, registry_credential_lock_by_pk, registry_rule_lock
from ..models import Membership, RegistryCredential, RegistryRule, RegistryRuleChange
from .audit import audit_event_record

MAX_USERNAME = 255
MAX_PASSWORD = 4096
MAX_REASON = 500


def _reason(reason: object) -> str:
    text = str(reason or "").strip()
    if not text:
        raise ServiceError("Say why (it is kept in the registry policy's history).", field="reason")
    return text[:MAX_REASON]


def _pattern(pattern: object) -> str:
    try:
        return clean_pattern(pattern)
    except ValueError as exc:
        raise ServiceError(str(exc), field="pattern") from None


@transaction.atomic
def registry_rule_set(*, actor: User, pattern: str, mode: str, reason: str) -> RegistryRule:
    """Add the rule for `pattern`, or change its mode; kept in the history with `reason`.
    A launch, a resume and the queue read the policy as it is then; running slices go on."""
    require_ops(actor, what="set the registry policy")
    pattern, why = _pattern(pattern), _reason(reason)
    if mode not in MODES:
        raise ServiceError(
            "Mode: allowlist (only allowlisted images), registry (any image from here) or "
            "any (any image, on nodes whose agent runs).",
            code="invalid_choice",
            field="mode",
        )
    rule = registry_rule_lock(pattern)
    before = rule.mode if rule is not None else ""
    if rule is None:
        rule = RegistryRule(pattern=pattern)
    rule.mode, rule.note, rule.updated_by = mode, why, actor
    rule.save()
    if before != mode:
        RegistryRuleChange.objects.create(
            changed_by=actor, pattern=pattern, old_mode=before, new_mode=mode, reason=why
        )
    return rule


@transaction.atomic
def registry_rule_remove(*, actor: User, rule: RegistryRule, reason: str) -> None:
    """Remove a rule: what it matched falls to a wider rule, or to the allowlist only."""
    require_ops(actor, what="set the registry policy")
    why = _reason(reason)
    locked = registry_rule_lock(rule.pattern)
    if locked is None:
        return
    RegistryRuleChange.objects.create(
        changed_by=actor, pattern=locked.pattern, old_mode=locked.mode, new_mode="", reason=why
    )
    locked.delete()


def _may_manage(membership: Membership) -> None:
    if not membership.can_manage:
        raise NotAllowed("Only the tenant's owners set its registry logins.")
    if not membership.tenant.is_active:
        raise NotAllowed("This tenant is suspended.", code="tenant_suspended")


def _login(username: object, password: object) -> dict[str, str]:
    user, secret = str(username or "").strip(), str(password or "")
    if not user or len(user) > MAX_USERNAME or any(c in user for c in ":\n\r\0"):
        raise ServiceError(
            f"User name: up to {MAX_USERNAME} characters, no colon or line break.",
            field="username",
        )
    if not secret.strip() or len(secret) > MAX_PASSWORD or any(c in secret for c in "\n\r\0"):
        raise ServiceError(
            f"Password or token: up to {MAX_PASSWORD} characters on one line.", field="password"
        )
    return {"username": user, "password": secret}


@transaction.atomic
def registry_credential_set(
    *, membership: Membership, registry: str, username: str, password: str
) -> RegistryCredential:
    """Save the tenant's login for `registry` (replacing one it had): sealed at once,
    never shown again; every image brought from there is pulled with it, at every start.
    The audit trail says who set it for which registry, never what it is."""
    _may_manage(membership)
    try:
        host = clean_registry(registry)
    except ValueError as exc:
        raise ServiceError(str(exc), field="registry") from None
    sealed = sealing.seal(_login(username, password))
    row = registry_credential_lock(tenant_id=membership.tenant_id, registry=host)
    replaced = row is not None
    if row is None:
        row = RegistryCredential(tenant=membership.tenant, registry=host)
    row.sealed, row.created_by = sealed, membership.user
    row.save()
    audit_event_record(
        tenant=membership.tenant,
        actor=membership.user,
        action="registry_login.replaced" if replaced else "registry_login.added",
        summary=f"{membership.user.email} {'replaced' if replaced else 'saved'} the registry "
        f"login for {host}",
        data={"registry": host},
    )
    return row


@transaction.atomic
def registry_credential_remove(*, membership: Membership, credential_id: int) -> bool:
    """Forget the tenant's login (False: none by that id, or another tenant's). Images
    brought from its registry are pulled without a login from the next start on."""
    _may_manage(membership)
    row = RegistryCredential.objects.for_tenant(membership.tenant).filter(pk=credential_id).first()
    if row is None:
        return False
    locked = registry_credential_lock(tenant_id=membership.tenant_id, registry=row.registry)
    if locked is None:
        return False
    host = locked.registry
    locked.delete()
    audit_event_record(
        tenant=membership.tenant,
        actor=membership.user,
        action="registry_login.removed",
        summary=f"{membership.user.email} removed the registry login for {host}",
        data={"registry": host},
    )
    return True


def registry_credential_touch(*, tenant_id: int, registry: str) -> None:
    """Note that a start pulled with the tenant's login for `registry`."""
    RegistryCredential.objects.filter(tenant_id=tenant_id, registry=registry).update(
        last_used_at=timezone.now()
    )


def registry_credentials_reseal() -> tuple[int, int]:
    """Seal every tenant's registry login again under the first of CREDENTIALS_KEYS (after
    a new key was put first): (sealed again, unreadable). An unreadable one, sealed under
    no key the platform still has, is left as it is: its start asks its tenant to save it
    again."""
    done = unreadable = 0
    for pk in RegistryCredential.objects.order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            row = registry_credential_lock_by_pk(pk)
            if row is None:
                continue
            try:
                row.sealed = sealing.reseal(row.sealed)
            except sealing.Unreadable:
                unreadable += 1
                continue
            row.save(update_fields=["sealed", "updated_at"])
            done += 1
    return done, unreadable
