"""The dashboard's slice list: live slices first (whatever their age), then those that
ended, refused launches last, newest first within each; only the tenant's own."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tenants import selectors, services
from tenants.models import Slice, Tier

pytestmark = pytest.mark.django_db

# (state, minutes ago): a refused launch is the newest, a queued one the oldest
ROWS = [
    ("refused", 1),
    ("stopped", 5),
    ("provisioning", 30),
    ("completed", 60),
    ("refused", 90),
    ("queued", 600),
    ("failed", 700),
]


def make_slices(membership, ops_user) -> dict[tuple[str, int], Slice]:
    services.credit_grant(tenant=membership.tenant, amount="500", actor=ops_user, memo="t")
    tier = Tier.objects.get(vram_mb=4096)
    now = timezone.now()
    made = {}
    for state, ago in ROWS:
        # a purchase each: a purchase holds one live slice at a time
        purchase, _ = services.purchase_create(membership=membership, tier=tier, hours=1)
        made[(state, ago)] = Slice.objects.create(
            tenant=membership.tenant, purchase=purchase, image="img", vram_mb=4096, state=state
        )
        Slice.objects.filter(pk=made[(state, ago)].pk).update(
            created_at=now - timedelta(minutes=ago)
        )
    return made


def test_dashboard_lists_live_slices_first_then_ended_then_refused(owner_a, owner_b, ops_user):
    made = make_slices(owner_a, ops_user)
    make_slices(owner_b, ops_user)  # another tenant's: never listed
    listed = list(selectors.slice_list_for_dashboard(tenant=owner_a.tenant))
    expected = [
        ("provisioning", 30),
        ("queued", 600),
        ("stopped", 5),
        ("completed", 60),
        ("failed", 700),
        ("refused", 1),
        ("refused", 90),
    ]
    assert [s.pk for s in listed] == [made[key].pk for key in expected]


def test_dashboard_page_shows_the_queued_slice_above_a_newer_refused_one(client, owner_a, ops_user):
    made = make_slices(owner_a, ops_user)
    client.force_login(owner_a.user)
    page = client.get("/dashboard/").content.decode()
    queued = page.index(f'id="slice-row-{made[("queued", 600)].pk}"')
    refused = page.index(f'id="slice-row-{made[("refused", 1)].pk}"')
    stopped = page.index(f'id="slice-row-{made[("stopped", 5)].pk}"')
    assert queued < stopped < refused
