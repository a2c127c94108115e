"""What the SSH gateway's relay runs on a node (nsenter from util-linux, python3) as
preflight facts: the pure judgement, then the gate against emulated nodes that lack them
(the lab reads them from the real host: tests/nodes/test_lab_preflight.py)."""

from __future__ import annotations

import pytest

from emulator.catalog import GpuSpec, NodeSpec
from nodes import preflight
from nodes import services as node_services
from nodes.models import GateStatus, Node
from tests.factories import UserFactory

RELAY_OK = {"relay_nsenter": "nsenter from util-linux 2.38.1", "relay_python3": "Python 3.11.2"}


def relay_judge(facts: dict, *, required: bool = True):
    return preflight.evaluate(
        facts={"toolkit_version": "1.19.1", "runc_version": "1.1.12", **facts},
        driver_version="550.54.15",
        policy=preflight.Policy(),
        runs=[],
        software_models=[],
        quota_library="",
        relay_required=required,
    )


def checks(gate):
    return {c.name: c for c in gate.checks}


def test_the_probes_are_fixed_argv_lists_of_the_relays_programs() -> None:
    assert set(preflight.RELAY_FACT_KEYS) <= set(preflight.ALL_FACT_KEYS)
    assert preflight.RELAY_PROBES["relay_nsenter"] == ("nsenter", "--version")
    assert preflight.RELAY_PROBES["relay_python3"] == ("python3", "--version")
    assert all(isinstance(argv, tuple) for argv in preflight.RELAY_PROBES.values())


@pytest.mark.parametrize(
    ("key", "status", "output", "fact"),
    [
        ("relay_nsenter", 0, b"nsenter from util-linux 2.38.1\n", "nsenter from util-linux 2.38.1"),
        ("relay_python3", 0, b"Python 3.11.2\n", "Python 3.11.2"),
        ("relay_nsenter", 127, b"bash: nsenter: command not found\n", ""),
        ("relay_python3", 127, b"bash: line 1: python3: command not found\n", ""),
        ("relay_python3", 0, b"Python 2.7.18\n", ""),  # not a python3
        ("relay_nsenter", 0, b"something else entirely\n", ""),
    ],
)
def test_a_relay_fact_is_the_programs_own_version_line(key, status, output, fact) -> None:
    assert preflight.relay_reading(key, status, output) == fact


def test_a_gateway_node_without_nsenter_fails_naming_the_package() -> None:
    gate = relay_judge({**RELAY_OK, "relay_nsenter": ""})
    assert not gate.passed
    relay = checks(gate)["relay"]
    assert not relay.ok and relay.blocks
    assert "it lacks nsenter (Debian's util-linux package): install it" in gate.reason


def test_a_gateway_node_without_python3_fails_naming_it() -> None:
    gate = relay_judge({**RELAY_OK, "relay_python3": ""})
    assert not gate.passed and "python3 (Debian's python3 package)" in gate.reason


def test_a_python3_older_than_the_relay_needs_fails() -> None:
    gate = relay_judge({**RELAY_OK, "relay_python3": "Python 3.6.9"})
    assert not gate.passed and "Python 3.6.9 is older than the relay needs (3.8)" in gate.reason


def test_a_gateway_node_with_both_passes_and_says_what_it_has() -> None:
    gate = relay_judge(RELAY_OK)
    relay = checks(gate)["relay"]
    assert relay.ok and "util-linux 2.38.1" in relay.detail and "Python 3.11.2" in relay.detail


def test_a_direct_node_does_not_need_the_relay() -> None:
    gate = relay_judge({}, required=False)
    assert "relay" not in checks(gate)


# --- on emulated nodes ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_emulated_node_answers_the_probes_as_its_host_would(worker_fleet):
    fleet = worker_fleet()
    row = fleet.registered[0]
    assert row.access == Node.Access.GATEWAY
    assert row.gate_status == GateStatus.PASSED, row.gate_reason
    facts = row.preflight["facts"]
    assert facts["relay_nsenter"] == "nsenter from util-linux 2.37.2"
    assert facts["relay_python3"] == "Python 3.10.12"
    assert set(facts) == set(preflight.ALL_FACT_KEYS)
    assert any(c["name"] == "relay" and c["ok"] for c in row.preflight["checks"])
    result = fleet.nodes[0].execute("nsenter --version")
    assert result.status == 0 and result.stdout == b"nsenter from util-linux 2.37.2\n"


@pytest.mark.django_db(transaction=True)
def test_a_gateway_node_lacking_nsenter_fails_the_gate_and_the_page_says_why(
    worker_fleet, client, django_user_model
):
    fleet = worker_fleet(
        [
            NodeSpec("gw", (GpuSpec("NVIDIA GeForce RTX 4090"),)),
            NodeSpec("dr", (GpuSpec("NVIDIA GeForce RTX 4090"),)),
        ]
    )
    gateway, direct = fleet.registered
    node_services.node_update(node=direct, access="direct")
    for emu in fleet.nodes:
        emu.set_missing_tools(["nsenter"])
    result = fleet.nodes[0].execute("nsenter --version")
    assert result.status == 127 and b"command not found" in result.stderr
    gateway = node_services.node_discover(node_id=gateway.pk)
    direct = node_services.node_discover(node_id=direct.pk)
    assert gateway.gate_status == GateStatus.FAILED
    assert "nsenter (Debian's util-linux package)" in gateway.gate_reason
    assert gateway.preflight["facts"]["relay_nsenter"] == ""
    assert direct.gate_status == GateStatus.PASSED, direct.gate_reason  # not needed there
    assert direct.preflight["facts"]["relay_nsenter"] == ""

    ops = UserFactory(username="ops-relay", is_staff=True)  # with the two-factor staff need
    client.force_login(ops)
    page = client.get(f"/ops/nodes/{gateway.pk}/").content.decode()
    assert 'id="relay-facts"' in page and "not found (util-linux)" in page
    assert "Python 3.10.12" in page

    fleet.nodes[0].set_missing_tools([])
    assert node_services.node_discover(node_id=gateway.pk).gate_status == GateStatus.PASSED
