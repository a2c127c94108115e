"""Images renters bring, on real node software (the lab: real sshd and Docker Engine per
node, the GPU emulated), pulled from registries the test starts on loopback
(tests/registry_standin.py, serving an image the lab node's own dockerd exported with
`docker save`; dockerd treats 127.0.0.0/8 registries as insecure, so plain HTTP).

- an image on no allowlist, from a registry ops allowed, is pulled on the node and runs by
  digest, with the ports its configuration declares;
- one whose configuration sets LD_PRELOAD is still refused, and a missing tag is a
  sentence on the slice, not docker's text;
- a private image runs with the launching tenant's own login, which the registry is asked
  again at every start: another tenant cannot run it, by name or by digest, although the
  node holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodelab import HTTP_IMAGE, HTTP_PORT
from nodes import registry_pull
from nodes.models import AgentState, NodeAgent
from tenants import services
from tenants.models import Slice
from tests.conftest import SMALL_MODEL
from tests.registry_standin import RegistryStandIn

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

PASSWORD = "lab-Registry-Token-71c"


@pytest.fixture
def registries(lab_fleet, tmp_path):
    """The lab node, an open registry and a private one (basic auth), both serving the
    lab's HTTP image under names of their own."""
    fleet = lab_fleet()
    node = fleet.nodes[0]
    saved = tmp_path / "http-image.tar"
    node.docker("save", "-o", str(saved), HTTP_IMAGE)
    open_registry, private = RegistryStandIn().start(), RegistryStandIn().start()
    open_registry.serve_saved(saved, "renter/web", "1")
    open_registry.serve_saved(saved, "renter/preload", "1", env=["LD_PRELOAD=/usr/lib/evil.so"])
    private.serve_saved(saved, "team/secret", "1", env=["TEAM=secret"], users={"alice": PASSWORD})
    yield fleet, open_registry, private
    open_registry.stop()
    private.stop()


def bring(membership, funded, reference: str) -> Slice:
    slice, _ = services.slice_launch(
        membership=membership,
        purchase=funded(membership, vram_gb=8, hours=1),
        image_reference=reference,
        model_request=SMALL_MODEL,
    )
    slice.refresh_from_db()
    return slice


def runs(node, slice: Slice) -> dict:
    """What the node's own docker says the slice's container runs."""
    container = node.container(slice.container_id)
    assert container is not None and container.running, node.logs(slice.container_id)
    return container.raw


def test_an_image_on_no_allowlist_is_pulled_on_the_node_and_runs_by_digest(
    eager, registries, owner_a, funded, ops_user
):
    fleet, registry, _ = registries
    node = fleet.nodes[0]
    services.registry_rule_set(
        actor=ops_user, pattern=registry.host, mode="registry", reason="the lab's registry"
    )
    assert node.docker("image", "inspect", f"{registry.host}/renter/web:1", check=False).returncode

    slice = bring(owner_a, funded, f"{registry.host}/renter/web:1")
    assert slice.state == Slice.State.RUNNING, slice.state_reason
    digest = registry.repos["renter/web"].tags["1"]
    assert slice.image_digest == digest and slice.image_entry is None
    raw = runs(node, slice)
    assert raw["Config"]["Image"] == f"{registry.host}/renter/web@{digest}"
    # the ports come from the image's own configuration, and the gateway offers them
    assert slice.declared_ports == [HTTP_PORT]
    assert slice.connection["gateway"]["forwards"][0]["port"] == HTTP_PORT
    # the platform's isolation holds for it as for any allowlisted image
    env = dict(e.split("=", 1) for e in raw["Config"]["Env"])
    assert env["LD_PRELOAD"] == node.quota_library and env["CUDA_DEVICE_MEMORY_LIMIT"] == "8192m"
    assert registry.manifest_reads("renter/web") >= 1
    services.slice_stop(slice=slice, actor=owner_a.user)


