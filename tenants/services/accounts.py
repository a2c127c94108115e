"""Every write to tenants, members, invitations and API tokens goes through here."""

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django.utils.text import slugify

from gpuplatform.api.scopes import clean_networks, clean_scopes, role_scopes, within_networks
from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from gpuplatform.ops import is_ops, require_ops

from ..locks import (
    api_token_lock,
    invitation_lock,
    membership_lock,
    owners_lock,
    slice_lock,
    tenant_lock,
)
from ..models import ApiToken, Invitation, Membership, Role, Slice, Tenant
from ..selectors import api_token_descendant_ids, invitation_by_token
from ..sign_up_links import SignUpClaim, seal, unseal
from ..tokens import API_TOKEN_PREFIX, display_prefix, hash_secret, new_secret
from .audit import audit_event_record
from .slices.stop import slice_stop_locked

API_TOKEN_MAX_DAYS = 365
INVITATION_PURGE_AFTER = timedelta(days=30)


def _unique_slug(name: str) -> str:
    base = slugify(name)[:100] or "tenant"
    slug, n = base, 1
    while Tenant.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


def _check_password(password: str, user: User | None = None) -> None:
    try:
        validate_password(password, user)
    except DjangoValidationError as exc:
        raise ServiceError(" ".join(exc.messages), code="weak_password", field="password") from exc


def _normal_email(email: str) -> str:
    return User.objects.normalize_email(email).strip().lower()


def _new_user(*, email: str, password: str) -> User:
    email = _normal_email(email)
    if User.objects.filter(username__iexact=email).exists():
        raise Conflict(
            "An account with this email already exists.", code="email_taken", field="email"
        )
    user = User(username=email, email=email)
    _check_password(password, user)
    user.set_password(password)
    return _user_save(user)


def _user_save(user: User) -> User:
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError as exc:  # a double submit racing the check before
        raise Conflict(
            "An account with this email already exists.", code="email_taken", field="email"
        ) from exc
    return user


@transaction.atomic
def tenant_create(*, owner: User, name: str) -> Membership:
    """A new tenant with `owner` as its owner. The user must not belong to one already."""
    name = name.strip()
    if not name:
        raise ServiceError("Give your organisation a name.", code="required", field="tenant_name")
    if Membership.objects.filter(user=owner).exists():
        raise Conflict("You already belong to a tenant.", code="already_member")
    tenant = Tenant.objects.create(name=name, slug=_unique_slug(name))
    membership = Membership.objects.create(user=owner, tenant=tenant, role=Role.OWNER)
    audit_event_record(
        tenant=tenant, actor=owner, action="tenant.created", summary=f"Tenant {name} created"
    )
    return membership


@transaction.atomic
def tenant_sign_up(*, email: str, password: str, tenant_name: str) -> Membership:
    """A user, a tenant, and the user as its owner, or nothing, at once (the demo, the
    benchmarks, tests). People sign up in two steps: `tenant_sign_up_request`, then
    `tenant_sign_up_confirm` from the mailed link."""
    user = _new_user(email=email, password=password)
    return tenant_create(owner=user, name=tenant_name)


def tenant_sign_up_request(*, email: str, password: str, tenant_name: str) -> None:
    """The sign-up form's step: the same answer, the same work and one mail whether or
    not the address has an account, so the form tells nobody which addresses do. The
    password is checked and hashed either way; then a new address gets the link that
    finishes the sign-up (nothing is stored before it is opened), a taken one a note to
    its owner that someone tried, with a way to sign in or reset the password."""
    email = _normal_email(email)
    tenant_name = tenant_name.strip()
    if not tenant_name:
        raise ServiceError("Give your organisation a name.", code="required", field="tenant_name")
    _check_password(password, User(username=email, email=email))
    password_hash = make_password(password)  # on both paths: one costs what the other does
    owner = User.objects.filter(username__iexact=email).first()
    if owner is None:
        claim = SignUpClaim(email=email, tenant_name=tenant_name, password_hash=password_hash)
        link = settings.SITE_URL.rstrip("/") + reverse("signup_link", args=[seal(claim)])
        subject = "Finish creating your gpuplatform account"
        context = {"link": link, "claim": claim, "hours": settings.SIGN_UP_LINK_TTL_HOURS}
        template = "tenants/email/sign_up_link.txt"
    else:
        subject = "Someone tried to sign up with your address on gpuplatform"
        context = {"reset_link": _password_reset_link(owner), "login_link": _site_link("login")}
        template = "tenants/email/sign_up_taken.txt"
    send_mail(
        subject=subject,
        message=render_to_string(template, context),
        from_email=None,
        recipient_list=[email],
    )


