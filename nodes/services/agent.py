"""The node agent from the platform's side: installed and upgraded over the SSH the
platform already holds, its journal pulled (`report --since N`), and what that says of
the node. A node whose agent is absent, old or not answering takes no new slices
(placement reads NodeAgent.state); the platform then installs it again. What the journal
reports goes to the agent hooks (incidents files the incidents) after commit.

The agent itself is nodes/agent.py; docs/isolation.md says what it enforces and how fast.
"""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .. import agent, agent_client, ssh
from ..hooks import run_agent_hooks
from ..locks import node_agent_lock
from ..models import AgentEntry, AgentState, Node, NodeAgent

logger = logging.getLogger(__name__)


def _config(row: NodeAgent) -> dict[str, Any]:
    """What the agent on this node is told: the platform's settings and ops' stray policy."""
    return {
        "interval_s": settings.NODE_AGENT_INTERVAL_S,
        "confirm_readings": settings.NODE_AGENT_CONFIRM_READINGS,
        "margin_mb": settings.NODE_AGENT_MARGIN_MB,
        "kill_strays": row.kill_strays,
    }


def _report(pool: ssh.SSHPool, node: Node, since: int) -> dict[str, Any]:
    result = pool.run(
        ssh.endpoint_for(node),
        agent_client.agent_argv("report", "--since", str(since)),
        stdin=agent_client.agent_preamble(),
        timeout=agent_client.REPORT_TIMEOUT_S,
    )
    # The node answered but its report did not come (no python3, a broken install):
    # the agent is as good as silent, and the node takes no placements until it runs.
    said = result.stderr[-300:].decode(errors="replace").strip()
    try:
        doc = json.loads(result.stdout) if result.ok else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != agent.SCHEMA:
        reason = f"The node agent's report failed (exit {result.exit_status}): {said}"
        return {"schema": agent.SCHEMA, "failed": reason[:500]}
    return doc


def node_agent_install(*, node_id: int, pool: ssh.SSHPool | None = None) -> NodeAgent:
    """Install (or upgrade, or restart) the agent with this platform's version and config."""
    node = Node.objects.get(pk=node_id)
    row, _ = NodeAgent.objects.get_or_create(node=node)
    pool = pool or ssh.get_pool()
    result = pool.run(
        ssh.endpoint_for(node),
        agent_client.agent_argv("install", "--config", json.dumps(_config(row))),
        stdin=agent_client.agent_preamble(),
        timeout=agent_client.INSTALL_TIMEOUT_S,
    )
    row.installed_at = timezone.now()
    if not result.ok:
        said = (result.stderr or result.stdout)[-400:].decode(errors="replace")
        row.reason = f"Installing the agent failed: {said}"
    row.save(update_fields=["installed_at", "reason"])
    return row


def node_agent_check(
    *, node_id: int, pool: ssh.SSHPool | None = None, repair: bool = True
) -> NodeAgent:
    """Pull the journal, judge the agent, hand new entries to the hooks; install it again
    when it is absent, old or silent (the next check judges the new one)."""
    node = Node.objects.get(pk=node_id)
    row, _ = NodeAgent.objects.get_or_create(node=node)
    pool = pool or ssh.get_pool()
    report = _report(pool, node, row.cursor)
    if report.get("journal_id") and report["journal_id"] != row.journal_id and row.cursor:
        report = _report(pool, node, 0)  # a new journal (the node was rebuilt): from its start
    verdict = agent_client.agent_verdict(report)
    before = row.state
    row, entries = _store(node, report, verdict)
    entries += _unfiled(node, entries)
    if entries or verdict.state != AgentState.OK or before != verdict.state:
        transaction.on_commit(lambda: _file(node, row, entries))
    broken = verdict.state in (AgentState.ABSENT, AgentState.OLD, AgentState.SILENT)
    if repair and broken and not _installed_lately(row):
        node_agent_install(node_id=node.pk, pool=pool)
    if report.get("more"):
        return node_agent_check(node_id=node_id, pool=pool, repair=False)
    return row


def _file(node: Node, row: NodeAgent, entries: list[AgentEntry]) -> None:
    if run_agent_hooks(node, row, entries) and entries:
        AgentEntry.objects.filter(pk__in=[e.pk for e in entries]).update(filed_at=timezone.now())


def _unfiled(node: Node, fresh: list[AgentEntry]) -> list[AgentEntry]:
    """Entries a hook failed on before (a bug, the database away), offered again once they
    are older than one pull; the hooks are safe to run twice."""
    before = timezone.now() - timedelta(seconds=settings.NODE_AGENT_PULL_INTERVAL * 2)
    return list(
        AgentEntry.objects.filter(node=node, filed_at__isnull=True, received_at__lt=before)
        .exclude(pk__in=[e.pk for e in fresh])
        .order_by("seq")[:100]
    )


def _installed_lately(row: NodeAgent) -> bool:
    """An install that has not taken yet is not repeated every pull: a node that cannot
    run the agent (no python3, a full disk) is tried again after REINSTALL_AFTER_S."""
    if row.installed_at is None or (row.healthy_at and row.healthy_at > row.installed_at):
        return False  # never installed, or the last install ran: this is a new failure
    return (timezone.now() - row.installed_at).total_seconds() < agent_client.REINSTALL_AFTER_S


@transaction.atomic
def _store(
    node: Node, report: dict[str, Any], verdict: agent_client.Verdict
) -> tuple[NodeAgent, list[AgentEntry]]:
    # The agent's row is locked, so no other check of this node stores entries meanwhile:
    # what is not stored yet is new, and is stored here once.
    row = node_agent_lock(node.pk)
    journal = str(report.get("journal_id") or "")
    now = timezone.now()
    given = [
        e
        for e in report.get("entries") or []
        if isinstance(e, dict) and isinstance(e.get("seq"), int) and journal
    ]
    known = set(
        AgentEntry.objects.filter(
            node=node, journal_id=journal, seq__in=[e["seq"] for e in given]
        ).values_list("seq", flat=True)
    )
    new = AgentEntry.objects.bulk_create(
        [_entry(node, journal, e) for e in given if e["seq"] not in known]
    )
    if given:
        row.cursor = max(e["seq"] for e in given)
    if journal:
        row.journal_id = journal
    row.state, row.reason = verdict.state, verdict.reason
    row.version = verdict.version or row.version
    row.checked_at = now
    if verdict.state == AgentState.OK:
        row.healthy_at = now
    row.save()
    return row, new


def _entry(node: Node, journal: str, e: dict[str, Any]) -> AgentEntry:
    at = timezone.now()
    if isinstance(e.get("at"), str):
        with contextlib.suppress(ValueError):
            at = datetime.fromisoformat(e["at"])
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return AgentEntry(
        node=node,
        journal_id=journal,
        seq=e["seq"],
        kind=str(e.get("kind", ""))[:16],
        at=at,
        container_id=str(e.get("container_id") or "")[:128],
        payload=e,
    )
