"""Row locks of the nodes app: every `SELECT ... FOR UPDATE` on its rows, and the
preflight's advisory lock, are taken here, so the order they are taken in is written once.

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

from .models import Allocation, Gpu, Node, NodePolicy


def node_policy_lock() -> NodePolicy:
    """The one policy row (it exists: `services.node_policy()` makes it)."""
    return NodePolicy.objects.select_for_update().get(pk=1)


def node_lock(pk: int) -> Node:
    return Node.objects.select_for_update().get(pk=pk)


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
