"""The web terminal's rules without a node: the one command it runs (fixed; only the
database's container id and the edge's own mark in it), the resize messages it accepts,
the per-user limit, and the recheck that closes open terminals (one batch of queries)."""

from __future__ import annotations

import shlex

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from edge import terminal, terminal_access
from tenants.models import Membership, Role, Slice, Tenant
from tests.edge.test_terminal_ticket import CID, running_on
from tests.factories import MembershipFactory
from tests.incidents.support import placeable_node

MARK = "0123456789abcdef" * 2


def test_the_exec_is_a_fixed_argv_with_the_databases_container_id():
    argv = terminal.exec_argv(CID, MARK)
    assert argv == [
        "docker", "exec", "-it", "-e", "TERM=xterm-256color", "-e", f"GPP_TERMINAL={MARK}",
        CID, "/bin/sh", "-c",
        "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi",
    ]  # fmt: skip
    assert shlex.split(shlex.join(argv)) == argv
    for bad in ("", "abc", CID.upper(), f"{CID[:12]}; reboot", "--privileged", "a" * 65):
        with pytest.raises(ValueError, match="not a container id"):
            terminal.exec_argv(bad, MARK)
    for bad in ("", "x" * 32, MARK + "0", "$(reboot)"):
        with pytest.raises(ValueError, match="not a terminal mark"):
            terminal.exec_argv(CID, bad)
        with pytest.raises(ValueError, match="not a terminal mark"):
            terminal.hangup_argv(bad)
    assert terminal.hangup_argv(MARK)[-1] == f"GPP_TERMINAL={MARK}"


def test_only_a_sane_resize_is_taken():
    assert terminal.size_of([120, 40]) == (120, 40)
    for bad in ([0, 40], [120], [120, 40, 1], ["120", "40"], [1.5, 40], [True, 40], None, 7):
        assert terminal.size_of(bad) is None, bad
    assert terminal.size_of([1001, 40]) is None


def test_a_user_holds_at_most_the_limit_of_terminals(settings):
    settings.TERMINAL_SESSIONS_PER_USER = 2
    terminals = terminal.Terminals(relays=None)  # type: ignore[arg-type]  # no node here
    terminals._reserve(7)  # noqa: SLF001 - the limit's own check, without a node
    terminals._reserve(7)  # noqa: SLF001
    terminals._reserve(8)  # noqa: SLF001 - another user has their own
    with pytest.raises(terminal_access.Refused, match="at most 2 open terminals") as refused:
        terminals._reserve(7)  # noqa: SLF001
    assert refused.value.status == 429
    terminals._unreserve(7)  # noqa: SLF001
    terminals._reserve(7)  # noqa: SLF001


@pytest.fixture
def opened(owner_a):
    s = running_on(owner_a, placeable_node("w1", "10.8.0.1"))
    return s, terminal_access.terminal_target(user_id=owner_a.user.pk, slice_id=s.pk)


@pytest.mark.django_db(transaction=True)
def test_an_open_terminal_closes_when_its_slice_stops_or_its_member_goes(opened, owner_a):
    s, opening = opened
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    theirs = terminal_access.terminal_target(user_id=member.user.pk, slice_id=s.pk)
    assert terminal_access.still_allowed([opening, theirs]) == ["", ""]

    Membership.objects.filter(pk=member.pk).update(role=Role.VIEWER)
    assert terminal_access.still_allowed([opening, theirs]) == [
        "",
        "no longer a member who may open a terminal",
    ]
    Membership.objects.filter(pk=member.pk).delete()
    assert terminal_access.still_allowed([theirs]) == ["no longer a member who may open a terminal"]

    Slice.objects.filter(pk=s.pk).update(container_id="f" * 64)
    assert terminal_access.still_allowed([opening]) == [f"slice {s.pk} runs another container now"]
    Slice.objects.filter(pk=s.pk).update(container_id=CID, state=Slice.State.STOPPING)
    assert terminal_access.still_allowed([opening]) == [f"slice {s.pk} stopped"]
    Slice.objects.filter(pk=s.pk).update(state=Slice.State.RUNNING)
    Tenant.objects.filter(pk=owner_a.tenant_id).update(status=Tenant.Status.SUSPENDED)
    assert terminal_access.still_allowed([opening]) == ["the tenant was suspended"]
    owner_a.user.is_active = False
    owner_a.user.save()
    assert terminal_access.still_allowed([opening]) == ["the account was deactivated"]


@pytest.mark.django_db(transaction=True)
def test_the_recheck_is_one_batch_however_many_terminals_are_open(opened, owner_a):
    _, opening = opened
    with CaptureQueriesContext(connection) as few:
        terminal_access.still_allowed.__wrapped__([opening])
    with CaptureQueriesContext(connection) as many:
        terminal_access.still_allowed.__wrapped__([opening] * 50)
    assert len(few) == len(many) == 3
