"""Concurrency on PostgreSQL: parallel launches never over-allocate a GPU nor leave an
allocation without its slice, and parallel purchases never overdraw a balance or charge
twice. Real threads, each on its own database connection, released together by a
barrier; provisioning is never dispatched (no node is needed to prove placement)."""

from __future__ import annotations

import importlib
import itertools
import threading
import time
from collections import Counter
from decimal import Decimal

import pytest
from django.apps import apps
from django.db import connection, transaction
from django.db.models import Sum

from gpuplatform.errors import Conflict
from nodes import services as node_services
from nodes.models import Allocation, Gpu, Node
from tenants import selectors, services, tasks
from tenants.models import LedgerEntry, Purchase, Slice, Tenant, Tier, Volume
from tests.conftest import SMALL_MODEL, SSH_KEY
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

GPU_MB = 24576
LIVE = (Slice.State.PROVISIONING, Slice.State.RUNNING, Slice.State.STOPPING)


@pytest.fixture
def tiers(db):
    """The seeded tiers (a transactional test's flush empties them)."""
    if not Tier.objects.exists():
        importlib.import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)
    return {t.vram_mb // 1024: t for t in Tier.objects.all()}


@pytest.fixture
def dispatched(monkeypatch):
    """Record every task the services dispatch instead of sending it to a broker."""
    seen: list[tuple[str, tuple]] = []
    lock = threading.Lock()

    def recorder(name):
        def record(*args, **kwargs):
            with lock:
                seen.append((name, args))

        return record

    for task in (
        tasks.provision_slice,
        tasks.stop_slice,
        tasks.remove_container,
        tasks.dispatch_queue,
        tasks.reconcile,
    ):
        monkeypatch.setattr(task, "delay_on_commit", recorder(task.name))
        monkeypatch.setattr(task, "delay", recorder(task.name))
    return seen


@pytest.fixture
def gpus(db):
    """Make `count` 24 GB GPUs on one active node (no emulator: placement only)."""

    def make(count: int = 3) -> list[Gpu]:
        node = Node.objects.create(
            gate_status="passed",
            name="race-node",
            address="10.9.9.9",
            port=22,
            host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIracehostkey",
            status=Node.Status.ACTIVE,
        )
        return [
            Gpu.objects.create(
                node=node,
                uuid=f"GPU-race-{i:04d}",
                index=i,
                model="NVIDIA GeForce RTX 4090",
                vram_total_mb=GPU_MB,
            )
            for i in range(count)
        ]

    return make


@pytest.fixture
def ops(db):
    return UserFactory(email="ops-race@platform.test", is_staff=True)


@pytest.fixture
def buyers(db, ops, tiers):
    """make(tenants, credit): that many tenants (owner memberships), each granted credit."""

    def make(tenants: int = 4, credit: str = "500.00"):
        members = [
            MembershipFactory(tenant__name=f"Race Lab {i}", user__email=f"race{i}@lab.test")
            for i in range(tenants)
        ]
        for m in members:
            services.credit_grant(tenant=m.tenant, amount=credit, actor=ops, memo="race credit")
        return members

    return make


def buy(membership, tier: Tier, hours: int = 1) -> Purchase:
    purchase, _ = services.purchase_create(membership=membership, tier=tier, hours=hours)
    return purchase


def race(n: int, fn):
    """Run fn(i) on n threads released together; return [(ok, value or exception)]."""
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = (True, fn(i))
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            results[i] = (False, exc)
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a racing thread hung (deadlock?)"
    return results


def unexpected(results, *codes: str) -> list:
    """Failures other than a Conflict with one of `codes` (an IntegrityError, a 500...)."""
    return [
        repr(value)
        for ok, value in results
        if not ok and not (isinstance(value, Conflict) and value.code in codes)
    ]


@pytest.fixture
def launch(image_ssh):
    def start(membership, purchase, key: str = ""):
        return services.slice_launch(
            membership=membership,
            purchase=purchase,
            image=image_ssh,
            model_request=SMALL_MODEL,
            ssh_public_key=SSH_KEY,
            idempotency_key=key,
        )

    return start


def assert_gpus_within_capacity() -> dict[int, int]:
    """No GPU over-allocated and each counter equals its live sum; live MiB per GPU."""
    live_by_gpu: dict[int, int] = {}
    for gpu in Gpu.objects.all():
        live = (
            Allocation.objects.filter(gpu=gpu)
            .exclude(state=Allocation.State.RELEASED)
            .aggregate(t=Sum("vram_mb"))["t"]
            or 0
        )
        assert live <= gpu.vram_total_mb, f"GPU {gpu.index} over-allocated: {live} MiB"
        assert gpu.allocated_mb == live, f"GPU {gpu.index} counter {gpu.allocated_mb} != {live}"
        live_by_gpu[gpu.pk] = live
    return live_by_gpu


def assert_placement_invariants() -> dict[int, int]:
    """The GPUs are within capacity, every live allocation belongs to exactly one live
    slice of its size and every live slice holds its own. Returns the live MiB per GPU."""
    live_by_gpu = assert_gpus_within_capacity()
    slices = {s.owner_key: s for s in Slice.objects.all()}
    live_allocs = list(Allocation.objects.exclude(state=Allocation.State.RELEASED))
    for alloc in live_allocs:
        owner = slices.get(alloc.owner_key)
        assert owner is not None, f"orphan allocation {alloc}"
        assert owner.state in LIVE, f"{alloc} held by a {owner.state} slice"
        assert owner.allocation_id == alloc.pk, f"{alloc} is not its slice's allocation"
        assert alloc.vram_mb == owner.vram_mb
    for s in slices.values():
        if s.state in LIVE:
            assert s.allocation is not None and s.allocation.state != "released", s
            assert s.allocation.owner_key == s.owner_key, "a slice holds another's allocation"
        elif s.allocation_id is not None:
            assert s.allocation.state == Allocation.State.RELEASED, (s.pk, s.state)
    held = [s.allocation_id for s in slices.values() if s.allocation_id]
    assert len(held) == len(set(held)), "two slices share one allocation"
    per_purchase = Counter(s.purchase_id for s in slices.values() if s.state in LIVE)
    assert max(per_purchase.values(), default=0) <= 1, "two live slices on one purchase"
    return live_by_gpu


# --- launches -----------------------------------------------------------------------------------


def test_parallel_reservations_never_overallocate_a_gpu(gpus):
    """The placement core without the launch around it: 24 reservations of 8 GB, each
    holding its GPU row lock a moment as a launch does while it records its slice."""
    gpus(3)

    def reserve(i: int):
        with transaction.atomic():
            allocation = node_services.allocation_reserve(owner_key=f"race-{i}", vram_mb=8192)
            time.sleep(0.02)
            return allocation

    results = race(24, reserve)

    assert unexpected(results) == []
    placed = [value for _, value in results if value is not None]
    assert len(placed) == 9  # 3 x 24 GB hold exactly nine 8 GB slices, and no fewer
    live = assert_gpus_within_capacity()
    assert sorted(live.values()) == [GPU_MB] * 3
    assert sorted(a.owner_key for a in placed) == sorted(
        Allocation.objects.values_list("owner_key", flat=True)
    )


def test_parallel_launches_fill_capacity_exactly_and_queue_the_rest(
    gpus, buyers, tiers, dispatched, launch
):
    gpus(3)  # 3 x 24 GB: room for exactly nine 8 GB slices
    members = buyers(tenants=4)
    jobs = [(m, buy(m, tiers[8])) for m in itertools.islice(itertools.cycle(members), 24)]

    results = race(24, lambda i: launch(*jobs[i]))

    assert unexpected(results) == []
    states = Counter(Slice.objects.values_list("state", flat=True))
    assert states == {Slice.State.PROVISIONING: 9, Slice.State.QUEUED: 15}
    live = assert_placement_invariants()
    assert sorted(live.values()) == [GPU_MB] * 3
    provisioned = sorted(args[0] for name, args in dispatched if name == "provision.slice")
    placed = sorted(
        Slice.objects.filter(state=Slice.State.PROVISIONING).values_list("pk", flat=True)
    )
    assert provisioned == placed  # provisioning queued once per placed slice, after commit
    queued = Slice.objects.filter(state=Slice.State.QUEUED)
    assert sorted(selectors.queue_position(s) for s in queued) == list(range(1, 16))


def test_parallel_launches_of_mixed_sizes_never_overallocate(
    gpus, buyers, tiers, dispatched, launch
):
    gpus(3)
    members = buyers(tenants=4)
    sizes = [4, 8, 12, 24] * 7  # 28 launches, 336 GB asked of 72 GB
    jobs = [(members[i % 4], buy(members[i % 4], tiers[gb])) for i, gb in enumerate(sizes)]

    results = race(len(jobs), lambda i: launch(*jobs[i]))

    assert unexpected(results) == []
    live = assert_placement_invariants()
    # Work-conserving: a launch queues only when no GPU has room for it. 4 GB slices
    # were turned away, so every card must be full to the last MiB.
    room = max(GPU_MB - used for used in live.values())
    for s in Slice.objects.filter(state=Slice.State.QUEUED):
        assert s.vram_mb > room, f"a {s.vram_mb} MiB slice queued beside {room} MiB free"
    # Which launches win the race varies; when even a 4 GB slice was turned away, every
    # card must be full to the last MiB (more launches than room always queue some).
    assert Slice.objects.filter(state=Slice.State.QUEUED).exists()
    if Slice.objects.filter(state=Slice.State.QUEUED, vram_mb=4096).exists():
        assert sum(live.values()) == 3 * GPU_MB


def test_placement_racing_release_on_one_gpu_keeps_the_counter_exact(
    gpus, buyers, tiers, dispatched, launch, monkeypatch
):
    monkeypatch.setattr(node_services, "container_remove", lambda **kw: True)
    gpus(1)  # one 24 GB card, full with three 8 GB slices
    members = buyers(tenants=3)
    running = [launch(m, buy(m, tiers[8]))[0] for m in members]
    assert {s.state for s in running} == {Slice.State.PROVISIONING}
    newcomers = [(members[i % 3], buy(members[i % 3], tiers[8])) for i in range(12)]

    def act(i: int):
        if i < 3:  # the tenant stops, the stop task removes and releases
            s = services.slice_stop(slice=running[i], actor=members[i].user)
            return services.slice_finish_stop(slice_id=s.pk)
        if i < 5:  # the queue dispatcher, as beat and every release run it
            return services.slices_dispatch_queue()
        return launch(*newcomers[i - 5])

    results = race(3 + 2 + 12, act)

    assert unexpected(results) == []
    for s in running:
        s.refresh_from_db()
        assert s.state == Slice.State.STOPPED
        assert s.allocation.state == Allocation.State.RELEASED
    assert_placement_invariants()
    services.slices_dispatch_queue()  # what the release's after-commit dispatch does
    live = assert_placement_invariants()
    assert live == {Gpu.objects.get().pk: GPU_MB}  # freed room was filled again, no more
    assert Slice.objects.filter(state=Slice.State.PROVISIONING).count() == 3
    assert Slice.objects.filter(state=Slice.State.QUEUED).count() == 9


# --- purchases ----------------------------------------------------------------------------------


def _ledger_agrees(tenant: Tenant) -> None:
    tenant.refresh_from_db()
    entries = list(LedgerEntry.objects.filter(tenant=tenant).order_by("pk"))
    assert tenant.credit_balance == sum(e.amount for e in entries)
    running = Decimal("0")
    for e in entries:
        running += e.amount
        assert e.balance_after == running >= 0, "a ledger entry overdrew or skipped one"


def test_parallel_purchases_never_overdraw_the_balance(buyers, tiers):
    (member,) = buyers(tenants=1, credit="10.00")
    tier = tiers[8]
    price = tier.price_per_hour * 10  # 3.80 for ten hours of 8 GB
    assert price == Decimal("3.80")

    results = race(12, lambda i: services.purchase_create(membership=member, tier=tier, hours=10))

    assert unexpected(results, "insufficient_credit") == []
    bought = [value[0] for ok, value in results if ok]
    assert len(bought) == 2  # floor(10.00 / 3.80)
    assert all(value.code == "insufficient_credit" for ok, value in results if not ok)
    member.tenant.refresh_from_db()
    assert member.tenant.credit_balance == Decimal("10.00") - 2 * price
    _ledger_agrees(member.tenant)
    debits = LedgerEntry.objects.filter(tenant=member.tenant, kind=LedgerEntry.Kind.PURCHASE)
    assert sorted(debits.values_list("purchase_id", flat=True)) == sorted(p.pk for p in bought)
    assert Purchase.objects.filter(tenant=member.tenant).count() == 2


def test_parallel_purchases_with_one_idempotency_key_charge_once(buyers, tiers):
    (member,) = buyers(tenants=1, credit="10.00")

    results = race(
        12,
        lambda i: services.purchase_create(
            membership=member, tier=tiers[8], hours=10, idempotency_key="buy-8gb-once"
        ),
    )

    assert unexpected(results) == []
    assert len({value[0].pk for _, value in results}) == 1  # everyone sees the one purchase
    assert sum(1 for _, value in results if value[1]) == 1  # and one of them created it
    assert Purchase.objects.filter(tenant=member.tenant).count() == 1
    debits = LedgerEntry.objects.filter(tenant=member.tenant, kind=LedgerEntry.Kind.PURCHASE)
    assert debits.count() == 1
    member.tenant.refresh_from_db()
    assert member.tenant.credit_balance == Decimal("6.20")
    _ledger_agrees(member.tenant)


# --- launches on one purchase -------------------------------------------------------------------


def test_parallel_launches_with_one_idempotency_key_make_one_slice(
    gpus, buyers, tiers, dispatched, launch
):
    gpus(3)
    (member,) = buyers(tenants=1)
    purchase = buy(member, tiers[8])

    results = race(12, lambda i: launch(member, purchase, key="launch-once"))

    assert unexpected(results) == [], "a retry with the same key must get the first slice"
    assert Slice.objects.count() == 1
    assert {value[0].pk for _, value in results} == {Slice.objects.get().pk}
    assert sum(1 for _, value in results if value[1]) == 1
    assert [name for name, _ in dispatched] == ["provision.slice"]
    live = assert_placement_invariants()
    assert sum(live.values()) == 8192


def test_parallel_launches_on_one_purchase_run_one_slice(gpus, buyers, tiers, dispatched, launch):
    gpus(3)
    (member,) = buyers(tenants=1)
    purchase = buy(member, tiers[8])

    results = race(12, lambda i: launch(member, purchase, key=f"launch-{i}"))

    assert unexpected(results, "purchase_in_use") == []
    winners = [value[0] for ok, value in results if ok]
    assert len(winners) == 1
    assert sum(1 for ok, _ in results if not ok) == 11
    assert Slice.objects.filter(purchase=purchase, state__in=LIVE).count() == 1
    assert Slice.objects.count() == 1  # losers recorded nothing
    live = assert_placement_invariants()
    assert sum(live.values()) == 8192
    assert Allocation.objects.count() == 1


def test_a_launch_with_a_volume_and_that_volumes_delete_never_both_succeed(
    gpus, buyers, tiers, dispatched, image_ssh
):
    """Issue 33, S11: before, both went through in 8 of 11 rounds, and the node then ran
    `--mount` of a volume the platform had deleted (Docker makes an empty one)."""
    (gpu,) = gpus(1)
    (member,) = buyers(tenants=1)
    for round_ in range(11):
        volume = Volume.objects.create(
            tenant=member.tenant,
            node=gpu.node,
            name=f"race-{round_}",
            size_gb=1,
            docker_name=f"gpp-vol-race-{round_}",
            state=Volume.State.READY,
        )
        purchase = buy(member, tiers[8])

        def act(i: int, volume=volume, purchase=purchase):
            if i == 0:
                return services.volume_delete(membership=member, volume=volume, confirm=volume.name)
            return services.slice_launch(
                membership=member,
                purchase=purchase,
                image=image_ssh,
                model_request=SMALL_MODEL,
                ssh_public_key=SSH_KEY,
                volumes=[{"volume": volume.pk, "path": "/data"}],
            )

        results = race(2, act)
        refused = {"volume_in_use", "volume_not_ready", "does_not_exist"}
        odd = [v for ok, v in results if not ok and getattr(v, "code", None) not in refused]
        assert odd == []
        deleted, launched = results[0][0], results[1][0]
        assert deleted != launched, f"round {round_}: delete {results[0]}, launch {results[1]}"
        volume.refresh_from_db()
        mounting = Slice.objects.filter(mounts__volume=volume, state__in=LIVE)
        if deleted:
            assert volume.state == Volume.State.DELETING and not mounting.exists()
        else:
            assert volume.state == Volume.State.READY and mounting.count() == 1
            services.slice_stop(slice=mounting.get(), actor=member.user)
