"""The preflight gate and the isolation list: the pure judgement first, then the gate
end to end against emulated nodes (the lab's version is tests/nodes/test_lab_preflight.py)."""

from __future__ import annotations

import pytest
from django.db import connections

from emulator.catalog import QUOTA_FROM_ENVIRONMENT, GpuSpec, NodeSpec
from incidents import services as incident_services
from incidents.models import Incident
from nodes import isolation, preflight, runtime, selectors
from nodes import services as node_services
from nodes.locks import PREFLIGHT_LOCK_SPACE
from nodes.models import GateStatus, Gpu, Node, NodePolicyChange
from tenants.models import Image, Slice
from tests.conftest import SMALL_MODEL, SSH_KEY, launch

GOOD_FACTS = {
    "toolkit_version": "1.19.1",
    "runc_version": "1.1.12",
    "runc_build": "1.1.12-0ubuntu2~22.04.1",
    "docker_version": "26.1.4",
}
HARDENED = {
    "CapEff": "0000000000000000",
    "NoNewPrivs": "1",
    "memory.max": str(256 * 1024 * 1024),
    "pids.max": "64",
    "cpu.max": "50000 100000",
}
DEBIAN_RUNC = preflight.KnownBuild("runc", "1.1.5+ds1-1+deb12u1", "DSA-5615-1 backport")


OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB"


def runs(
    model: str = "NVIDIA A30",
    within: str = "0",
    past: str = "1",
    env_set: str = "1",
    env_unset: str = "1",
    **readings,
):
    """A model's four probes; a refused one (non-zero) printed PyTorch's OOM error."""
    seen = {**HARDENED, **readings}
    exits = {"within": within, "past": past, "env-set": env_set, "env-unset": env_unset}
    return [
        preflight.ProbeRun(
            model,
            "GPU-1",
            kind,
            readings={**seen, "alloc_exit": code},
            output=() if code == "0" else (OOM_LINE,),
        )
        for kind, code in exits.items()
    ]


def judge(facts=None, policy=None, probe_runs=None, library="/lib/q.so", driver="550.54.15"):
    return preflight.evaluate(
        facts={**GOOD_FACTS, **(facts or {})},
        driver_version=driver,
        policy=policy or preflight.Policy(driver_branches=("535", "550")),
        runs=runs() if probe_runs is None else probe_runs,
        software_models=["NVIDIA A30"],
        quota_library=library,
    )


# --- the judgement ------------------------------------------------------------------------


def test_a_good_node_passes_with_its_quota_proven() -> None:
    gate = judge()
    assert gate.passed and gate.reason == ""
    assert gate.quota == {"NVIDIA A30": "proven"}
    assert preflight.proven_models(gate.quota) == ["NVIDIA A30"]


@pytest.mark.parametrize(
    ("facts", "words"),
    [
        ({"toolkit_version": "1.17.7"}, ["1.17.7 is older than 1.19.1", "CVE-2025-23266"]),
        ({"toolkit_version": "1.16.2"}, ["1.16.2 is older than 1.19.1"]),
        ({"toolkit_version": "1.19.0"}, ["1.19.0 is older than 1.19.1", "CVE-2026-24260"]),
        ({"toolkit_version": ""}, ["NVIDIA Container Toolkit: its version could not be read"]),
        ({"runc_version": "1.1.11", "runc_build": ""}, ["runc 1.1.11 is older", "CVE-2024-21626"]),
        ({"docker_version": ""}, ["Docker Engine did not answer"]),
    ],
)
def test_old_or_unknown_software_fails_the_gate_naming_why(facts, words) -> None:
    gate = judge(facts)
    assert not gate.passed
    for word in words:
        assert word in gate.reason


def test_a_patched_distribution_build_passes_only_through_the_known_fixed_list() -> None:
    debian = {"runc_version": "1.1.5+ds1", "runc_build": "1.1.5+ds1-1+deb12u1"}
    assert not judge(debian).passed  # a plain version compare says 1.1.5 < 1.1.12
    policy = preflight.Policy(driver_branches=("550",), known_fixed=(DEBIAN_RUNC,))
    gate = judge(debian, policy)
    assert gate.passed
    assert "known-fixed build (DSA-5615-1 backport)" in gate.checks[1].detail
    # the match is the whole build string, not a prefix
    almost = {"runc_version": "1.1.5+ds1", "runc_build": "1.1.5+ds1-1"}
    assert not judge(almost, policy).passed