def _site_link(name: str, **kwargs: str) -> str:
    return settings.SITE_URL.rstrip("/") + reverse(name, kwargs=kwargs or None)


def _password_reset_link(user: User) -> str:
    """The link Django's password reset would mail `user`; the form's page for an
    account that cannot take one (switched off, no usable password)."""
    if not (user.is_active and user.has_usable_password()):
        return _site_link("password_reset")
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    token = default_token_generator.make_token(user)
    return _site_link("password_reset_confirm", uidb64=uid, token=token)


@transaction.atomic
def tenant_sign_up_confirm(*, token: str) -> Membership:
    """The mailed link's step: the account the sign-up form described, owner of its new
    tenant. Once only: a link whose address has an account by now is refused."""
    claim = unseal(token)
    if claim is None:
        raise ServiceError(
            "This sign-up link is invalid or has expired: sign up again.", code="invalid"
        )
    if User.objects.filter(username__iexact=claim.email).exists():
        raise Conflict(
            "This link was already used: the account exists. Log in instead.",
            code="email_taken",
        )
    user = User(username=claim.email, email=claim.email, password=claim.password_hash)
    return tenant_create(owner=_user_save(user), name=claim.tenant_name)


@transaction.atomic
def tenant_set_status(*, tenant: Tenant, actor: User, status: str, reason: str = "") -> Tenant:
    require_ops(actor, what="can suspend or reactivate a tenant")
    if status not in Tenant.Status.values:
        raise ServiceError(f"Unknown status {status!r}.", field="status")
    tenant = tenant_lock(tenant.pk)
    if tenant.status == status:
        return tenant
    if status == Tenant.Status.SUSPENDED and not reason.strip():
        raise ServiceError("Say why the tenant is suspended.", code="required", field="reason")
    tenant.status = status
    tenant.status_reason = reason.strip()
    tenant.save(update_fields=["status", "status_reason"])
    audit_event_record(
        tenant=tenant,
        actor=actor,
        action=f"tenant.{status}",
        summary=f"Tenant {status} by ops" + (f": {reason.strip()}" if reason.strip() else ""),
    )
    if status == Tenant.Status.SUSPENDED:
        _stop_all_slices(tenant=tenant, actor=actor, reason=reason.strip())
    return tenant


def _stop_all_slices(*, tenant: Tenant, actor: User, reason: str) -> None:
    """A suspended tenant runs nothing: its slices are stopped (queued ones cancelled),
    their VRAM released and metering stopped; what is left of their purchases stays
    refundable by ops."""
    for pk in Slice.objects.filter(tenant=tenant, state__in=Slice.LIVE_STATES).values_list(
        "pk", flat=True
    ):
        slice_stop_locked(
            slice=slice_lock(pk),
            actor=actor,
            reason=f"The tenant was suspended: {reason}",
            force=True,
        )


# --- members ------------------------------------------------------------------------


def _require_owner(actor_membership: Membership) -> None:
    if not actor_membership.can_manage:
        raise NotAllowed("Only an owner of this tenant can manage its members.")
    if not actor_membership.tenant.is_active:
        raise NotAllowed(
            "This tenant is suspended: members cannot be changed.", code="tenant_suspended"
        )


