"""What the node agents report, into the ledger (nodes' agent hook, after the entries
commit; nodes/agent.py writes them on the node):

- a container the agent stopped: its slice's `quota_breach` incident with the agent's
  readings as evidence, and the slice moved on (stopped, VRAM released, metering ended);
- a harm: a NeighbourHarm row (start, end, most missing) and an incident for the harmed
  slice in plain words, naming no other tenant; its evidence links ops to the offender's;
- a process on a card in no platform container, the agent's own death or blindness, and
  a node whose agent is absent, old or silent: ops' incidents (agent_down resolves when
  the agent runs again).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from nodes.models import AgentEntry, AgentState, Gpu, Node, NodeAgent
from tenants.models import Slice

from .. import rules
from ..locks import harm_lock_or_create
from ..models import Incident, NeighbourHarm
from .watchdog import findings_apply

logger = logging.getLogger(__name__)


def agent_entries_file(*, node: Node, agent: NodeAgent, entries: list[AgentEntry]) -> dict:
    """File what one check of a node's agent found. Safe to run twice: harms are keyed by
    the agent's id, incidents by rule and target, a stopped slice is not stopped again."""
    now = timezone.now()
    stops, harms = _split(entries)
    first = _findings(node, stops) + _health_findings(node, agent)
    counts = findings_apply(findings=first, now=now)
    # then the harms, whose evidence points ops at the offenders' incidents filed above;
    # what ended in this batch was opened in it too: open first, then resolve
    findings = _findings(node, harms)
    for part in (
        findings_apply(findings=[f for f in findings if not f.resolves], now=now),
        findings_apply(findings=[f for f in findings if f.resolves], now=now),
    ):
        counts = {k: counts[k] + part[k] for k in counts}
    return counts


def _findings(node: Node, entries: list[AgentEntry]) -> list[rules.Finding]:
    out: list[rules.Finding] = []
    for entry in entries:
        try:
            out += _entry_findings(node, entry)
        except Exception:  # one odd entry must not cost the others their incident
            logger.exception("agent entry %s of node %s could not be filed", entry.seq, node.pk)
    return out


def _split(entries: list[AgentEntry]) -> tuple[list[AgentEntry], list[AgentEntry]]:
    """(everything but harms, each harm's newest entry): a harm is reported when it
    begins, while it lasts and when it ends, and its newest entry says all the others did."""
    latest: dict[str, AgentEntry] = {}
    others: list[AgentEntry] = []
    for entry in entries:
        if entry.kind == AgentEntry.Kind.HARM:
            latest[str(entry.payload.get("harm_id"))] = entry
        else:
            others.append(entry)
    return others, sorted(latest.values(), key=lambda e: e.seq)


def _entry_findings(node: Node, entry: AgentEntry) -> list[rules.Finding]:
    e = entry.payload
    if entry.kind == AgentEntry.Kind.KILL:
        return _kill_findings(node, e)
    if entry.kind == AgentEntry.Kind.HARM:
        return _harm_findings(node, e)
    if entry.kind == AgentEntry.Kind.STRAY:
        return [_stray_finding(node, e)]
    if entry.kind == AgentEntry.Kind.START:
        return _harms_close(node, entry)
    if entry.kind in (AgentEntry.Kind.EXIT, AgentEntry.Kind.ERROR):
        what = (
            f"exited with code {e.get('code')} and was restarted"
            if entry.kind == AgentEntry.Kind.EXIT
            else f"could not read the GPUs: {e.get('error')}"
        )
        return [
            rules.Finding(
                rule="agent_failed",
                target=f"node:{node.pk}",
                severity=rules.WARNING,
                root_cause=rules.RECLAIM_FAILURE,
                title=f"The node agent on {node.name} {what}"[:200],
                detail="While it is down nothing on the node holds slices to their quotas "
                "within a second; the 30 s watchdog still does.",
                node_id=node.pk,
                evidence={"agent_entry": e},
            )
        ]
    return []


def _harms_close(node: Node, entry: AgentEntry) -> list[rules.Finding]:
    """The agent restarted: harms it had open ended with the loop that saw them (it keeps
    them in memory; if the harm goes on, the new loop opens a new one)."""
    out = []
    for harm in NeighbourHarm.objects.filter(node=node, ended_at__isnull=True):
        harm.ended_at = max(entry.at, harm.started_at)
        harm.save(update_fields=["ended_at"])
        out.append(_harm_cleared(node, harm))
    return out