def test_an_image_that_sets_ld_preload_is_refused_and_a_missing_tag_said_in_words(
    eager, registries, owner_a, funded, ops_user
):
    fleet, registry, _ = registries
    node = fleet.nodes[0]
    services.registry_rule_set(actor=ops_user, pattern="*", mode="registry", reason="lab")

    preload = bring(owner_a, funded, f"{registry.host}/renter/preload:1")
    assert preload.state == Slice.State.FAILED
    assert "LD_PRELOAD" in preload.state_reason, preload.state_reason
    assert node.container_ids() == []  # nothing was started with it

    missing = bring(owner_a, funded, f"{registry.host}/renter/web:404")
    assert missing.state == Slice.State.FAILED
    assert "is not in its registry: no such repository, tag or digest" in missing.state_reason
    assert "manifest unknown" not in missing.state_reason
    assert "Error response from daemon" not in missing.state_reason

    nowhere = bring(owner_a, funded, "127.0.0.1:1/renter/web:1")
    assert nowhere.state == Slice.State.FAILED
    assert "could not reach the registry 127.0.0.1:1" in nowhere.state_reason
    assert "dial tcp" not in nowhere.state_reason


def test_a_private_image_runs_only_with_the_launching_tenants_own_login(
    eager, registries, owner_a, owner_b, funded, ops_user
):
    fleet, _, private = registries
    node = fleet.nodes[0]
    row = fleet.registered[0]
    # "any image" from the private registry: only on a node whose agent runs (this one)
    services.registry_rule_set(actor=ops_user, pattern=private.host, mode="any", reason="lab")
    assert NodeAgent.objects.get(node=row).state == AgentState.OK
    reference = f"{private.host}/team/secret:1"

    anonymous = bring(owner_a, funded, reference)
    assert anonymous.state == Slice.State.FAILED
    assert f"the registry {private.host} wants a login" in anonymous.state_reason

    services.registry_credential_set(
        membership=owner_a, registry=private.host, username="alice", password=PASSWORD
    )
    mine = bring(owner_a, funded, reference)
    assert mine.state == Slice.State.RUNNING, mine.state_reason
    digest = private.repos["team/secret"].tags["1"]
    assert runs(node, mine)["Config"]["Image"] == f"{private.host}/team/secret@{digest}"
    asked = private.manifest_reads("team/secret", user="alice")
    # the node now holds it, by tag and by digest
    held = node.docker("image", "ls", "--digests", "--format", "{{json .}}").stdout
    assert digest in held and "team/secret" in held

    # another tenant: refused by name and by digest, whatever the node holds
    asked_before = private.challenges + private.refused["team/secret"]
    by_name = bring(owner_b, funded, reference)
    assert by_name.state == Slice.State.FAILED
    assert "wants a login" in by_name.state_reason and by_name.container_id == ""
    by_digest = bring(owner_b, funded, f"{reference}@{digest}")
    assert by_digest.state == Slice.State.FAILED and "wants a login" in by_digest.state_reason
    # each was put to the registry, which said no (dockerd stops at its challenge)
    assert private.challenges + private.refused["team/secret"] >= asked_before + 2
    services.registry_credential_set(
        membership=owner_b, registry=private.host, username="alice", password="wrong"
    )
    wrong = bring(owner_b, funded, reference)
    assert "refused your tenant's saved login" in wrong.state_reason
    assert len(node.container_ids()) == 1  # only the owner's one runs

    # the owner's next start asks the registry again with the owner's login
    services.slice_stop(slice=mine, actor=owner_a.user)
    mine.refresh_from_db()
    resumed = services.slice_resume(
        membership=owner_a, slice=mine, purchase=funded(owner_a, vram_gb=8, hours=1)
    )
    resumed.refresh_from_db()
    assert resumed.state == Slice.State.RUNNING, resumed.state_reason
    assert private.manifest_reads("team/secret", user="alice") > asked
    assert resumed.image_digest == digest
    # the login was on the node only for each pull (a lab node's files are this machine's)
    pulls = Path(registry_pull.DIRECTORY)
    left = [p.name for p in pulls.iterdir()] if pulls.exists() else []
    assert not [n for n in left if n.startswith(f"{mine.owner_key}-")], left
    services.slice_stop(slice=resumed, actor=owner_a.user)