@transaction.atomic
def membership_change_role(
    *, actor_membership: Membership, membership: Membership, role: str
) -> Membership:
    _require_owner(actor_membership)
    if membership.tenant_id != actor_membership.tenant_id:
        raise NotAllowed("That member is not in your tenant.")
    if role not in Role.values:
        raise ServiceError(f"Unknown role {role!r}.", code="invalid_choice", field="role")
    owners = owners_lock(membership.tenant)
    membership = membership_lock(membership.pk)
    if membership.role == role:
        return membership
    if membership.role == Role.OWNER and len(owners) == 1:
        raise Conflict(
            "A tenant needs at least one owner: promote someone else first.",
            code="last_owner",
            field="role",
        )
    old = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    audit_event_record(
        tenant=membership.tenant,
        actor=actor_membership.user,
        action="member.role_changed",
        summary=f"{membership.user.email}: {old} -> {role}",
    )
    return membership


@transaction.atomic
def membership_remove(*, actor_membership: Membership, membership: Membership) -> None:
    """Remove a member; their API tokens stop working at once."""
    _require_owner(actor_membership)
    if membership.tenant_id != actor_membership.tenant_id:
        raise NotAllowed("That member is not in your tenant.")
    owners = owners_lock(membership.tenant)
    membership = membership_lock(membership.pk)
    if membership.role == Role.OWNER and len(owners) == 1:
        raise Conflict(
            "A tenant needs at least one owner: promote someone else first.", code="last_owner"
        )
    now = timezone.now()
    revoked = ApiToken.objects.filter(user=membership.user, revoked_at__isnull=True).update(
        revoked_at=now
    )
    email = membership.user.email
    membership.delete()
    audit_event_record(
        tenant=actor_membership.tenant,
        actor=actor_membership.user,
        action="member.removed",
        summary=f"{email} removed ({revoked} API token(s) revoked)",
    )


# --- invitations ----------------------------------------------------------------------


@transaction.atomic
def invitation_create(*, actor_membership: Membership, email: str, role: str) -> Invitation:
    _require_owner(actor_membership)
    tenant = actor_membership.tenant
    email = _normal_email(email)
    if role not in Role.values:
        raise ServiceError(f"Unknown role {role!r}.", code="invalid_choice", field="role")
    if Membership.objects.filter(tenant=tenant, user__username__iexact=email).exists():
        raise Conflict(f"{email} is already a member.", code="already_member", field="email")
    invitation = Invitation(
        tenant=tenant,
        email=email,
        role=role,
        invited_by=actor_membership.user,
        expires_at=timezone.now() + timedelta(days=settings.INVITATION_TTL_DAYS),
    )
    try:
        with transaction.atomic():
            invitation.save()
    except IntegrityError as exc:
        raise Conflict(
            f"{email} already has a pending invitation.", code="already_invited", field="email"
        ) from exc
    audit_event_record(
        tenant=tenant,
        actor=actor_membership.user,
        action="invitation.created",
        summary=f"Invited {email} as {role}",
    )
    enqueue("tenants.send_invitation", invitation.pk)
    return invitation


@transaction.atomic
def invitation_resend(*, actor_membership: Membership, invitation: Invitation) -> Invitation:
    _require_owner(actor_membership)
    invitation = invitation_lock(invitation.pk, tenant=actor_membership.tenant)
    if invitation.accepted_at or invitation.revoked_at:
        raise Conflict("This invitation is no longer pending.", code="not_pending")
    invitation.sent_at = None
    invitation.token_hash = None
    invitation.expires_at = timezone.now() + timedelta(days=settings.INVITATION_TTL_DAYS)
    invitation.save(update_fields=["sent_at", "token_hash", "expires_at"])
    enqueue("tenants.send_invitation", invitation.pk)
    return invitation


@transaction.atomic
def invitation_revoke(*, actor_membership: Membership, invitation: Invitation) -> Invitation:
    _require_owner(actor_membership)
    invitation = invitation_lock(invitation.pk, tenant=actor_membership.tenant)
    if invitation.accepted_at:
        raise Conflict("This invitation was already accepted.", code="not_pending")
    if invitation.revoked_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        audit_event_record(
            tenant=invitation.tenant,
            actor=actor_membership.user,
            action="invitation.revoked",
            summary=f"Invitation for {invitation.email} revoked",
        )
    return invitation