def _slice_of(container_id: str) -> Slice | None:
    if not container_id:
        return None
    return Slice.objects.filter(container_id=container_id).order_by("-pk").first()


def _gpu_id(node: Node, device_uuid: str | None) -> int | None:
    if not device_uuid:
        return None
    for pk, uuid, migs in Gpu.objects.filter(node=node).values_list("pk", "uuid", "mig_devices"):
        # the GPU, or the GPU that holds this MIG device (read here: SQLite has no JSON
        # containment, and a node has a handful of GPUs)
        if uuid == device_uuid or any(m.get("uuid") == device_uuid for m in migs or []):
            return pk
    return None


def _kill_findings(node: Node, e: dict[str, Any]) -> list[rules.Finding]:
    s = _slice_of(str(e.get("container_id") or ""))
    if s is None:
        return []  # not a slice of this platform's (a probe, or one already gone)
    ms = e.get("breach_to_kill_ms")
    readings = e.get("readings") or []
    return [
        rules.Finding(
            rule="quota_breach",
            target=f"slice:{s.pk}",
            severity=rules.CRITICAL,
            root_cause=rules.NO_ISOLATION,
            title=f"Slice {s.pk} over its VRAM quota",
            detail=(
                f"The node agent read {e.get('used_mb')} MiB held by its processes against a "
                f"{e.get('quota_mb')} MiB quota on {len(readings)} readings in a row and "
                f"stopped its container on the node {ms} ms after the first. Its neighbours "
                "were not touched."
            ),
            gpu_id=_gpu_id(node, e.get("gpu_uuid")),
            node_id=node.pk,
            slice_id=s.pk,
            tenant_id=s.tenant_id,
            action=rules.STOP_SLICE,
            evidence={
                "source": "node_agent",
                "used_mb": e.get("used_mb"),
                "quota_mb": e.get("quota_mb"),
                "margin_mb": e.get("margin_mb"),
                "readings": readings,
                "crossed_at": e.get("crossed_at"),
                "killed_at": e.get("killed_at"),
                "breach_to_kill_ms": ms,
                "method": e.get("method"),
                "kill_error": e.get("error") or "",
                "container_id": s.container_id,
                "condition_since": e.get("crossed_at"),
            },
        )
    ]