def test_a_driver_branch_outside_the_policys_list_fails() -> None:
    gate = judge(driver="545.29.06")
    assert not gate.passed and "branch 545" in gate.reason
    assert judge(driver="545.29.06", policy=preflight.Policy()).passed  # empty list: any


@pytest.mark.parametrize(
    ("readings", "words"),
    [
        ({"CapEff": "00000000a80425fb"}, "capabilities 00000000a80425fb"),
        ({"NoNewPrivs": "0"}, "NoNewPrivs 0"),
        ({"memory.max": "max"}, "cgroup memory.max max"),
        ({"pids.max": "max"}, "cgroup pids.max max"),
        ({"cpu.max": "max 100000"}, "cgroup cpu.max max 100000"),
    ],
)
def test_hardening_the_probe_did_not_see_fails_the_gate(readings, words) -> None:
    gate = judge(probe_runs=runs(**readings))
    assert not gate.passed and words in gate.reason


def test_quota_states_limit_sales_without_failing_the_node() -> None:
    ineffective = judge(probe_runs=runs(past="0"))
    assert ineffective.passed and ineffective.quota == {"NVIDIA A30": "ineffective"}
    assert preflight.proven_models(ineffective.quota) == []  # its cards are sold whole
    absent = judge(library="", probe_runs=runs()[:1])
    assert absent.passed and absent.quota == {"NVIDIA A30": "absent"}
    # a probe that cannot even allocate within its quota proves nothing
    broken = judge(probe_runs=runs(within="1", past="1"))
    assert broken.quota == {"NVIDIA A30": "unproven"}
    failed = [
        preflight.ProbeRun("NVIDIA A30", "GPU-1", k, error="docker run failed: no such image")
        for k in ("within", "past")
    ]
    gate = judge(probe_runs=failed)
    assert not gate.passed and "no probe container reported" in gate.reason
    assert gate.quota == {"NVIDIA A30": "unproven"}


def test_the_probe_output_is_read_past_the_jobs_own_lines() -> None:
    nonce = "0123456789abcdef" * 2
    text = (
        f"{nonce} CapEff\t0000000000000000\n{nonce} NoNewPrivs\t1\n"
        f"{nonce} memory.max\t268435456\n{nonce} pids.max\t64\n{nonce} cpu.max\t50000 100000\n"
        "| gpu-workload: profile=steady base=512MiB alloc_exit: 0 (a job line)\n"
        f"| {nonce} alloc_exit\t0\n"  # the job's line, even with the nonce in it
        f"{nonce} alloc_exit\t1\n{nonce} end\tdone\n"
    )
    seen = preflight.parse_probe_output(text, nonce)
    assert seen.problem == ""
    assert seen.readings == {**HARDENED, "alloc_exit": "1"}
    assert seen.output == (
        "gpu-workload: profile=steady base=512MiB alloc_exit: 0 (a job line)",
        f"{nonce} alloc_exit\t0",
    )


def test_versions_and_branches_are_checked_as_ops_type_them() -> None:
    assert preflight.version_tuple("1.1.5+ds1") == (1, 1, 5)
    assert preflight.version_tuple("v1.17.8") == (1, 17, 8)
    assert preflight.version_tuple("dev") is None
    assert preflight.check_version("1.17.8") == "1.17.8"
    for bad in ("1", "1.17.x", "latest", "1.17.8; rm -rf /"):
        with pytest.raises(ValueError, match="is not a version"):
            preflight.check_version(bad)
    with pytest.raises(ValueError, match="not a driver branch"):
        preflight.check_branch("55")