@transaction.atomic
def invitation_send(*, invitation_id: int) -> bool:
    """Email the invitation link. Safe to run twice: a sent invitation is not resent.

    The link's token is made here and only its hash kept, so the secret lives in the
    email alone (not in the broker, not in the database).
    """
    try:
        invitation = invitation_lock(invitation_id)
    except Invitation.DoesNotExist:
        return False
    if invitation.sent_at or invitation.accepted_at or invitation.revoked_at:
        return False
    if invitation.expires_at <= timezone.now():
        return False
    token = new_secret()
    link = settings.SITE_URL.rstrip("/") + reverse("invitation_link", args=[token])
    context = {"invitation": invitation, "link": link}
    send_mail(
        subject=f"You are invited to {invitation.tenant.name} on gpuplatform",
        message=render_to_string("tenants/email/invitation.txt", context),
        from_email=None,
        recipient_list=[invitation.email],
    )
    invitation.token_hash = hash_secret(token)
    invitation.sent_at = timezone.now()
    invitation.save(update_fields=["token_hash", "sent_at"])
    return True


@transaction.atomic
def invitation_accept(*, token: str, password: str) -> Membership:
    """A new account for the invited address, joined to the inviting tenant."""
    invitation = invitation_by_token(token)
    if invitation is None:
        raise ServiceError(
            "This invitation link is invalid, expired or already used.", code="invalid_invitation"
        )
    invitation = invitation_lock(invitation.pk)
    if invitation.accepted_at:
        raise Conflict("This invitation was already accepted.", code="invalid_invitation")
    if invitation.tenant.status != Tenant.Status.ACTIVE:
        raise NotAllowed(
            "This tenant is suspended; ask its owner or support.", code="tenant_suspended"
        )
    user = _new_user(email=invitation.email, password=password)
    membership = Membership.objects.create(
        user=user, tenant=invitation.tenant, role=invitation.role
    )
    invitation.accepted_at = timezone.now()
    invitation.save(update_fields=["accepted_at"])
    audit_event_record(
        tenant=invitation.tenant,
        actor=user,
        action="invitation.accepted",
        summary=f"{user.email} joined as {invitation.role}",
    )
    return membership


def invitation_purge_expired() -> int:
    """Delete pending invitations that expired long ago; accepted ones stay as history."""
    cutoff = timezone.now() - INVITATION_PURGE_AFTER
    deleted, _ = Invitation.objects.filter(accepted_at__isnull=True, expires_at__lt=cutoff).delete()
    return deleted


# --- API tokens -------------------------------------------------------------------------


