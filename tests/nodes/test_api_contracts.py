"""The node policy's history and the reserved environment against the shared contracts
(the nodes and GPUs lists: test_fleet_api_pages.py)."""

from types import SimpleNamespace

import pytest

from nodes import isolation, services
from nodes.models import NodePolicyChange
from tests.api_contract import ApiResourceContract, OpsResourceContract
from tests.tenants.api_objects import ops_actor

pytestmark = pytest.mark.django_db


class TestNodePolicyChangesApi(OpsResourceContract):
    list_url = "/api/v1/node-policy/changes/"
    filters = {"field": ("min_runc_version", "probe_image")}

    def make(self, membership):
        # ops raise the minimum runc with a reason: one change, kept with who and why
        n = NodePolicyChange.objects.count()
        services.preflight_policy_update(
            actor=ops_actor(), reason="CVE-2024-21626", min_runc_version=f"1.2.{n}"
        )
        return NodePolicyChange.objects.latest("pk")


class TestReservedEnvironmentApi(ApiResourceContract):
    """The variables a launch may not set: one list from the code (nodes/isolation.py),
    the same for everyone, read by any signed-in user; a row is named by its `name`."""

    list_url = "/api/v1/reserved-environment/"
    tenant_scoped = False
    has_detail = False
    rows_in_database = False

    def make(self, membership):
        # the rows are not made: they are the code's list
        return SimpleNamespace(name=isolation.reserved_list()[0]["name"])

    def row_id(self, row):
        return row["name"]

    def obj_id(self, obj):
        return obj.name
