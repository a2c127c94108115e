"""The probe image is an ops setting chosen from the image allowlist (issue 20): no lab name
as a production default, the gate fails saying so until ops choose one, and a choice not on
the allowlist is refused naming the field. Every change is kept: who, when, old -> new, why."""

from __future__ import annotations

import importlib
import io

import pytest
from django.apps import apps
from django.core.management import call_command

from nodelab import IMAGE
from nodes import selectors
from nodes import services as node_services
from nodes.allowlist import (
    allowlisted,
    allowlisted_images,
    register_allowlist,
    unregister_allowlist,
)
from nodes.models import GateStatus, NodePolicy, NodePolicyChange
from tenants.models import Image
from tenants.selectors import image_allowlist

LAB_NAME = "gpuplatform-lab/workload:1"
DIGEST = "sha256:" + "ab" * 32
MIGRATION = importlib.import_module("nodes.migrations.0009_probe_image_chosen_by_ops")


@pytest.fixture
def allowlist(db):
    return {
        "cuda": Image.objects.create(
            name="CUDA probe", reference="nvidia/cuda:12.4.1-base-ubuntu22.04", connect="service"
        ),
        "pinned": Image.objects.create(
            name="Pinned probe", reference="acme/probe:3", digest=DIGEST, connect="service"
        ),
        "retired": Image.objects.create(
            name="Retired", reference="acme/old:1", connect="service", is_active=False
        ),
    }


# --- no lab default ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_production_policy_has_no_probe_image() -> None:
    assert NodePolicy().probe_image == ""
    assert selectors.preflight_policy().probe_image == ""


@pytest.mark.django_db
def test_the_migration_clears_the_lab_name_and_keeps_a_choice_ops_made() -> None:
    NodePolicy.objects.create(pk=1, probe_image=LAB_NAME)
    MIGRATION.clear_the_lab_default(apps, None)
    assert NodePolicy.objects.get(pk=1).probe_image == ""
    NodePolicy.objects.filter(pk=1).update(probe_image="acme/probe:3")
    MIGRATION.clear_the_lab_default(apps, None)
    assert NodePolicy.objects.get(pk=1).probe_image == "acme/probe:3"


@pytest.mark.django_db(transaction=True)
def test_with_no_probe_image_the_gate_fails_saying_where_to_choose_one(worker_fleet):
    fleet = worker_fleet()
    state = fleet.nodes[0].state
    NodePolicy.objects.filter(pk=1).update(probe_image="")
    node = node_services.node_discover(node_id=fleet.registered[0].pk)
    assert node.gate_status == GateStatus.FAILED
    assert (
        "no probe image set: ops choose one from the allowlist on /ops/fleet/node-policy/"
        in node.gate_reason
    )
    assert node_services.allocation_reserve(owner_key="slice-1", vram_mb=4096) is None
    before = len(state.containers)
    node_services.node_discover(node_id=node.pk)
    assert len(state.containers) == before  # nothing was started to find that out


# --- the API ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_probe_image_off_the_allowlist_is_a_400_naming_the_field(api_ops, allowlist):
    for refused in (LAB_NAME, "acme/old:1", "acme/elsewhere:2"):
        response = api_ops.patch(
            "/api/v1/node-policy/", {"probe_image": refused, "reason": "try"}, format="json"
        )
        assert response.status_code == 400, refused
        body = response.json()
        assert body["code"] == "validation_error"
        assert body["fields"]["probe_image"][0]["code"] == "invalid_choice"
        assert "probe_image" in body["message"] and refused in body["message"]
        assert "nvidia/cuda:12.4.1-base-ubuntu22.04" in body["message"]  # what may be chosen
    blank = api_ops.patch(
        "/api/v1/node-policy/", {"probe_image": "", "reason": "try"}, format="json"
    )
    assert blank.status_code == 400 and "probe_image" in blank.json()["fields"]
    assert selectors.preflight_policy().probe_image == ""
    assert not NodePolicyChange.objects.exists()


