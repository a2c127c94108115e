"""Shared fixtures: two tenants with owners, API clients for each, an ops user."""

import pytest
from rest_framework.test import APIClient

from tests.factories import MembershipFactory, UserFactory, make_token


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):  # type: ignore[no-untyped-def]
    # PBKDF2 is slow by design; the suite makes many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def owner_a(db):  # type: ignore[no-untyped-def]
    return MembershipFactory(tenant__name="Alpha Labs", user__email="alice@alpha.test")


@pytest.fixture
def owner_b(db):  # type: ignore[no-untyped-def]
    return MembershipFactory(tenant__name="Beta Research", user__email="bob@beta.test")


@pytest.fixture
def ops_user(db):  # type: ignore[no-untyped-def]
    return UserFactory(email="ops@platform.test", is_staff=True)


@pytest.fixture
def anon_api() -> APIClient:
    return APIClient()


def _token_client(user) -> APIClient:  # type: ignore[no-untyped-def]
    _, value = make_token(user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    return client


@pytest.fixture
def api_a(owner_a) -> APIClient:  # type: ignore[no-untyped-def]
    return _token_client(owner_a.user)


@pytest.fixture
def api_b(owner_b) -> APIClient:  # type: ignore[no-untyped-def]
    return _token_client(owner_b.user)


@pytest.fixture
def api_ops(ops_user) -> APIClient:  # type: ignore[no-untyped-def]
    return _token_client(ops_user)


@pytest.fixture
def token_client():  # type: ignore[no-untyped-def]
    return _token_client
