"""Idempotency means the same request (issue 33, S12): a key replayed with any difference
in its body is 409 `idempotency_conflict` on every endpoint that takes a key, and nothing
is charged, reserved or made; resume and volume creation are safely retryable with one."""

import pytest

from tenants.models import LedgerEntry, Purchase, Slice, Volume
from tests.conftest import SMALL_MODEL, SSH_KEY
from tests.tenants.ssh_material import public_line

pytestmark = pytest.mark.django_db(transaction=True)


def post(api, path, body, key):
    return api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_purchase_replayed_with_interruptible_changed_is_a_conflict(api_a, owner_a, funded):
    funded(owner_a, vram_gb=8, hours=1)  # credit, and the tiers
    tier = Purchase.objects.get(tenant=owner_a.tenant).tier
    body = {"tier": tier.pk, "hours": 1}
    assert post(api_a, "/api/v1/purchases/", body, "p-1").status_code == 201
    assert post(api_a, "/api/v1/purchases/", body, "p-1").status_code == 200
    changed = post(api_a, "/api/v1/purchases/", {**body, "interruptible": True}, "p-1")
    assert changed.status_code == 409 and changed.json()["code"] == "idempotency_conflict"
    assert Purchase.objects.filter(tenant=owner_a.tenant).count() == 2  # funded's and p-1


def test_a_grant_replayed_with_another_memo_is_a_conflict(api_ops, owner_a):
    body = {"tenant": owner_a.tenant_id, "amount": "5.00", "memo": "welcome"}
    assert post(api_ops, "/api/v1/ops/credit-grants/", body, "g-1").status_code == 201
    changed = post(api_ops, "/api/v1/ops/credit-grants/", {**body, "memo": "other"}, "g-1")
    assert changed.status_code == 409 and changed.json()["code"] == "idempotency_conflict"
    assert LedgerEntry.objects.filter(tenant=owner_a.tenant).count() == 1


@pytest.mark.parametrize(
    "change",
    [
        {"guaranteed": False},
        {"ssh_public_key": public_line()},
        {"model": {**SMALL_MODEL, "context_tokens": 1024}},
    ],
    ids=["guaranteed", "ssh_public_key", "model"],
)
def test_a_launch_replayed_with_any_field_changed_is_a_conflict(
    change, api_a, owner_a, funded, image_ssh
):
    purchase = funded(owner_a, vram_gb=8, hours=1)
    body = {
        "purchase": purchase.pk,
        "image": image_ssh.pk,
        "model": SMALL_MODEL,
        "ssh_public_key": SSH_KEY,
    }
    first = post(api_a, "/api/v1/slices/", body, "l-1")
    assert first.status_code == 201, first.content
    assert post(api_a, "/api/v1/slices/", body, "l-1").json()["id"] == first.json()["id"]
    changed = post(api_a, "/api/v1/slices/", {**body, **change}, "l-1")
    assert changed.status_code == 409, changed.content
    assert changed.json()["code"] == "idempotency_conflict"
    assert Slice.objects.filter(tenant=owner_a.tenant).count() == 1


def test_a_volume_create_is_retryable_with_its_key(api_a, owner_a, eager, worker_fleet):
    worker_fleet()
    body = {"name": "ckpt", "size_gb": 10}
    first = post(api_a, "/api/v1/volumes/", body, "v-1")
    again = post(api_a, "/api/v1/volumes/", body, "v-1")
    assert first.status_code == 201 and again.status_code == 200, again.content
    assert first.json()["id"] == again.json()["id"]
    bigger = post(api_a, "/api/v1/volumes/", {**body, "size_gb": 20}, "v-1")
    assert bigger.status_code == 409 and bigger.json()["code"] == "idempotency_conflict"
    assert Volume.objects.filter(tenant=owner_a.tenant).count() == 1


def test_a_resume_is_retryable_with_its_key(api_a, owner_a, funded, image_ssh, eager, worker_fleet):
    worker_fleet()
    first = funded(owner_a, vram_gb=8, hours=1)
    body = {"purchase": first.pk, "image": image_ssh.pk, "model": SMALL_MODEL,
            "ssh_public_key": SSH_KEY}  # fmt: skip
    made = api_a.post("/api/v1/slices/", body, format="json")
    assert made.status_code == 201, made.content
    slice_id = made.json()["id"]
    assert api_a.post(f"/api/v1/slices/{slice_id}/stop/", {}, format="json").status_code == 202
    second = funded(owner_a, vram_gb=8, hours=1)
    third = funded(owner_a, vram_gb=8, hours=1)
    resumed = post(api_a, f"/api/v1/slices/{slice_id}/resume/", {"purchase": second.pk}, "r-1")
    assert resumed.status_code == 202, resumed.content
    retried = post(api_a, f"/api/v1/slices/{slice_id}/resume/", {"purchase": second.pk}, "r-1")
    assert retried.status_code == 202, retried.content  # not "only a stopped slice..."
    assert Slice.objects.get(pk=slice_id).runs == 2
    other = post(api_a, f"/api/v1/slices/{slice_id}/resume/", {"purchase": third.pk}, "r-1")
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    assert Slice.objects.get(pk=slice_id).purchase_id == second.pk
