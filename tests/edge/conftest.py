"""The edge's tests: a slice running as provisioning leaves it, declaring one port, with no
node behind it (the tests that need a container use the lab)."""

from __future__ import annotations

import pytest

from nodes.models import Gpu
from tests.incidents.support import placeable_node, running_slice

PORT = 8888


@pytest.fixture
def slice_(owner_a, funded):
    node = placeable_node("n1", "10.0.0.1")
    Gpu.objects.create(node=node, uuid="GPU-1", index=0, model="A30", vram_total_mb=24576)
    s = running_slice(owner_a, None)
    s.image_entry.ports = [PORT]
    s.image_entry.save()
    return s
