"""factory_boy factories for the test suite."""

import time
from binascii import unhexlify
from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from tenants import services, two_factor
from tenants.models import Membership, Role, Tenant

PASSWORD = "correct-horse-battery-staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    email = factory.Sequence(lambda n: f"user{n}@example.com")
    username = factory.SelfAttribute("email")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()

    @factory.post_generation
    def two_factor(obj, create, extracted, **kwargs):
        # Staff must have two-factor sign-in to reach ops pages, so staff made here have it
        # (set up through the service, as the set-up page does); `two_factor=False` opts out.
        wanted = obj.is_staff if extracted is None else extracted
        if create and wanted and not two_factor.has_two_factor(obj):
            give_two_factor(obj)


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Role.OWNER


def make_token(user):
    """A live API token for `user`; returns (ApiToken, plain value)."""
    return services.api_token_create(user=user, name="test")


def totp_at(key: str, step: int) -> str:
    """The 6-digit code an authenticator app shows for `key` at time step `step`."""
    totp = TOTP(unhexlify(key))
    totp.drift = step - totp.t()
    return f"{totp.token():06d}"


class OtpClock:
    """The suite's clock for two-factor codes: django-otp reads the time through it
    (tests/conftest.py installs it for every test), and it moves only when a test moves
    it. A code computed for a step is checked at that same step, wherever in a real 30 s
    step the test runs; before, a step that turned between the two refused the code."""

    STEP_S = 30

    def __init__(self) -> None:
        # Mid-step, from a real time: codes look like any day's, and nothing is at an edge.
        self.now = (int(time.time()) // self.STEP_S) * self.STEP_S + self.STEP_S / 2

    def time(self) -> float:
        return self.now

    def step(self) -> int:
        return int(self.now) // self.STEP_S

    def advance(self, steps: int = 1) -> None:
        self.now += steps * self.STEP_S


OTP_CLOCK = OtpClock()


def give_two_factor(user) -> list[str]:
    """Turn on TOTP for `user` as the set-up page does; returns the recovery codes. The
    code is the one a step behind (a phone a little slow, which the device accepts), so
    the user's next two sign-ins each have a step of their own without moving the clock
    (a used step is refused)."""
    key = two_factor.new_key()
    return services.two_factor_enable(user=user, key=key, code=totp_at(key, OTP_CLOCK.step() - 1))


def totp_code(user) -> str:
    """A code for `user`'s device that it has not accepted yet: a used step is refused (no
    replay), so a second sign-in in the same step uses the next one, or moves the suite's
    clock on to it."""
    device = two_factor.totp_device(user)
    assert device is not None, f"{user} has no two-factor device"
    step = max(OTP_CLOCK.step(), device.last_t + 1)
    if step > OTP_CLOCK.step() + 1:  # beyond the one step of drift the device accepts
        OTP_CLOCK.advance(step - OTP_CLOCK.step() - 1)
    return totp_at(device.key, step)


def wait_out_code_throttle(user) -> None:
    """As if the wait django-otp asks after wrong codes (1, 2, 4 ... s) had passed, without
    sleeping: the device's last failure is moved an hour back; its count stays."""
    TOTPDevice.objects.filter(user=user).update(
        throttling_failure_timestamp=timezone.now() - timedelta(hours=1)
    )


def mark_two_factor_passed(client, user) -> None:
    """A test client's session signed in as `user` marked as the code step marks it (with
    the user's device); a user without a device stays unverified, as in production."""
    device = two_factor.totp_device(user)
    if device is not None:
        session = client.session
        session[DEVICE_ID_SESSION_KEY] = device.persistent_id
        session.save()
