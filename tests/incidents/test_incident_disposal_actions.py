"""The ops incident page offers to stop a slice, drain its GPU or node only while the
incident is not resolved, and a stop only of the run the incident was about: once the
slice has been resumed since, the page says so instead (and the confirmation refuses)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.models import Node
from tenants.models import Slice, SliceTransition
from tests.incidents.test_pages import make_gpu, make_incident, make_slice

pytestmark = pytest.mark.django_db

ACTIONS = ('id="action-stop-slice"', 'id="action-drain-gpu"', 'id="action-drain-node"')


@pytest.fixture
def about_a_run(owner_a):
    """A running slice on a GPU and an open incident about it, seen a minute ago."""
    n1 = Node.objects.create(
        gate_status="passed", name="rack1-a", address="10.1.0.1", status="active", host_key="k"
    )
    gpu = make_gpu(n1, 0)
    slice = make_slice(owner_a.tenant, gpu)
    seen = timezone.now() - timedelta(minutes=1)
    incident = make_incident(
        slice=slice, gpu=gpu, node=n1, tenant=owner_a.tenant, first_seen_at=seen,
        last_seen_at=seen,
    )  # fmt: skip
    return incident


def _resume(slice: Slice) -> None:
    """What a resume leaves behind: one more run and its transition out of a final state."""
    Slice.objects.filter(pk=slice.pk).update(runs=slice.runs + 1)
    SliceTransition.objects.create(slice=slice, from_state="stopped", to_state="requested")


def test_an_open_incident_offers_every_disposal_action(client, ops_user, about_a_run):
    client.force_login(ops_user)
    page = client.get(f"/ops/incidents/{about_a_run.pk}/").content.decode()
    assert all(action in page for action in ACTIONS)
    assert 'id="slice-resumed"' not in page


def test_a_resolved_incident_offers_no_disposal_action_and_refuses_them(
    client, ops_user, about_a_run
):
    about_a_run.status = "resolved"
    about_a_run.resolved_at = timezone.now()
    about_a_run.save()
    client.force_login(ops_user)
    page = client.get(f"/ops/incidents/{about_a_run.pk}/").content.decode()
    assert not any(action in page for action in ACTIONS) and 'id="action-reopen"' in page
    for action in ("stop-slice", "drain-gpu", "drain-node"):
        answer = client.post(
            f"/ops/incidents/{about_a_run.pk}/{action}/", {"confirm": "True", "reason": "x"}
        )
        assert answer.status_code == 302
    about_a_run.slice.refresh_from_db()
    assert about_a_run.slice.state == "running"
    assert about_a_run.gpu.node.drained_at is None
    assert not about_a_run.events.filter(kind="action").exists()


def test_a_slice_resumed_since_is_not_offered_for_a_stop_and_the_page_says_why(
    client, ops_user, about_a_run
):
    _resume(about_a_run.slice)
    client.force_login(ops_user)
    page = client.get(f"/ops/incidents/{about_a_run.pk}/").content.decode()
    assert 'id="action-stop-slice"' not in page
    assert 'id="slice-resumed"' in page and "now run 2" in page
    refused = client.post(
        f"/ops/incidents/{about_a_run.pk}/stop-slice/",
        {"confirm": "True", "reason": "old news"},
        follow=True,
    )
    assert "resumed since" in refused.content.decode()
    about_a_run.slice.refresh_from_db()
    assert about_a_run.slice.state == "running"


def test_a_resume_before_the_incident_last_saw_it_is_the_run_it_is_about(
    client, ops_user, about_a_run
):
    _resume(about_a_run.slice)
    about_a_run.last_seen_at = timezone.now() + timedelta(seconds=5)  # seen in the new run
    about_a_run.save()
    client.force_login(ops_user)
    page = client.get(f"/ops/incidents/{about_a_run.pk}/").content.decode()
    assert 'id="action-stop-slice"' in page and 'id="slice-resumed"' not in page
