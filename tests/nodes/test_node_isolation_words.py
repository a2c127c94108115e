"""The node page says what holds each card's slices to their VRAM: MIG's hardware
partitions, the node's quota library (proven for the card's model by preflight, or not
yet), or neither; one line when every card has the same, else one per card."""

import re

import pytest

from nodes.isolation import card_isolation
from nodes.models import Gpu, Node

pytestmark = pytest.mark.django_db


def _node(**kw) -> Node:
    return Node.objects.create(
        name="rack-1", address="10.0.0.1", status="active", gate_status="passed", **kw
    )


def _card(node: Node, index: int, model: str, **kw) -> Gpu:
    return Gpu.objects.create(
        node=node, uuid=f"GPU-{index}", index=index, model=model, vram_total_mb=81920, **kw
    )


def _isolation(client, node: Node) -> str:
    page = client.get(f"/ops/nodes/{node.pk}/").content.decode()
    return re.search(r'<td id="node-isolation">(.*?)</td>', page, re.S).group(1)


def test_a_node_with_mig_and_a_quota_library_says_what_each_card_has(client, ops_user):
    node = _node(
        capabilities={"docker": True, "nvidia_runtime": True, "mig": True,
                      "vram_quota_library": "hami-core"},
        preflight={"quota": {"NVIDIA L4": "proven"}},
    )  # fmt: skip
    mig = [{"uuid": f"MIG-{n}", "profile": "1g.10gb", "memory_total_mb": 9984} for n in range(7)]
    _card(node, 0, "NVIDIA A100-SXM4-80GB", mig_capable=True, mig_enabled=True, mig_devices=mig)
    _card(node, 1, "NVIDIA L4")
    client.force_login(ops_user)
    shown = _isolation(client, node)
    assert "no hardware" not in shown.lower()
    assert "<strong>GPU 0</strong>: MIG: hardware partitions (7 instances)" in shown
    assert "<strong>GPU 1</strong>: quota library hami-core, proven for NVIDIA L4" in shown
    page = client.get(f"/ops/nodes/{node.pk}/").content.decode()
    assert '<span class="badge">quota library hami-core</span>' in page


def test_cards_alike_get_one_line_and_an_unproven_card_is_said_to_be_sold_whole(client, ops_user):
    node = _node(capabilities={"vram_quota_library": "hami-core"}, preflight={"quota": {}})
    _card(node, 0, "NVIDIA H100", whole_card_only=True)
    _card(node, 1, "NVIDIA H100", whole_card_only=True)
    client.force_login(ops_user)
    shown = _isolation(client, node)
    assert shown.count("<div") == 1 and 'data-cards="every card"' in shown
    assert "quota library hami-core, not proven for NVIDIA H100 yet: sold whole" in shown


@pytest.mark.parametrize(
    ("card", "words"),
    [
        ({"mig_enabled": True, "mig_instances": 1}, "MIG: hardware partitions (1 instance)"),
        ({"quota_library": ""}, "no MIG, no quota library: sold whole, one slice per card"),
        (
            {"quota_library": "", "whole_card_only": False, "watchdog_only": True},
            "no MIG, no quota library: the node agent and the watchdog alone",
        ),
        (
            {"whole_card_only": False, "watchdog_only": True, "proven_models": []},
            "not proven for L4: the node agent and the watchdog hold slices",
        ),
    ],
    ids=["mig", "nothing", "watchdog-only", "library-unproven-watchdog-only"],
)
def test_card_isolation_names_the_strongest_layer(card, words):
    values = {
        "mig_enabled": False,
        "mig_instances": 0,
        "model": "L4",
        "whole_card_only": True,
        "quota_library": "hami-core",
        "proven_models": ["L4"],
        "watchdog_only": False,
        **card,
    }
    assert words in card_isolation(**values)
