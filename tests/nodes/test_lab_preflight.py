"""The preflight gate against the node lab: a real sshd and Docker Engine, the machine's
own runc, the lab's stand-in toolkit hook (it reports any version) and real probe
containers started through the same `docker run` argv as a tenant's slice."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from emulator.catalog import GpuSpec
from incidents import services as incident_services
from incidents.models import Incident
from nodelab import IMAGE, LabNodeSpec
from nodes import services as node_services
from nodes.image_refs import node_holds
from nodes.models import GateStatus, Gpu, Node, NodePolicyChange
from nodes.preflight import version_tuple
from tenants.models import Image

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]


def reserve(vram_mb: int, key: str = "slice-1"):
    return node_services.allocation_reserve(owner_key=key, vram_mb=vram_mb)


def test_a_toolkit_older_than_the_minimum_takes_no_placement_says_why_and_an_upgrade_releases_it(
    lab_fleet,
):
    fleet = lab_fleet()
    lab_node, row = fleet.nodes[0], fleet.registered[0]
    assert row.gate_status == GateStatus.PASSED, row.gate_reason
    lab_node.set_toolkit_version("1.17.7")
    node = node_services.node_discover(node_id=row.pk)
    assert node.gate_status == GateStatus.FAILED
    assert "NVIDIA Container Toolkit 1.17.7" in node.gate_reason
    assert "older than 1.19.1" in node.gate_reason and "CVE-2025-23266" in node.gate_reason
    assert "CVE-2026-24260" in node.gate_reason
    assert node.preflight["facts"]["toolkit_version"] == "1.17.7"
    assert node.preflight["facts"]["toolkit_source"] == "nvidia-container-runtime-hook"
    assert reserve(4096) is None
    # the ledger says so once the sweep runs, for ops only
    incident_services.watch_sweep()
    incident = Incident.objects.get(rule="node_gate_failed", node=node)
    assert "1.17.7" in incident.evidence["reason"] and incident.resolved_at is None

    lab_node.set_toolkit_version("1.19.1")
    node = node_services.node_discover(node_id=row.pk)
    assert node.gate_status == GateStatus.PASSED and node.gate_reason == ""
    allocation = reserve(4096)
    assert allocation is not None and allocation.gpu.node_id == node.pk
    incident_services.watch_sweep()
    incident.refresh_from_db()
    assert incident.resolved_at is not None


def test_the_machines_runc_is_judged_by_its_build_and_debians_patched_build_is_accepted(
    lab_fleet, ops_user
):
    fleet = lab_fleet()
    row = fleet.registered[0]
    facts = row.preflight["facts"]
    runc = next(c for c in row.preflight["checks"] if c["name"] == "runc")
    assert facts["runc_version"], "docker version names the runc dockerd uses"
    # read from the binary dockerd's default runtime names, its build from the package
    # that owns that very file (Debian's runc package on the lab's machine)
    assert facts["runc_path"].endswith("/runc"), facts
    assert facts["userns_remap"] == "false", facts  # the lab's dockerd does not remap
    # the gateway's relay, read from the machine's own nsenter and python3 (lab nodes are
    # reached through the gateway: they need both)
    assert facts["relay_nsenter"].startswith("nsenter from util-linux "), facts
    assert facts["relay_python3"].startswith("Python 3."), facts
    assert next(c for c in row.preflight["checks"] if c["name"] == "relay")["ok"]
    # and the images its Docker Engine holds, the lab's workload image among them
    node = Node.objects.get(pk=row.pk)
    assert node.images_read_at is not None
    assert node_holds(node.images, IMAGE), node.images
    if facts["runc_build"]:
        assert facts["runc_package"], facts

    if version_tuple(facts["runc_version"]) >= (1, 1, 12):
        assert runc["ok"], runc
        return
    # an older number: only the known-fixed list lets it through (Debian bookworm's
    # 1.1.5+ds1-1+deb12u1 carries the CVE-2024-21626 fix)
    assert facts["runc_build"] == "1.1.5+ds1-1+deb12u1", facts
    assert runc["ok"] and "known-fixed build" in runc["detail"], runc
    assert row.gate_status == GateStatus.PASSED
    # without that entry the same node fails on runc, naming the CVE
    node_services.preflight_policy_update(
        actor=ops_user, reason="test: no backports trusted", known_fixed_builds=[]
    )
    node = node_services.node_discover(node_id=row.pk)
    assert node.gate_status == GateStatus.FAILED
    assert "runc 1.1.5+ds1" in node.gate_reason and "CVE-2024-21626" in node.gate_reason
    assert NodePolicyChange.objects.filter(field="known_fixed_builds").count() == 1


def test_the_probe_reads_the_hardening_the_platform_asked_for(lab_fleet):
    row = lab_fleet().registered[0]
    probes = row.preflight["probes"]
    assert {p["kind"] for p in probes} == {"within", "past", "env-set", "env-unset"}
    for probe in probes:
        readings = probe["readings"]
        assert probe["error"] == ""
        assert readings["CapEff"] == "0000000000000000"
        assert readings["NoNewPrivs"] == "1"
        assert readings["memory.max"] == str(256 * 1024 * 1024)
        assert readings["pids.max"] == "64"
        assert readings["cpu.max"] == "50000 100000"
    by_kind = {p["kind"]: p["readings"]["alloc_exit"] for p in probes}
    # refused past the quota with the CUDA out-of-memory error, also to the processes
    # that set CUDA_DISABLE_CONTROL=true and an 80 GiB limit or unset LD_PRELOAD: the
    # limit is the node's (a read-only /overrideEnv, the library in /etc/ld.so.preload)
    assert by_kind == {"within": "0", "past": "1", "env-set": "1", "env-unset": "1"}, probes
    for probe in probes:
        if probe["kind"] != "within":
            assert any("CUDA out of memory" in line for line in probe["output"]), probe
    assert row.preflight["quota"] == {"NVIDIA A30": "proven"}, row.preflight["checks"]
    assert not Gpu.objects.filter(node=row, whole_card_only=True).exists()
    # the probes leave nothing behind on the node
    assert node_services.node_containers_list(node=row) == []


def test_a_quota_library_the_probe_gets_past_makes_the_node_whole_card_only(lab_fleet, api_ops):
    fleet = lab_fleet()
    lab_node, row = fleet.nodes[0], fleet.registered[0]
    lab_node.set_quota_library_mounted(False)  # installed and advertised, not loaded
    node = node_services.node_discover(node_id=row.pk)
    assert node.gate_status == GateStatus.PASSED  # the node is fine; its quota is not
    assert node.preflight["quota"] == {"NVIDIA A30": "ineffective"}
    past = next(p for p in node.preflight["probes"] if p["kind"] == "past")
    assert past["readings"]["alloc_exit"] == "0"  # it got 512 MiB past a 256 MiB quota
    gpu = Gpu.objects.get(node=node)
    assert gpu.whole_card_only
    assert reserve(8192) is None
    whole = reserve(24576)
    assert whole is not None and whole.gpu_id == gpu.pk
    assert reserve(4096, key="slice-2") is None  # one slice, of the whole card
    incident_services.watch_sweep()
    assert Incident.objects.filter(rule="quota_not_effective", node=node).exists()
    node_services.allocation_release(allocation=whole)

    response = api_ops.post(
        f"/api/v1/nodes/{node.pk}/watchdog-only/",
        {"accept": True, "reason": "test: the watchdog holds slices on this node"},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["watchdog_only_accepted_at"]
    assert reserve(8192) is not None
    assert NodePolicyChange.objects.filter(node=node, field="watchdog_only").exists()


def test_a_quota_library_configured_only_by_environment_is_found_and_sold_whole(lab_fleet):
    # upstream HAMi-core on the CUDA path: it ignores /overrideEnv and obeys each
    # process's environment (HAMi#723)
    fleet = lab_fleet([LabNodeSpec("lab-env", (GpuSpec("NVIDIA A30"),), quota_env_only=True)])
    node = fleet.registered[0]
    assert node.gate_status == GateStatus.PASSED, node.gate_reason
    assert node.preflight["quota"] == {"NVIDIA A30": "environment"}
    by_kind = {p["kind"]: p["readings"]["alloc_exit"] for p in node.preflight["probes"]}
    assert by_kind["past"] == "1" and by_kind["env-set"] == "0", node.preflight["probes"]
    check = next(c for c in node.preflight["checks"] if c["name"] == "quota:NVIDIA A30")
    assert "can only be configured by environment" in check["detail"]
    assert Gpu.objects.get(node=node).whole_card_only
    assert reserve(8192) is None


def test_an_image_built_with_env_ld_preload_cannot_be_allowlisted(lab_fleet, api_ops):
    fleet = lab_fleet()
    lab_node = fleet.nodes[0]
    build = lab_node.dir / "evil-image"
    build.mkdir(exist_ok=True)
    (build / "Dockerfile").write_text(f"FROM {IMAGE}\nENV LD_PRELOAD=/x.so\n")
    lab_node.docker("build", "--quiet", "--tag", "lab/nvidiascape:1", str(build), timeout=120)
    try:
        response = api_ops.post(
            "/api/v1/ops/images/",
            {"name": "NVIDIAScape", "reference": "lab/nvidiascape:1", "connect": "service"},
            format="json",
        )
        assert response.status_code == 400, response.content
        body = response.json()
        assert body["code"] == "validation_error"
        assert body["fields"]["reference"][0]["code"] == "image_sets_reserved_variable"
        assert "LD_PRELOAD" in body["message"]
        assert not Image.objects.filter(name="NVIDIAScape").exists()
        # the lab's own image passes, inspected on the node
        response = api_ops.post(
            "/api/v1/ops/images/",
            {"name": "Lab", "reference": IMAGE, "connect": "service"},
            format="json",
        )
        assert response.status_code == 201, response.content
        image = Image.objects.get(name="Lab")
        assert image.inspected_on == fleet.registered[0].name and image.inspected_at
    finally:
        lab_node.docker("image", "rm", "--force", "lab/nvidiascape:1", check=False)


def test_the_gate_is_shown_on_the_node_page_and_in_the_api(lab_fleet, client, ops_user):
    row = lab_fleet().registered[0]
    api = APIClient()
    api.force_authenticate(ops_user)
    body = api.get(f"/api/v1/nodes/{row.pk}/").json()
    assert body["gate_status"] == "passed"
    assert {c["name"] for c in body["preflight"]["checks"]} >= {"toolkit", "runc", "hardening"}
    client.force_login(ops_user)
    page = client.get(f"/ops/nodes/{row.pk}/").content.decode()
    assert "Preflight" in page and "NVIDIA Container Toolkit 1.19.1" in page
