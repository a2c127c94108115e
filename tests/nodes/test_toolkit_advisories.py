"""The NVIDIA Container Toolkit advisories the gate's minimum answers, and the migration
that raised a policy still at the old default (1.17.8) to the release fixing
CVE-2026-24260 (1.19.1), leaving a minimum ops chose alone."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from nodes import preflight
from nodes.models import NodePolicy, NodePolicyChange

MIGRATION = importlib.import_module("nodes.migrations.0016_toolkit_minimum_1_19_1")
GOOD = {
    "toolkit_version": "1.19.1",
    "runc_version": "1.1.12",
    "runc_build": "1.1.12-0ubuntu2~22.04.1",
    "docker_version": "26.1.4",
}


def toolkit_check(version: str) -> preflight.Check:
    checks = preflight._components({**GOOD, "toolkit_version": version}, preflight.Policy())
    return next(c for c in checks if c.name == "toolkit")


def test_the_default_minimum_is_the_newest_advisorys_fix_everywhere_it_is_kept() -> None:
    newest = max(preflight.TOOLKIT_ADVISORIES, key=lambda a: preflight.version_tuple(a.fixed_in))
    assert newest.fixed_in == preflight.TOOLKIT_MINIMUM == "1.19.1"
    assert "CVE-2026-24260" in newest.cves
    assert preflight.Policy().min_toolkit_version == preflight.TOOLKIT_MINIMUM
    assert NodePolicy._meta.get_field("min_toolkit_version").default == preflight.TOOLKIT_MINIMUM
    assert MIGRATION.NEW == preflight.TOOLKIT_MINIMUM
    for advisory in preflight.TOOLKIT_ADVISORIES:
        assert advisory.source.startswith("https://nvidia.custhelp.com/")
        assert preflight.check_version(advisory.fixed_in) == advisory.fixed_in


@pytest.mark.parametrize(
    ("version", "named", "not_named"),
    [
        ("1.17.7", ["CVE-2025-23266", "CVE-2025-23267", "CVE-2026-24260"], []),
        ("1.17.8", ["CVE-2026-24260"], ["CVE-2025-23266"]),
        ("1.18.2", ["CVE-2026-24260"], ["CVE-2025-23266"]),
        ("1.19.0", ["CVE-2026-24260", "fixed in 1.19.1"], ["CVE-2025-23267"]),
    ],
)
def test_a_toolkit_below_the_minimum_fails_naming_only_the_advisories_it_misses(
    version: str, named: list[str], not_named: list[str]
) -> None:
    check = toolkit_check(version)
    assert not check.ok and f"{version} is older than 1.19.1" in check.detail
    for word in named:
        assert word in check.detail
    for word in not_named:
        assert word not in check.detail


@pytest.mark.parametrize("version", ["1.19.1", "1.20.0"])
def test_a_toolkit_at_or_past_the_fix_for_cve_2026_24260_passes(version: str) -> None:
    assert toolkit_check(version).ok


def test_a_minimum_ops_set_past_every_advisory_says_it_is_the_policys() -> None:
    policy = preflight.Policy(min_toolkit_version="1.21.0")
    checks = preflight._components({**GOOD, "toolkit_version": "1.20.0"}, policy)
    [toolkit] = [c for c in checks if c.name == "toolkit"]
    assert not toolkit.ok and "the node policy's minimum" in toolkit.detail
    assert "CVE" not in toolkit.detail


@pytest.mark.django_db
def test_the_migration_raises_a_policy_still_at_1_17_8_and_keeps_the_change() -> None:
    row = NodePolicy.objects.create(min_toolkit_version="1.17.8")
    MIGRATION.forward(apps, None)
    row.refresh_from_db()
    assert row.min_toolkit_version == "1.19.1"
    [change] = NodePolicyChange.objects.all()
    assert (change.field, change.old_value, change.new_value, change.changed_by) == (
        "min_toolkit_version",
        "1.17.8",
        "1.19.1",
        None,
    )
    assert "CVE-2026-24260" in change.reason
    MIGRATION.forward(apps, None)  # run twice, nothing more moves or is recorded
    assert NodePolicyChange.objects.count() == 1

    MIGRATION.backward(apps, None)
    row.refresh_from_db()
    assert row.min_toolkit_version == "1.17.8"
    assert NodePolicyChange.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("chosen", ["1.18.0", "1.17.9", "1.20.0", "1.17.8-1"])
def test_the_migration_leaves_a_minimum_ops_chose_alone(chosen: str) -> None:
    row = NodePolicy.objects.create(min_toolkit_version=chosen)
    MIGRATION.forward(apps, None)
    row.refresh_from_db()
    assert row.min_toolkit_version == chosen
    assert not NodePolicyChange.objects.exists()


@pytest.mark.django_db
def test_reversing_the_migration_leaves_a_1_19_1_that_ops_chose_themselves() -> None:
    row = NodePolicy.objects.create(min_toolkit_version="1.19.1")
    NodePolicyChange.objects.create(
        field="min_toolkit_version", old_value="1.18.2", new_value="1.19.1", reason="bulletin"
    )
    MIGRATION.backward(apps, None)
    row.refresh_from_db()
    assert row.min_toolkit_version == "1.19.1"
    assert NodePolicyChange.objects.count() == 1
