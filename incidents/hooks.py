"""What incidents hangs on other apps' hooks (registered in IncidentsConfig.ready): the
watchdog on each batch of samples nodes stores, and the ledger on what node agents report."""

from __future__ import annotations

from nodes.hooks import SampleBatch
from nodes.models import AgentEntry, Node, NodeAgent

from .services import batch_watch
from .services.agent_reports import agent_entries_file


def watchdog_sample_hook(batch: SampleBatch) -> dict[str, int]:
    """nodes' sample hook (called with the batch): the watchdog's per-batch rules, in the
    telemetry worker right after the batch commits."""
    return batch_watch(batch=batch)


def agent_report_hook(node: Node, agent: NodeAgent, entries: list[AgentEntry]) -> dict[str, int]:
    """nodes' agent hook: what a node agent reported (a stop, a harm, a stray, its own
    health), filed in the worker that pulled it, right after the entries commit."""
    return agent_entries_file(node=node, agent=agent, entries=entries)
