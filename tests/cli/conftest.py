"""Fixtures of the CLI tests: the live test server with the seeded tiers, a tenant owner
with an API token and credit, `gpp` pointed at the server, and one emulated node to launch
on. Celery runs eagerly (the live server is a thread of this process, so the tasks a
request queues run there, against the emulator)."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from tenants import services
from tests.cli.support import Gpp
from tests.factories import MembershipFactory, make_token


@pytest.fixture(autouse=True)
def seeded_tiers(transactional_db):
    """A transactional test's flush empties what the data migration seeded."""
    importlib.import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)


@pytest.fixture
def owner(transactional_db):
    return MembershipFactory(tenant__name="Kestrel Compute", user__email="kim@kestrel.test")


@pytest.fixture
def token(owner) -> str:
    return make_token(owner.user)[1]


@pytest.fixture
def gpp(live_server, tmp_path, token) -> Gpp:
    """`gpp` with the owner's token in GPP_TOKEN (login itself is tested without it)."""
    home = tmp_path / "home"
    home.mkdir()
    return Gpp(home=home, url=live_server.url, token=token)


@pytest.fixture
def fleet(eager, worker_fleet, image_ssh):
    """One emulated node with an RTX 4090, and the allowlisted `CUDA base` image (ssh)."""
    return worker_fleet()


@pytest.fixture
def credit(owner, ops_user):
    services.credit_grant(tenant=owner.tenant, amount="50.00", actor=ops_user, memo="cli tests")
