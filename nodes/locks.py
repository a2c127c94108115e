"""Row locks of the nodes app: every `SELECT ... FOR UPDATE` on its rows, and the
advisory locks of preflights and telemetry batches, are taken here, so the order they are
taken in is written once.

A transaction that needs several takes them in this order (the order of this module):

    node policy -> node -> allocation -> GPU

(discovery: the node, then its GPUs; a telemetry batch updates its nodes' rows first,
then inserts samples that reference their GPUs, then counts allocations before GPUs, as
a release locks them.) Placement holds at most one GPU lock at a time, taken in
`services.allocations` by one statement (`FOR UPDATE ... SKIP LOCKED`, the hot path of
every launch) or by `gpus_lock`; a GPU it does not keep is unlocked by rolling back its
savepoint, so no reservation waits while holding another. `tenants` and `incidents`
take their own rows before any of these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from django.db import connection, models

from .models import Allocation, Gpu, Node, NodeAgent, NodePolicy


def node_policy_lock() -> NodePolicy:
    """The one policy row (it exists: `selectors.preflight_policy()` makes it)."""
    return NodePolicy.objects.select_for_update().get(pk=1)


def node_lock(pk: int) -> Node:
    return Node.objects.select_for_update().get(pk=pk)


def node_agent_lock(node_id: int) -> NodeAgent:
    """A node's agent row (after the node's, never with a GPU's: it is its own)."""
    return NodeAgent.objects.select_for_update().get(node_id=node_id)


def allocation_lock(pk: int) -> Allocation:
    return Allocation.objects.select_for_update().get(pk=pk)


def gpu_lock(pk: int) -> Gpu:
    return Gpu.objects.select_for_update().get(pk=pk)


def gpus_lock_by_uuid(uuids: Iterable[str]) -> dict[str, Gpu]:
    """The GPUs with these UUIDs, wherever they are in the fleet (a GPU moved from another
    node keeps its history), by UUID."""
    return {g.uuid: g for g in Gpu.objects.select_for_update().filter(uuid__in=list(uuids))}


def gpus_lock(gpus: models.QuerySet[Gpu], *, skip_locked: bool = False) -> models.QuerySet[Gpu]:
    """Placement's GPU rows (with their node, which is not locked): `skip_locked` passes
    over a row another launch holds instead of waiting for it."""
    return gpus.select_related("node").select_for_update(of=("self",), skip_locked=skip_locked)


PREFLIGHT_LOCK_SPACE = 0x6770_0000_0000  # advisory-lock keys of preflights: this + node id


@contextlib.contextmanager
def preflight_claim(node_id: int) -> Iterator[bool]:
    """One preflight per node at a time (discoveries, the daily run, a policy change and
    "run now" can overlap): a PostgreSQL advisory lock held by this session, not a row
    lock, so nothing else waits on it. Yields whether this caller has it; elsewhere
    (SQLite, one process) always claimed."""
    if connection.vendor != "postgresql":
        yield True
        return
    key = PREFLIGHT_LOCK_SPACE + node_id
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        claimed = bool(cursor.fetchone()[0])
    try:
        yield claimed
    finally:
        if claimed:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


SAMPLING_LOCK_SPACE = 0x6771_0000_0000  # advisory-lock keys of telemetry batches: this + node id


@contextlib.contextmanager
def sampling_claim(node_ids: list[int]) -> Iterator[list[int]]:
    """The nodes of a telemetry batch that no other session is sampling now, in one
    statement: an advisory lock per node, held by this session until the batch is stored
    and freed with its connection if the worker dies. Taken before any row lock and never
    waited for (a node another task holds is left to it). Elsewhere (SQLite, one process)
    every node."""
    if connection.vendor != "postgresql" or not node_ids:
        yield list(node_ids)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM unnest(%s::bigint[]) AS id WHERE pg_try_advisory_lock(%s + id)",
            [list(node_ids), SAMPLING_LOCK_SPACE],
        )
        claimed = [row[0] for row in cursor.fetchall()]
    try:
        yield claimed
    finally:
        if claimed:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_unlock(%s + id) FROM unnest(%s::bigint[]) AS id",
                    [SAMPLING_LOCK_SPACE, claimed],
                )