@transaction.atomic
def api_token_create(
    *,
    user: User,
    name: str,
    expires_in_days: int | None = None,
    scopes: Sequence[str] | None = None,
    allowed_networks: Sequence[str] = (),
    within: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """Make a token; the plain value is returned once and never stored.

    `scopes` None means every scope the user's role allows (or, for a token made by a
    token, `within`, that token's; its networks and expiry likewise). The new one may not
    do more than `within`, nor from more places, nor for longer; it spends within
    `within`'s limit and is revoked with it.
    """
    name = _clean_token_name(name)
    _check_token_days(expires_in_days)
    membership = _token_membership(user)
    granted, allowed = _token_scopes(user=user, membership=membership, scopes=scopes, within=within)
    networks = clean_networks(networks=allowed_networks)
    if within is not None and not networks:  # a child defaults to its parent's networks
        networks = list(within.allowed_networks)
    now = timezone.now()
    expires_at = now + timedelta(days=expires_in_days) if expires_in_days else None
    if within is not None:
        _check_within(token=within, scopes=granted, networks=networks, allowed=allowed)
        expires_at = _expiry_within(token=within, expires_at=expires_at)
    value = new_secret(API_TOKEN_PREFIX)
    token = ApiToken.objects.create(
        user=user,
        tenant=membership.tenant if membership else None,
        name=name,
        prefix=display_prefix(value),
        key_hash=hash_secret(value),
        expires_at=expires_at,
        scopes=granted,
        allowed_networks=networks,
        parent=within,
    )
    if membership:
        audit_event_record(
            tenant=membership.tenant,
            actor=user,
            action="token.created",
            summary=f"{user.email} created API token {name!r} ({token.prefix}…)",
            data={
                "scopes": granted,
                "allowed_networks": networks,
                "made_by_token": within.prefix if within is not None else None,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
    return token, value


def _token_scopes(
    *,
    user: User,
    membership: Membership | None,
    scopes: Sequence[str] | None,
    within: ApiToken | None,
) -> tuple[list[str], frozenset[str]]:
    """(the scopes a new token gets, those its maker's role allows): asked, or by default
    all the role allows, or for a token's child its parent's."""
    role = membership.role if membership else None
    ops = is_ops(user)
    allowed = role_scopes(is_staff=ops, role=role)
    wanted: Iterable[str] = scopes if scopes is not None else allowed
    if scopes is None and within is not None:  # a child defaults to its parent's scopes
        wanted = [s for s in within.scopes if s in allowed]
    granted = clean_scopes(scopes=wanted, allowed=allowed, role="staff" if ops else str(role))
    return granted, allowed


def _expiry_within(*, token: ApiToken, expires_at: datetime | None) -> datetime | None:
    """A token made by a token expires no later than its maker: with no expiry asked, it
    takes the maker's; asked past it, it is refused (never silently shortened)."""
    if token.expires_at is None:
        return expires_at
    if expires_at is None:
        return token.expires_at
    if expires_at > token.expires_at:
        raise ServiceError(
            f"This token expires at {token.expires_at:%Y-%m-%d %H:%M} UTC: a token it makes "
            "must expire by then (ask for fewer days, or none to expire with it).",
            code="max_value",
            field="expires_in_days",
        )
    return expires_at


def _clean_token_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise ServiceError("Give the token a name.", code="required", field="name")
    if len(name) > 64:
        raise ServiceError(
            "Ensure this field has no more than 64 characters.", code="max_length", field="name"
        )
    return name


def _check_token_days(expires_in_days: int | None) -> None:
    if expires_in_days is not None and not 1 <= expires_in_days <= API_TOKEN_MAX_DAYS:
        raise ServiceError(
            f"Choose between 1 and {API_TOKEN_MAX_DAYS} days.",
            code="min_value" if expires_in_days < 1 else "max_value",
            field="expires_in_days",
        )


def _token_membership(user: User) -> Membership | None:
    """The membership a new token of `user` acts under (None for ops), if it may have one."""
    membership = Membership.objects.select_related("tenant").filter(user=user).first()
    if membership is None and not is_ops(user):
        raise NotAllowed("Join or create a tenant before making API tokens.", code="no_tenant")
    if membership is not None and not membership.tenant.is_active:
        raise NotAllowed("This tenant is suspended: no new API tokens.", code="tenant_suspended")
    return membership


def _check_within(
    *, token: ApiToken, scopes: list[str], networks: list[str], allowed: frozenset[str]
) -> None:
    # A token that mints a broader token would make its own limits pointless.
    held = set(token.scopes) & allowed
    missing = [s for s in scopes if s not in held]
    if missing:
        raise NotAllowed(
            f"This token lacks the `{missing[0]}` scope, so it cannot make a token that has it.",
            code="insufficient_scope",
        )
    if not within_networks(networks=networks, outer=list(token.allowed_networks)):
        raise NotAllowed(
            "This token is limited to " + ", ".join(token.allowed_networks) + ": a token it "
            "makes must be limited to networks inside those.",
            code="ip_not_allowed",
        )


@transaction.atomic
def api_token_revoke(*, user: User, token: ApiToken) -> ApiToken:
    token = api_token_lock(token.pk, user=user)
    if token.revoked_at is None:
        now = timezone.now()
        token.revoked_at = now
        token.save(update_fields=["revoked_at"])
        # What it made goes with it: a child never outlives the token that bounded it.
        children = ApiToken.objects.filter(
            pk__in=api_token_descendant_ids(token)[1:], revoked_at__isnull=True
        ).update(revoked_at=now)
        if token.tenant is not None:  # None without a query when it has no tenant
            audit_event_record(
                tenant=token.tenant,
                actor=user,
                action="token.revoked",
                summary=f"{user.email} revoked API token {token.name!r} ({token.prefix}…)"
                + (f" and {children} token(s) it made" if children else ""),
            )
    return token
