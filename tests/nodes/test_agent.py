"""The node agent's rules and its journal without a node (the lab tests run it on one),
the platform's verdict on a report, and the agent on an emulated node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from nodes import agent, agent_client
from nodes.agent import Containers, Enforcer, Journal, harm_on_card, load_config, over_quota
from nodes.models import AgentState, Gpu, NodeAgent

CID_A, CID_B, CID_C = "a" * 64, "b" * 64, "c" * 64


def test_over_quota_needs_more_than_the_margin():
    assert not over_quota(8192 + 512, 8192, 512)
    assert over_quota(8192 + 513, 8192, 512)


def test_a_neighbour_is_harmed_only_while_another_is_over_its_own_quota():
    # b holds 20,000 MiB of an 8,192 quota; a has 7,192 unused and 3,000 free on the card
    held = {CID_A: (8192, 1000), CID_B: (8192, 20000)}
    assert harm_on_card(held, 3000) == {CID_A: {"short_mb": 4192, "offenders": [CID_B]}}
    # enough free for a's unused quota: no harm, whoever is over
    assert harm_on_card(held, 7192) == {}
    # a job out of memory inside its own quota, nobody over: not harm, however little free
    assert harm_on_card({CID_A: (8192, 1000), CID_C: (8192, 8000)}, 0) == {}
    # the offender is never harmed by itself
    assert CID_B not in harm_on_card(held, 0)
    # over by no more than a CUDA context (the margin) is not an offender
    assert harm_on_card({CID_A: (8192, 1000), CID_B: (8192, 8500)}, 0, 512) == {}
    # what is missing counts no more than the offenders hold past their quotas
    assert harm_on_card({CID_A: (8192, 1000), CID_B: (8192, 9000)}, 0)[CID_A]["short_mb"] == 808


def test_the_config_is_clamped_to_at_least_one_reading_a_second(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"interval_s": 30, "confirm_readings": 0}))
    config = load_config(str(tmp_path))
    assert config["interval_s"] == 1.0 and config["confirm_readings"] == 1
    (tmp_path / "config.json").write_text("not json")
    assert load_config(str(tmp_path)) == {**agent.DEFAULTS}


def test_the_journal_numbers_entries_across_restarts_and_reads_after_a_cursor(tmp_path):
    j = Journal(str(tmp_path))
    j.append("start", version="1")
    j.append("kill", container_id=CID_A)
    again = Journal(str(tmp_path))  # a restart: the same journal, numbering goes on
    assert again.id == j.id
    assert again.append("harm")["seq"] == 3
    assert [e["kind"] for e in again.read_since(1)] == ["kill", "harm"]


class FakeContainers(Containers):
    def __init__(self, quotas: dict[str, int]):
        super().__init__()
        self.quota = quotas

    def refresh(self) -> None:  # docker is not asked: the quotas are given
        pass


def enforcer(tmp_path, monkeypatch, quotas, killed):
    monkeypatch.setattr(agent, "cgroup_of", lambda pid: ({1: CID_A, 2: CID_B}[pid], None))
    monkeypatch.setattr(agent, "start_time", lambda pid: "1")
    monkeypatch.setattr(
        agent, "kill_container", lambda cid, cg: killed.append(cid) or ("docker kill", "")
    )
    config = {**agent.DEFAULTS}
    return Enforcer(Journal(str(tmp_path)), config, FakeContainers(quotas))


def card(free_mb: int, mig: bool = False) -> list[dict]:
    return [
        {"uuid": "GPU-1", "gpu_uuid": "GPU-1", "mig": mig, "total_mb": 24576, "free_mb": free_mb}
    ]


def procs(a_mb: int, b_mb: int) -> list[dict]:
    return [
        {"pid": 1, "device": "GPU-1", "used_mb": a_mb},
        {"pid": 2, "device": "GPU-1", "used_mb": b_mb},
    ]


def test_a_breach_is_acted_on_at_the_second_reading_and_the_harm_ends_with_it(
    tmp_path, monkeypatch
):
    killed: list[str] = []
    e = enforcer(tmp_path, monkeypatch, {CID_A: 8192, CID_B: 8192}, killed)
    e.tick(card(3576), procs(1000, 20000), 100.0)
    assert killed == []  # one reading is not a breach yet
    e.tick(card(3576), procs(1000, 20000), 100.5)
    assert killed == [CID_B]
    e.tick(card(23576), procs(1000, 0), 101.0)
    e.tick(card(23576), procs(1000, 0), 103.0)  # gone for 2 s: the harm has ended
    entries = e.journal.read_since(0)
    kill = next(x for x in entries if x["kind"] == "kill")
    assert kill["container_id"] == CID_B and kill["used_mb"] == 20000
    assert kill["breach_to_kill_ms"] >= 0 and len(kill["readings"]) == 2
    harms = [x for x in entries if x["kind"] == "harm"]
    assert harms[0]["ended_at"] is None and harms[-1]["ended_at"] is not None
    assert harms[-1]["container_id"] == CID_A and harms[-1]["short_mb"] == 7192 - 3576
    assert harms[-1]["offenders"] == [CID_B]


def test_one_reading_over_is_not_a_breach_but_a_job_that_pulses_past_it_is(tmp_path, monkeypatch):
    killed: list[str] = []
    e = enforcer(tmp_path, monkeypatch, {CID_A: 8192, CID_B: 8192}, killed)
    for t, used in ((0.0, 9000), (0.5, 8000), (1.0, 8000), (1.5, 8000), (2.0, 8000)):
        e.tick(card(10000), procs(0, used), t)
    assert killed == []  # a spike, then back inside for good
    # over on every other reading: never two in a row, caught all the same
    for t, used in ((3.0, 16000), (3.5, 8000), (4.0, 16000)):
        e.tick(card(10000), procs(0, used), t)
    assert killed == [CID_B]


def test_a_mig_instance_is_its_slices_whatever_the_tier(tmp_path, monkeypatch):
    killed: list[str] = []
    e = enforcer(tmp_path, monkeypatch, {CID_A: 8192, CID_B: 8192}, killed)
    mig = [{"uuid": "MIG-1", "gpu_uuid": "GPU-1", "mig": True, "total_mb": 9728, "free_mb": 0}]
    for t in (0.0, 0.5, 1.0):
        e.tick(mig, [{"pid": 2, "device": "MIG-1", "used_mb": 9728}], t)
    assert killed == []
    e.tick(mig, [{"pid": 2, "device": "MIG-1", "used_mb": 10300}], 2.0)
    e.tick(mig, [{"pid": 2, "device": "MIG-1", "used_mb": 10300}], 2.5)
    assert killed == [CID_B]


def test_a_process_in_no_platform_container_is_reported_once_and_left_alone(tmp_path, monkeypatch):
    killed: list[str] = []
    e = enforcer(tmp_path, monkeypatch, {CID_A: 8192}, killed)  # B is not the platform's
    for t in (0.0, 0.5, 1.0):
        e.tick(card(10000), procs(1000, 5000), t)
    strays = [x for x in e.journal.read_since(0) if x["kind"] == "stray"]
    assert len(strays) == 1 and strays[0]["pid"] == 2 and strays[0]["action"] == "reported"
    assert killed == []


def test_with_the_stray_policy_on_only_a_container_that_is_not_the_platforms_is_ended(
    tmp_path, monkeypatch
):
    killed: list[str] = []
    e = enforcer(tmp_path, monkeypatch, {CID_A: 8192}, killed)
    e.config["kill_strays"] = True
    e.containers.managed = {CID_A, CID_B}  # B: the platform's, started before the label
    e.tick(card(10000), procs(1000, 5000), 0.0)
    assert killed == []
    e.containers.managed = {CID_A}  # B: someone else's container
    e.strays.clear()
    e.tick(card(10000), procs(1000, 5000), 0.5)
    assert killed == [CID_B]


def report(error: str = "", error_since=None, **over):
    now = time.time()
    doc = {
        "schema": 1,
        "now": now,
        "installed_version": agent.VERSION,
        "status": {
            "version": agent.VERSION,
            "pid": 5,
            "last_loop_at": now - 0.5,
            "error": error,
            "error_since": now - 1 if error_since == "now" else None,
        },
        "alive": True,
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize(
    ("over", "state", "says"),
    [
        ({}, agent_client.OK, ""),
        ({"installed_version": ""}, agent_client.ABSENT, "not installed"),
        ({"installed_version": "0.9.0"}, agent_client.OLD, "0.9.0"),
        ({"alive": False}, agent_client.SILENT, "not running"),
        ({"status": None}, agent_client.SILENT, "not running"),
        (
            {"status": {"version": agent.VERSION, "pid": 5, "last_loop_at": 0, "error": ""}},
            agent_client.SILENT,
            "last reading",
        ),
        ({"error": "NVMLError: GPU is lost"}, agent_client.SILENT, "cannot read the GPUs"),
        ({"error": "NVMLError: GPU is lost", "error_since": "now"}, agent_client.OK, ""),
        ({"failed": "exit 127: python3: not found"}, agent_client.SILENT, "python3"),
    ],
)
def test_the_platforms_verdict_on_a_report(over, state, says):
    verdict = agent_client.agent_verdict(report(**over))
    assert verdict.state == state and says in verdict.reason


def test_report_on_a_node_with_no_agent_says_so(tmp_path):
    """The agent's own `report`, as the platform runs it (the source on stdin)."""
    run = subprocess.run(
        [sys.executable, *agent_client.agent_argv("report", "--since", "0")[1:]],
        input=agent_client.agent_preamble(),
        capture_output=True,
        env={**os.environ, "GPUPLATFORM_AGENT_DIR": str(tmp_path / "none")},
        timeout=30,
        check=True,
    )
    doc = json.loads(run.stdout)
    assert doc["installed_version"] == "" and doc["entries"] == [] and doc["status"] is None
    assert agent_client.agent_verdict(doc).state == agent_client.ABSENT


@pytest.mark.django_db(transaction=True)
def test_discovery_installs_the_agent_on_an_emulated_node_and_a_stopped_one_blocks_it(
    worker_fleet, client, ops_user
):
    from nodes import services as node_services  # noqa: PLC0415 - the Django side

    fleet = worker_fleet()
    emu, node = fleet.nodes[0], fleet.registered[0]
    row = NodeAgent.objects.get(node=node)
    assert (row.state, row.version) == (AgentState.OK, agent.VERSION)
    assert Gpu.objects.filter(node=node).taking_placements().exists()
    emu.state.agent.running = False
    row = node_services.node_agent_check(node_id=node.pk, repair=False)
    assert row.state == AgentState.SILENT
    assert not Gpu.objects.filter(node=node).taking_placements().exists()
    client.force_login(ops_user)
    page = client.get(f"/ops/nodes/{node.pk}/").content.decode()
    assert "Node agent" in page and "not answering" in page
    assert "no new slices are placed here until it runs again" in page
    node_services.node_agent_check(node_id=node.pk)  # installs it again
    assert node_services.node_agent_check(node_id=node.pk, repair=False).state == AgentState.OK
