"""Where detection rules plug in: called after each batch of samples is stored.

`nodes` knows nothing of incidents; the incidents app registers its rules here (in its
AppConfig.ready). A hook gets the batch and must not raise: a failing hook is logged
and never loses the samples, which are already committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .models import AgentEntry, Node, NodeAgent
    from .telemetry import NodeSample


class GpuSampleRow(NamedTuple):
    """One stored GpuSample (field names are its columns)."""

    gpu_id: int
    taken_at: datetime
    memory_used_mb: int
    memory_total_mb: int
    utilization_gpu: int | None
    utilization_memory: int | None
    temperature_c: int | None
    power_w: float | None


class ProcessSampleRow(NamedTuple):
    """One stored ProcessSample (field names are its columns)."""

    gpu_id: int
    taken_at: datetime
    pid: int
    used_memory_mb: int
    container_id: str
    sm_utilization: int | None
    memory_utilization: int | None


logger = logging.getLogger(__name__)


@dataclass
class SampleBatch:
    """What one ingest stored: per node the parsed sample, and the rows written."""

    nodes: list[Node]
    samples: dict[int, NodeSample]  # node id -> parsed sample (with Xid events etc.)
    gpu_samples: list[GpuSampleRow] = field(default_factory=list)
    process_samples: list[ProcessSampleRow] = field(default_factory=list)
    gpu_uuids: dict[int, str] = field(default_factory=dict)  # GPU id -> its UUID
    # container id -> MiB its node's quota library counts it as holding (where kept)
    quota_usage: dict[str, int] = field(default_factory=dict)


# what a hook returns is not read (the watchdog's counts are for benches and tests)
SampleHook = Callable[[SampleBatch], object]
_hooks: list[SampleHook] = []


def register_sample_hook(hook: SampleHook) -> SampleHook:
    if hook not in _hooks:
        _hooks.append(hook)
    return hook


def unregister_sample_hook(hook: SampleHook) -> None:
    if hook in _hooks:
        _hooks.remove(hook)


def run_sample_hooks(batch: SampleBatch) -> None:
    for hook in list(_hooks):
        try:
            hook(batch)
        except Exception:
            logger.exception("sample hook %r failed", hook)


# What the node agents report (nodes.services.agent), after the entries commit: the agent's
# row (its health) and the journal entries new to the platform. incidents registers here.
AgentHook = Callable[["Node", "NodeAgent", "list[AgentEntry]"], object]
_agent_hooks: list[AgentHook] = []


def register_agent_hook(hook: AgentHook) -> AgentHook:
    if hook not in _agent_hooks:
        _agent_hooks.append(hook)
    return hook


def run_agent_hooks(node: Node, agent: NodeAgent, entries: list[AgentEntry]) -> bool:
    """True when every hook took the entries (they are then marked filed)."""
    ok = True
    for hook in list(_agent_hooks):
        try:
            hook(node, agent, entries)
        except Exception:
            logger.exception("agent hook %r failed", hook)
            ok = False
    return ok
