"""Two-factor writes: enabling TOTP (with recovery codes), checking a code at sign-in,
regenerating the codes, disabling. Each change is audited where the user has a tenant."""

from __future__ import annotations

import logging
from binascii import unhexlify
from math import ceil

from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from gpuplatform.ops import is_ops

from .. import two_factor
from ..models import ApiToken, Membership, RecoveryCode
from .audit import audit_event_record

log = logging.getLogger("gpuplatform.security")

WRONG_CODE = "That code is not right (or was already used)."


class WrongCode(ServiceError):
    """A code that did not match: pages count it as a failed login."""


# Codes one step either side are accepted: phone clocks drift.
TOLERANCE_STEPS = 1


def _audit(*, user: User, action: str, summary: str) -> None:
    # Staff belong to no tenant: their trail is the security log.
    log.info("two-factor %s: user %s", action, user.pk)
    membership = Membership.objects.filter(user=user).select_related("tenant").first()
    if membership is not None:
        audit_event_record(tenant=membership.tenant, actor=user, action=action, summary=summary)


def _issue_recovery_codes(user: User) -> list[str]:
    RecoveryCode.objects.filter(user=user).delete()
    codes = [two_factor.new_recovery_code() for _ in range(two_factor.RECOVERY_CODE_COUNT)]
    RecoveryCode.objects.bulk_create(
        RecoveryCode(user=user, code_hash=two_factor.recovery_code_hash(user_id=user.pk, code=c))
        for c in codes
    )
    return codes


def _check_totp(*, user: User, code: str) -> TOTPDevice:
    """Never inside a transaction that a wrong code rolls back: verify_token counts the
    failure on the device (its throttle: each further try waits twice as long), and that
    count must outlive the failed request, or it never grows."""
    device = two_factor.totp_device(user)
    if device is None:
        raise Conflict("Two-factor sign-in is not set up.")
    allowed, why = device.verify_is_allowed()
    if not allowed and why and why.get("locked_until"):
        wait = ceil((why["locked_until"] - timezone.now()).total_seconds())
        raise WrongCode(
            f"Too many wrong codes for this account: wait {max(wait, 1)} s and try again.",
            field="code",
        )
    # verify_token refuses a code already used (last_t) and throttles the device itself:
    # after n wrong codes in a row the next is checked only 2^(n-1) s later.
    if not device.verify_token(code.strip()):
        raise WrongCode(WRONG_CODE, field="code")
    return device


def _sign_out_elsewhere(*, user: User, keep_session_key: str | None) -> int:
    """End every session of `user` but the one that made the change. Sessions are not
    indexed by user, so the live ones are read; this runs on a rare, deliberate act."""
    ended = []
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        if session.session_key == keep_session_key:
            continue
        if str(session.get_decoded().get(SESSION_KEY)) == str(user.pk):
            ended.append(session.session_key)
    Session.objects.filter(session_key__in=ended).delete()
    return len(ended)


@transaction.atomic
def two_factor_enable(
    *, user: User, key: str, code: str, keep_session_key: str | None = None
) -> list[str]:
    """Confirm the secret shown on the set-up page with one code from the app; returns the
    recovery codes, the only time they are seen in the clear.

    What was opened with the password alone stops working: every other session of the user
    ends, and every API token they made before is revoked (with the tokens those made)."""
    if two_factor.totp_device(user) is not None:
        raise Conflict("Two-factor sign-in is already on.")
    totp = TOTP(unhexlify(key))
    code = code.strip()
    digits = code.isascii() and code.isdigit()  # "²" is a digit to str, not to int()
    if not (digits and totp.verify(int(code), tolerance=TOLERANCE_STEPS)):
        raise WrongCode(WRONG_CODE, field="code")
    TOTPDevice.objects.filter(user=user).delete()  # an abandoned earlier set-up
    TOTPDevice.objects.create(
        user=user, name="Authenticator app", key=key, confirmed=True, last_t=totp.t()
    )
    codes = _issue_recovery_codes(user)
    revoked = ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    sessions = _sign_out_elsewhere(user=user, keep_session_key=keep_session_key)
    _audit(
        user=user,
        action="two_factor.enabled",
        summary=f"Two-factor sign-in turned on; {sessions} other session(s) signed out and "
        f"{revoked} API token(s) made before revoked.",
    )
    return codes


def two_factor_verify(*, user: User, code: str) -> TOTPDevice:
    """The second step of signing in: a code from the app or an unused recovery code.
    Returns the device the session is then verified with. Not one transaction: a wrong
    code's count on the device must be committed (_check_totp); a recovery code is used
    by one conditional UPDATE, atomic by itself."""
    if not two_factor.looks_like_recovery_code(code):
        return _check_totp(user=user, code=code)
    device = two_factor.totp_device(user)
    # One conditional UPDATE: of two sign-ins racing with the same code, one wins.
    consumed = RecoveryCode.objects.filter(
        user=user,
        used_at__isnull=True,
        code_hash=two_factor.recovery_code_hash(user_id=user.pk, code=code),
    ).update(used_at=timezone.now())
    if device is None or not consumed:
        raise WrongCode(WRONG_CODE, field="code")
    left = RecoveryCode.objects.filter(user=user, used_at__isnull=True).count()
    _audit(
        user=user,
        action="two_factor.recovery_code_used",
        summary=f"Signed in with a recovery code ({left} left).",
    )
    return device


def recovery_codes_regenerate(*, user: User, code: str) -> list[str]:
    """New recovery codes for a fresh code from the app; the old ones stop working. The
    code is checked before the transaction (_check_totp)."""
    _check_totp(user=user, code=code)
    with transaction.atomic():
        codes = _issue_recovery_codes(user)
        _audit(
            user=user,
            action="two_factor.recovery_codes_regenerated",
            summary="Two-factor recovery codes regenerated.",
        )
    return codes


def two_factor_disable(*, user: User, code: str) -> None:
    """Turn two-factor sign-in off with a fresh code. Staff may not: it is their rule. The
    code is checked before the transaction (_check_totp)."""
    if is_ops(user):
        raise NotAllowed(
            "Ops accounts must keep two-factor sign-in on.", code="two_factor_required"
        )
    _check_totp(user=user, code=code)
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user).delete()
        RecoveryCode.objects.filter(user=user).delete()
        _audit(user=user, action="two_factor.disabled", summary="Two-factor sign-in turned off.")
