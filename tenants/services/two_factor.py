"""Two-factor writes: enabling TOTP (with recovery codes), checking a code at sign-in,
regenerating the codes, disabling. Each change is audited where the user has a tenant."""

from __future__ import annotations

import logging
from binascii import unhexlify

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from gpuplatform.ops import is_ops

from .. import two_factor
from ..models import Membership, RecoveryCode
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
    device = two_factor.totp_device(user)
    if device is None:
        raise Conflict("Two-factor sign-in is not set up.")
    # verify_token refuses a code already used (last_t) and throttles the device itself.
    if not device.verify_token(code.strip()):
        raise WrongCode(WRONG_CODE, field="code")
    return device


@transaction.atomic
def two_factor_enable(*, user: User, key: str, code: str) -> list[str]:
    """Confirm the secret shown on the set-up page with one code from the app; returns the
    recovery codes, the only time they are seen in the clear."""
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
    _audit(user=user, action="two_factor.enabled", summary="Two-factor sign-in turned on.")
    return codes


@transaction.atomic
def two_factor_verify(*, user: User, code: str) -> TOTPDevice:
    """The second step of signing in: a code from the app or an unused recovery code.
    Returns the device the session is then verified with."""
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


@transaction.atomic
def recovery_codes_regenerate(*, user: User, code: str) -> list[str]:
    """New recovery codes for a fresh code from the app; the old ones stop working."""
    _check_totp(user=user, code=code)
    codes = _issue_recovery_codes(user)
    _audit(
        user=user,
        action="two_factor.recovery_codes_regenerated",
        summary="Two-factor recovery codes regenerated.",
    )
    return codes


@transaction.atomic
def two_factor_disable(*, user: User, code: str) -> None:
    """Turn two-factor sign-in off with a fresh code. Staff may not: it is their rule."""
    if is_ops(user):
        raise NotAllowed(
            "Ops accounts must keep two-factor sign-in on.", code="two_factor_required"
        )
    _check_totp(user=user, code=code)
    TOTPDevice.objects.filter(user=user).delete()
    RecoveryCode.objects.filter(user=user).delete()
    _audit(user=user, action="two_factor.disabled", summary="Two-factor sign-in turned off.")