@pytest.mark.django_db
def test_ops_choose_the_probe_image_from_the_allowlist_and_it_is_kept(
    api_ops, ops_user, allowlist, django_capture_on_commit_callbacks
):
    shown = api_ops.get("/api/v1/node-policy/").json()
    assert shown["probe_image"] == ""
    assert shown["probe_image_choices"] == [
        "nvidia/cuda:12.4.1-base-ubuntu22.04",
        f"acme/probe:3@{DIGEST}",
    ]  # by name; the retired one is not allowlisted
    with django_capture_on_commit_callbacks() as callbacks:
        ok = api_ops.patch(
            "/api/v1/node-policy/",
            {"probe_image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "reason": "our CUDA base"},
            format="json",
        )
    assert ok.status_code == 200, ok.content
    assert ok.json()["probe_image"] == "nvidia/cuda:12.4.1-base-ubuntu22.04"
    assert len(callbacks) == 1  # every node judged again with it
    # a pinned image is run as the allowlist runs it: with its digest
    pinned = api_ops.patch(
        "/api/v1/node-policy/", {"probe_image": "acme/probe:3", "reason": "pin it"}, format="json"
    )
    assert pinned.json()["probe_image"] == f"acme/probe:3@{DIGEST}"
    changes = api_ops.get("/api/v1/node-policy/changes/?field=probe_image").json()["results"]
    assert [(c["old_value"], c["new_value"], c["reason"], c["changed_by"]) for c in changes] == [
        ("nvidia/cuda:12.4.1-base-ubuntu22.04", f"acme/probe:3@{DIGEST}", "pin it",
         ops_user.username),
        ("", "nvidia/cuda:12.4.1-base-ubuntu22.04", "our CUDA base", ops_user.username),
    ]  # fmt: skip
    assert all(c["changed_at"] for c in changes)


@pytest.mark.django_db
def test_a_kept_probe_image_retired_from_the_allowlist_does_not_block_other_changes(
    api_ops, allowlist
):
    NodePolicy.objects.update_or_create(pk=1, defaults={"probe_image": "acme/old:1"})
    ok = api_ops.patch(
        "/api/v1/node-policy/",
        {"probe_image": "acme/old:1", "min_runc_version": "1.2.0", "reason": "CVE-2025-31133"},
        format="json",
    )
    assert ok.status_code == 200, ok.content
    assert set(NodePolicyChange.objects.values_list("field", flat=True)) == {"min_runc_version"}


@pytest.mark.django_db
def test_without_an_allowlist_to_read_nothing_can_be_chosen(api_ops, allowlist) -> None:
    assert allowlisted("nvidia/cuda:12.4.1-base-ubuntu22.04") is not None
    unregister_allowlist(image_allowlist)  # as if no app kept one: nodes fails closed
    try:
        assert allowlisted_images() == []
        refused = api_ops.patch(
            "/api/v1/node-policy/",
            {"probe_image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "reason": "try"},
            format="json",
        )
        assert refused.status_code == 400 and "none yet" in refused.json()["message"]
    finally:
        register_allowlist(image_allowlist)


# --- the page -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_ops_choose_the_probe_image_on_the_node_policy_page(client, ops_user, allowlist):
    client.force_login(ops_user)
    page = client.get("/ops/fleet/node-policy/").content.decode()
    assert 'id="no-probe-image"' in page and "/ops/images/" in page
    assert '<option value="nvidia/cuda:12.4.1-base-ubuntu22.04">CUDA probe' in page
    assert "acme/old:1" not in page  # retired: not a choice
    form = {
        "min_toolkit_version": "1.19.1",
        "min_runc_version": "1.1.12",
        "driver_branches": "535, 550, 570, 580",
        "known_fixed_builds": "runc 1.1.5+ds1-1+deb12u1 Debian bookworm's security update "
        "(DSA-5615-1) backports the CVE-2024-21626 fix",
        "probe_command": "/usr/bin/gpu-workload",
        "probe_environment": "WORKLOAD_PROFILE=steady\nWORKLOAD_COOPERATIVE=0\n"
        "WORKLOAD_MB={alloc_mb}\nWORKLOAD_EXIT_AFTER_S=0.2",
        "reason": "choose the probe",
    }
    refused = client.post("/ops/fleet/node-policy/", {**form, "probe_image": LAB_NAME})
    assert refused.status_code == 200
    assert "Select a valid choice" in refused.content.decode()
    assert selectors.preflight_policy().probe_image == ""
    saved = client.post(
        "/ops/fleet/node-policy/", {**form, "probe_image": "nvidia/cuda:12.4.1-base-ubuntu22.04"}
    )
    assert saved.status_code == 302
    assert selectors.preflight_policy().probe_image == "nvidia/cuda:12.4.1-base-ubuntu22.04"
    [change] = NodePolicyChange.objects.all()
    assert (change.field, change.old_value, change.new_value, change.changed_by) == (
        "probe_image",
        "",
        "nvidia/cuda:12.4.1-base-ubuntu22.04",
        ops_user,
    )
    page = client.get("/ops/fleet/node-policy/").content.decode()
    assert 'id="no-probe-image"' not in page
    assert "choose the probe" in page  # the history
    # saving the rest without a choice keeps the one made
    client.post("/ops/fleet/node-policy/", {**form, "min_runc_version": "1.2.0"})
    assert selectors.preflight_policy().probe_image == "nvidia/cuda:12.4.1-base-ubuntu22.04"


# --- the demo -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_demo_seeding_chooses_the_labs_image_explicitly(settings, tmp_path) -> None:
    settings.VAR_DIR = tmp_path
    call_command("seed_demo", stdout=io.StringIO())
    assert selectors.preflight_policy().probe_image == IMAGE == LAB_NAME
    change = NodePolicyChange.objects.get(field="probe_image")
    assert change.changed_by.username == "ops@example.com" and "demo" in change.reason
    call_command("seed_demo", stdout=io.StringIO())
    assert NodePolicyChange.objects.filter(field="probe_image").count() == 1
    # the demo's templates, on its images, once however often it is seeded
    from tenants.models import LaunchTemplate  # noqa: PLC0415 - the one tenants model read here

    assert sorted(LaunchTemplate.objects.values_list("name", "image__name")) == [
        ("Jupyter", "Jupyter (lab)"),
        ("Model server", "HTTP service (lab)"),
        ("SSH workspace", "SSH (lab)"),
    ]