def _when(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


def _harm_findings(node: Node, e: dict[str, Any]) -> list[rules.Finding]:
    harmed = _slice_of(str(e.get("container_id") or ""))
    started, ended = _when(e.get("started_at")), _when(e.get("ended_at"))
    if harmed is None or started is None:
        return []
    offenders = [s for c in e.get("offenders") or [] if (s := _slice_of(str(c)))]
    harm, known = _harm_store(node, e, harmed, offenders, started, ended)
    if known:
        return []  # its end was filed already: a report read twice files nothing again
    seconds = (ended - started).total_seconds() if ended else None
    span = f" for {rules.duration(seconds)}" if seconds is not None else ""
    finding = rules.Finding(
        rule="neighbour_harm",
        target=f"harm:{node.pk}:{harm.harm_id}",
        severity=rules.WARNING,
        root_cause=rules.NO_ISOLATION,
        # the tenant reads notify.TENANT_ADVICE's words for the rule beside this title
        title=f"Slice {harmed.pk} was short of its VRAM{span}",
        detail=f"Up to {harm.short_mb} MiB of its unused quota was missing from the card.",
        gpu_id=harm.gpu_id,
        node_id=node.pk,
        slice_id=harmed.pk,
        tenant_id=harmed.tenant_id,
        evidence={
            "source": "node_agent",
            "harm_id": harm.harm_id,
            "short_mb": harm.short_mb,
            "started_at": e.get("started_at"),
            "ended_at": e.get("ended_at"),
            "seconds": seconds,
            # for ops: who caused it, and their incidents (never shown to the harmed tenant)
            "offender_slices": [s.pk for s in offenders],
            "offender_incidents": harm.offender_incidents,
            "condition_since": e.get("started_at"),
        },
    )
    return [finding, _harm_cleared(node, harm)] if ended is not None else [finding]


def _harm_cleared(node: Node, harm: NeighbourHarm) -> rules.Finding:
    """The harm is over: its incident resolves, saying after how long."""
    return rules.Finding(
        rule="neighbour_harm",
        target=f"harm:{node.pk}:{harm.harm_id}",
        severity=rules.WARNING,
        root_cause=rules.NO_ISOLATION,
        title=f"the slice had its whole quota again after {rules.duration(harm.duration_s or 0)}",
        resolves=True,
    )


def _offender_incidents(slice_ids: list[int], began: datetime) -> list[int]:
    """The offenders' incidents about this harm: filed from its start on (an older breach
    of the same slice, resumed since, is another story)."""
    return list(
        Incident.objects.filter(
            slice_id__in=slice_ids,
            rule__in=("quota_breach", "accounting_drift"),
            last_seen_at__gte=began - timedelta(minutes=1),
        )
        .order_by("-first_seen_at")
        .values_list("pk", flat=True)[:5]
    )


@transaction.atomic
def _harm_store(
    node: Node,
    e: dict[str, Any],
    harmed: Slice,
    offenders: list[Slice],
    started: datetime,
    ended: datetime | None,
) -> tuple[NeighbourHarm, bool]:
    """The harm as this report says it, and whether its end was recorded before."""
    harm = harm_lock_or_create(
        node_id=node.pk,
        harm_id=str(e.get("harm_id"))[:64],
        defaults={
            "slice": harmed,
            "container_id": harmed.container_id,
            "short_mb": 0,
            "started_at": started,
            "gpu_id": _gpu_id(node, e.get("device_uuid")),
        },
    )
    if harm.ended_at is not None:
        return harm, True
    harm.short_mb = max(harm.short_mb, int(e.get("short_mb") or 0))
    harm.quota_mb = int(e.get("quota_mb") or 0)
    harm.offender_containers = sorted(set(harm.offender_containers) | set(e.get("offenders", [])))
    harm.offender_slices = sorted({*harm.offender_slices, *(s.pk for s in offenders)})
    # read again at every report: the offender's incident is filed when its stop is
    harm.offender_incidents = _offender_incidents(harm.offender_slices, harm.started_at)
    if ended is not None:
        harm.ended_at = max(ended, harm.started_at)
    harm.save()
    return harm, False


def _stray_finding(node: Node, e: dict[str, Any]) -> rules.Finding:
    what = f"container {str(e['container_id'])[:12]}" if e.get("container_id") else "the host"
    return rules.Finding(
        rule="stray_process",
        target=f"stray:{node.pk}:{e.get('pid')}",
        severity=rules.WARNING,
        root_cause=rules.RECLAIM_FAILURE,
        title=f"A process in no platform slice holds GPU memory on {node.name}"[:200],
        detail=(
            f"PID {e.get('pid')} ({e.get('name') or 'unknown'}) in {what} holds "
            f"{e.get('used_mb')} MiB; the node agent {e.get('action', 'reported it')}. Ops' "
            "policy for the node says whether such processes are ended."
        ),
        node_id=node.pk,
        gpu_id=_gpu_id(node, e.get("device_uuid")),
        evidence={"agent_entry": e},
    )


def _health_findings(node: Node, agent: NodeAgent) -> list[rules.Finding]:
    finding = rules.Finding(
        rule="agent_down",
        target=f"node:{node.pk}",
        severity=rules.CRITICAL,
        root_cause=rules.RECLAIM_FAILURE,
        title=f"The node agent on {node.name} is {agent.get_state_display()}",
        detail=(
            f"{agent.reason} The node takes no new slices until its agent runs again; the "
            "platform installs it again meanwhile."
        ),
        node_id=node.pk,
        evidence={"state": agent.state, "reason": agent.reason, "version": agent.version},
    )
    if agent.state in (AgentState.ABSENT, AgentState.OLD, AgentState.SILENT):
        # a node the platform never saw running an agent is being set up, not failing
        return [finding] if agent.healthy_at is not None else []
    if agent.state == AgentState.OK:
        return [replace(finding, title="the node agent runs again", resolves=True)]
    return []