# --- the isolation list -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(isolation.RESERVED_NAMES))
def test_every_reserved_name_has_a_reason_and_is_refused(name: str) -> None:
    assert isolation.reserved_reason(name)
    with pytest.raises(ValueError, match=f"{name} cannot be set"):
        runtime.check_tenant_env(((name, "1"),))


def test_an_image_may_keep_what_cuda_images_carry_and_nothing_that_switches_isolation() -> None:
    cuda = [
        "PATH=/usr/local/nvidia/bin:/usr/bin",
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470",
        "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    ]
    assert isolation.image_env_problems(cuda) == []
    bad = isolation.image_env_problems(
        [*cuda, "LD_PRELOAD=/x.so", "CUDA_DISABLE_CONTROL=true", "NVIDIA_DISABLE_REQUIRE=1"]
    )
    assert [name for name, _ in bad] == [
        "LD_PRELOAD",
        "CUDA_DISABLE_CONTROL",
        "NVIDIA_DISABLE_REQUIRE",
    ]


def test_a_started_containers_environment_must_hold_the_platforms_values() -> None:
    expected = {"CUDA_DEVICE_MEMORY_LIMIT": "8192m", "LD_PRELOAD": "/lib/q.so"}
    good = ["PATH=/bin", "CUDA_DEVICE_MEMORY_LIMIT=8192m", "LD_PRELOAD=/lib/q.so", "HF_HOME=/d"]
    assert isolation.container_env_problems(good, expected) == []
    assert isolation.container_env_problems(
        ["CUDA_DEVICE_MEMORY_LIMIT=80g", "CUDA_DISABLE_CONTROL=true"], expected
    ) == [
        "CUDA_DEVICE_MEMORY_LIMIT is '80g', not the platform's '8192m'",
        "LD_PRELOAD is missing",
        "CUDA_DISABLE_CONTROL is set (it switches the quota library's VRAM enforcement off)",
    ]


# --- the gate on emulated nodes -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_emulated_node_is_held_by_the_gate_and_released_when_it_passes(worker_fleet):
    fleet = worker_fleet()
    row = fleet.registered[0]
    assert row.gate_status == GateStatus.PASSED
    assert row.preflight["quota"] == {"NVIDIA GeForce RTX 4090": "proven"}
    fleet.nodes[0].state.toolkit_version = "1.17.7"
    node = node_services.node_discover(node_id=row.pk)
    assert node.gate_status == GateStatus.FAILED and "1.17.7" in node.gate_reason
    assert node_services.allocation_reserve(owner_key="slice-1", vram_mb=4096) is None
    incident_services.watch_sweep()
    incident = Incident.objects.get(rule="node_gate_failed")
    assert incident.node_id == node.pk and incident.tenant_id is None
    fleet.nodes[0].state.toolkit_version = "1.19.1"
    node = node_services.node_discover(node_id=row.pk)
    assert node.gate_status == GateStatus.PASSED
    assert node_services.allocation_reserve(owner_key="slice-1", vram_mb=4096) is not None
    incident_services.watch_sweep()
    incident.refresh_from_db()
    assert incident.resolved_at is not None


@pytest.mark.django_db(transaction=True)
def test_without_a_quota_library_a_card_is_sold_whole_until_ops_accept_the_watchdog(
    worker_fleet, api_ops
):
    fleet = worker_fleet([NodeSpec("bare", (GpuSpec("NVIDIA GeForce RTX 4090"),), None)])
    row = fleet.registered[0]
    assert row.gate_status == GateStatus.PASSED
    assert row.preflight["quota"] == {"NVIDIA GeForce RTX 4090": "absent"}
    gpu = Gpu.objects.get(node=row)
    assert gpu.whole_card_only
    assert node_services.allocation_reserve(owner_key="slice-1", vram_mb=8192) is None
    whole = node_services.allocation_reserve(owner_key="slice-2", vram_mb=24576)
    assert whole is not None
    assert node_services.allocation_reserve(owner_key="slice-3", vram_mb=4096) is None
    node_services.allocation_release(allocation=whole)

    refused = api_ops.post(f"/api/v1/nodes/{row.pk}/watchdog-only/", {"accept": True})
    assert refused.status_code == 400 and "reason" in refused.content.decode()
    response = api_ops.post(
        f"/api/v1/nodes/{row.pk}/watchdog-only/",
        {"accept": True, "reason": "batch tenants only; the watchdog stops breaches"},
        format="json",
    )
    assert response.status_code == 200
    assert [g["whole_card_only"] for g in response.json()["gpus"]] == [False]
    assert node_services.allocation_reserve(owner_key="slice-4", vram_mb=8192) is not None
    change = NodePolicyChange.objects.get(node=row, field="watchdog_only")
    assert change.new_value is True and change.changed_by.is_staff


@pytest.mark.django_db(transaction=True)
def test_a_quota_library_that_does_not_enforce_is_found_by_the_probe(worker_fleet):
    fleet = worker_fleet()
    fleet.nodes[0].state.quota_library_enforces = False
    node = node_services.node_discover(node_id=fleet.registered[0].pk)
    assert node.preflight["quota"] == {"NVIDIA GeForce RTX 4090": "ineffective"}
    assert Gpu.objects.get(node=node).whole_card_only
    incident_services.watch_sweep()
    assert Incident.objects.filter(rule="quota_not_effective", node=node).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "name",
    [
        "CUDA_DISABLE_CONTROL",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_OVERSUBSCRIBE",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "NVIDIA_VISIBLE_DEVICES",
        "cuda_disable_control",
    ],
)
def test_a_tenant_setting_an_isolation_variable_gets_a_400_naming_it(
    api_a, owner_a, funded, image_ssh, name
):
    purchase = funded(owner_a)
    response = api_a.post(
        "/api/v1/slices/",
        {
            "purchase": purchase.pk,
            "image": image_ssh.pk,
            "model": SMALL_MODEL,
            "ssh_public_key": SSH_KEY,
            "environment": {name: "true"},
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    body = response.json()
    # refused input is a validation_error, the specific code under the field at fault
    assert body["code"] == "validation_error"
    assert body["fields"]["environment"][0]["code"] == "reserved_variable"
    assert name in body["message"] and "cannot be set" in body["message"]
    assert not Slice.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_allowlisting_inspects_the_image_on_a_node(worker_fleet, api_ops):
    fleet = worker_fleet()
    state = fleet.nodes[0].state
    state.image_env["evil/image:1"] = ["LD_PRELOAD=/x.so"]
    state.image_env["nvidia/cuda:12.4.1-base-ubuntu22.04"] = [
        "NVIDIA_VISIBLE_DEVICES=all",
        "LD_LIBRARY_PATH=/usr/local/nvidia/lib64",
    ]
    refused = api_ops.post(
        "/api/v1/ops/images/",
        {"name": "Evil", "reference": "evil/image:1", "connect": "service"},
        format="json",
    )
    assert refused.status_code == 400
    assert refused.json()["code"] == "validation_error"
    assert refused.json()["fields"]["reference"][0]["code"] == "image_sets_reserved_variable"
    assert "LD_PRELOAD" in refused.json()["message"]
    ok = api_ops.post(
        "/api/v1/ops/images/",
        {"name": "CUDA", "reference": "nvidia/cuda:12.4.1-base-ubuntu22.04", "connect": "service"},
        format="json",
    )
    assert ok.status_code == 201, ok.content
    image = Image.objects.get(name="CUDA")
    assert image.inspected_on == "gpu-a" and image.inspected_at is not None
    # a change of digest is another image: inspected again, and refused when it sets one
    state.image_env["nvidia/cuda:12.4.1-base-ubuntu22.04@sha256:" + "a" * 64] = [
        "CUDA_DISABLE_CONTROL=true"
    ]
    changed = api_ops.patch(
        f"/api/v1/ops/images/{image.pk}/", {"digest": "sha256:" + "a" * 64}, format="json"
    )
    assert changed.status_code == 400 and "CUDA_DISABLE_CONTROL" in changed.json()["message"]
    image.refresh_from_db()
    assert image.digest == ""


@pytest.mark.django_db(transaction=True)
def test_an_image_that_changed_after_allowlisting_is_refused_before_it_starts(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    fleet.nodes[0].state.image_env[image_ssh.reference] = ["LD_PRELOAD=/x.so"]  # re-pushed tag
    s = launch(owner_a, funded(owner_a), image_ssh)
    assert s.state == Slice.State.FAILED
    assert "the image's configuration sets LD_PRELOAD" in s.state_reason
    assert s.allocation.state == "released"
    assert fleet.nodes[0].state.containers == {}  # nothing started


@pytest.mark.django_db(transaction=True)
def test_a_container_whose_effective_environment_lost_the_quota_fails_and_is_released(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    fleet.nodes[0].state.run_env_extra = ["CUDA_DISABLE_CONTROL=true"]
    s = launch(owner_a, funded(owner_a), image_ssh)
    assert s.state == Slice.State.FAILED
    assert "does not hold the platform's isolation" in s.state_reason
    assert "CUDA_DISABLE_CONTROL is set" in s.state_reason
    assert s.allocation.state == "released"
    assert [c.running for c in fleet.nodes[0].state.containers.values()] == []  # removed


@pytest.mark.django_db
def test_the_reserved_list_is_one_list_with_reasons(api_a) -> None:
    page = api_a.get("/api/v1/reserved-environment/").json()
    rows = page["results"]
    assert page["count"] == len(rows)  # one page holds the whole list
    names = {r["name"]: r for r in rows}
    assert names["CUDA_DISABLE_CONTROL"]["reason"].startswith("it switches the quota library")
    assert names["LD_*"]["kind"] == "prefix"
    assert names["LD_LIBRARY_PATH"]["image_may_set"]
    assert names["LD_PRELOAD"]["image_may_set"] == ""


# --- pages ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_ops_edit_the_node_policy_on_its_page_with_a_reason_and_it_is_kept(client, ops_user):
    Image.objects.create(name="Probe", reference="gpuplatform-lab/workload:1", connect="service")
    client.force_login(ops_user)
    page = client.get("/ops/fleet/node-policy/").content.decode()
    assert "1.19.1" in page and "1.1.5+ds1-1+deb12u1" in page
    assert "CUDA_DISABLE_CONTROL" in page  # the reserved list, with its reasons
    form = {
        "min_toolkit_version": "1.20.0",
        "min_runc_version": "1.1.12",
        "driver_branches": "550, 570",
        "known_fixed_builds": "runc 1.1.5+ds1-1+deb12u1 Debian DSA-5615-1",
        "probe_image": "gpuplatform-lab/workload:1",
        "probe_command": "/usr/bin/gpu-workload",
        "probe_environment": "WORKLOAD_MB={alloc_mb}\nWORKLOAD_COOPERATIVE=0",
    }
    missing = client.post("/ops/fleet/node-policy/", form)
    assert missing.status_code == 200 and "This field is required" in missing.content.decode()
    assert selectors.preflight_policy().min_toolkit_version == "1.19.1"
    bad = client.post(
        "/ops/fleet/node-policy/",
        {**form, "probe_environment": "LD_PRELOAD=/x.so", "reason": "try"},
    )
    assert "LD_PRELOAD cannot be set" in bad.content.decode()
    assert not NodePolicyChange.objects.exists()
    saved = client.post("/ops/fleet/node-policy/", {**form, "reason": "NVIDIA bulletin"})
    assert saved.status_code == 302
    policy = selectors.preflight_policy()
    assert policy.min_toolkit_version == "1.20.0" and policy.driver_branches == ["550", "570"]
    fields = set(NodePolicyChange.objects.values_list("field", flat=True))
    # what did not change (the command) is not a change
    assert fields == {"min_toolkit_version", "driver_branches", "known_fixed_builds",
                      "probe_image", "probe_environment"}  # fmt: skip
    history = client.get("/ops/fleet/node-policy/").content.decode()
    assert "NVIDIA bulletin" in history and ops_user.username in history


@pytest.mark.django_db
def test_the_node_policy_is_ops_only(client, owner_a, api_a):
    client.force_login(owner_a.user)
    assert client.get("/ops/fleet/node-policy/").status_code == 302  # to the login
    assert api_a.get("/api/v1/node-policy/").status_code == 403
    assert api_a.patch("/api/v1/node-policy/", {"reason": "x"}, format="json").status_code == 403


@pytest.mark.django_db
def test_the_node_policy_api_needs_a_reason_and_names_a_bad_value(api_ops):
    assert api_ops.get("/api/v1/node-policy/").json()["min_runc_version"] == "1.1.12"
    no_reason = api_ops.patch("/api/v1/node-policy/", {"min_runc_version": "1.2.0"}, format="json")
    assert no_reason.status_code == 400 and "reason" in no_reason.json()["fields"]
    bad = api_ops.patch(
        "/api/v1/node-policy/", {"min_runc_version": "latest", "reason": "x"}, format="json"
    )
    assert bad.status_code == 400 and "min_runc_version" in bad.json()["message"]
    unexplained = api_ops.patch(
        "/api/v1/node-policy/",
        {"known_fixed_builds": [{"component": "runc", "build": "1.1.5", "reason": " "}],
         "reason": "x"},
        format="json",
    )  # fmt: skip
    assert unexplained.status_code == 400
    ok = api_ops.patch(
        "/api/v1/node-policy/", {"min_runc_version": "1.2.0", "reason": "CVE-2025-31133"},
        format="json",
    )  # fmt: skip
    assert ok.status_code == 200 and ok.json()["min_runc_version"] == "1.2.0"
    changes = api_ops.get("/api/v1/node-policy/changes/").json()["results"]
    assert [(c["field"], c["old_value"], c["new_value"], c["reason"]) for c in changes] == [
        ("min_runc_version", "1.1.12", "1.2.0", "CVE-2025-31133")
    ]


@pytest.mark.django_db(transaction=True)
def test_the_node_page_and_fleet_list_show_the_gate(worker_fleet, client, ops_user):
    fleet = worker_fleet([NodeSpec("bare", (GpuSpec("NVIDIA GeForce RTX 4090"),), None)])
    row = fleet.registered[0]
    fleet.nodes[0].state.toolkit_version = "1.17.7"
    node_services.node_discover(node_id=row.pk)
    client.force_login(ops_user)
    page = client.get(f"/ops/nodes/{row.pk}/").content.decode()
    assert "Preflight gate" in page and "failed" in page
    assert "NVIDIA Container Toolkit 1.17.7 (build 1.17.7-1) is older than 1.19.1" in page
    assert "whole only" in page and "Accept watchdog-only" in page
    fleet_page = client.get("/ops/fleet/").content.decode()
    assert "preflight failed" in fleet_page
    accepted = client.post(
        f"/ops/nodes/{row.pk}/watchdog-only/", {"accept": "1", "reason": "batch only"}
    )
    assert accepted.status_code == 302
    assert not Gpu.objects.get(node=row).whole_card_only
    page = client.get(f"/ops/nodes/{row.pk}/").content.decode()
    assert "Watchdog-only enforcement accepted" in page and "batch only" in page


@pytest.mark.django_db(transaction=True)
def test_a_new_card_is_sold_whole_until_its_model_is_proven(worker_fleet):
    fleet = worker_fleet()
    row = fleet.registered[0]
    assert not Gpu.objects.get(node=row).whole_card_only  # proven at registration
    # a verdict for another model (or another library) proves nothing for this card: the
    # discovery marks it whole-only before the preflight runs
    Node.objects.filter(pk=row.pk).update(
        preflight={**row.preflight, "quota_library": "/elsewhere/libvgpu.so"}
    )
    seen = []
    original = node_services.registry.node_preflight  # where node_discover looks it up

    def judged(**kwargs):
        seen.append(Gpu.objects.get(node=row).whole_card_only)
        return original(**kwargs)

    node_services.registry.node_preflight = judged
    try:
        node_services.node_discover(node_id=row.pk)
    finally:
        node_services.registry.node_preflight = original
    assert seen == [True]  # held whole while the probes ran
    assert not Gpu.objects.get(node=row).whole_card_only  # proven again


@pytest.mark.django_db(transaction=True)
def test_a_probe_image_that_sets_a_reserved_variable_is_never_started(worker_fleet, ops_user):
    fleet = worker_fleet()
    state = fleet.nodes[0].state
    state.image_env["bad/probe:1"] = ["LD_PRELOAD=/x.so"]
    # allowlisted before any node could inspect it (the probe image is an allowlisted one)
    Image.objects.create(name="Bad probe", reference="bad/probe:1", connect="service")
    node_services.preflight_policy_update(actor=ops_user, reason="test", probe_image="bad/probe:1")
    node = node_services.node_discover(node_id=fleet.registered[0].pk)
    assert node.gate_status == GateStatus.FAILED
    assert "the image's configuration sets LD_PRELOAD" in node.gate_reason
    assert not [c for c in state.containers.values() if c.image == "bad/probe:1"]


@pytest.mark.django_db(transaction=True)
def test_a_preflight_already_running_on_a_node_is_not_run_twice(worker_fleet):
    fleet = worker_fleet()
    row = fleet.registered[0]
    before = row.gate_checked_at
    other = connections.create_connection("default")
    with other.cursor() as cursor:  # another worker holds this node's preflight
        cursor.execute("SELECT pg_advisory_lock(%s)", [PREFLIGHT_LOCK_SPACE + row.pk])
    try:
        node = node_services.node_discover(node_id=row.pk)
        assert node.gate_checked_at == before  # skipped, nothing overwritten
    finally:
        other.close()
    assert node_services.node_discover(node_id=row.pk).gate_checked_at > before


@pytest.mark.django_db
def test_a_preflight_asked_for_before_the_host_key_is_pinned_is_a_409(api_ops, client, ops_user):
    node = Node.objects.create(name="new", address="10.4.0.1")
    response = api_ops.post(f"/api/v1/nodes/{node.pk}/preflight/")
    assert response.status_code == 409 and response.json()["code"] == "pending_host_key"
    client.force_login(ops_user)
    page = client.post(f"/ops/nodes/{node.pk}/preflight/", follow=True).content.decode()
    assert "Approve the node&#x27;s host key first." in page


@pytest.mark.django_db(transaction=True)
def test_a_quota_library_a_process_configures_from_its_environment_is_an_incident(worker_fleet):
    fleet = worker_fleet()
    fleet.nodes[0].state.quota_library_config = QUOTA_FROM_ENVIRONMENT
    node = node_services.node_discover(node_id=fleet.registered[0].pk)
    assert node.preflight["quota"] == {"NVIDIA GeForce RTX 4090": "environment"}
    incident_services.watch_sweep()
    [incident] = Incident.objects.filter(rule="quota_not_effective", node=node)
    assert "lifted its own quota from inside" in incident.evidence["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("item", ["$(id)", "`id`", "x$(cat /etc/shadow)"])
def test_the_probe_command_refuses_shell_syntax_like_every_other_command(api_ops, item):
    """One rule for every argv the platform runs without a shell."""
    before = list(selectors.preflight_policy().probe_command)
    response = api_ops.patch(
        "/api/v1/node-policy/",
        {"probe_command": ["/usr/bin/gpu-workload", item], "reason": "try"},
        format="json",
    )
    assert response.status_code == 400, response.content
    [error] = response.json()["fields"]["probe_command"]
    assert "without a shell" in error["message"]
    assert selectors.preflight_policy().probe_command == before
    assert not NodePolicyChange.objects.exists()


@pytest.mark.django_db
def test_a_fleet_wide_policy_change_is_documented_with_a_null_node(api_ops):
    from drf_spectacular.generators import SchemaGenerator  # noqa: PLC0415 - schema only here

    changed = api_ops.patch(
        "/api/v1/node-policy/", {"require_userns_remap": True, "reason": "fleet"}, format="json"
    )
    assert changed.status_code == 200, changed.content
    [row] = api_ops.get("/api/v1/node-policy/changes/").json()["results"]
    assert row["node"] is None
    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert schema["components"]["schemas"]["NodePolicyChange"]["properties"]["node"]["nullable"]
