"""The KPI page holds against the platform only the deaths the platform or a neighbour
caused: a completed run, a job's own error exit and its running out of memory inside its
own quota are not "hurt by a neighbour", even while a neighbour's memory incident is open
on its card."""

from datetime import UTC, datetime, timedelta

import pytest

from incidents import kpis
from nodes.models import Gpu, Node
from tenants.models import Slice
from tests.incidents.test_pages import make_gpu, make_incident, make_slice

pytestmark = pytest.mark.django_db

T0 = datetime(2024, 3, 1, tzinfo=UTC)
DAY = {"since": T0, "until": T0 + timedelta(hours=24)}


def at(h: float) -> datetime:
    return T0 + timedelta(hours=h)


@pytest.fixture
def card(owner_b) -> Gpu:
    """A card where a neighbour (owner_b's slice) had no isolation from 02:00 to 03:00."""
    node = Node.objects.create(
        gate_status="passed", name="rack9", address="10.9.0.1", status="active", host_key="k"
    )
    gpu = make_gpu(node, 0)
    Gpu.objects.filter(pk=gpu.pk).update(discovered_at=T0 - timedelta(days=1))
    offender = make_slice(owner_b.tenant, gpu, state="stopped", started=at(1), stopped=at(3))
    make_incident(
        rule="quota_breach",
        gpu=gpu,
        node=node,
        slice=offender,
        severity="critical",
        root_cause="no_isolation",
        first_seen_at=at(2),
        last_seen_at=at(2.5),
        status="resolved",
        resolved_at=at(3),
    )
    return gpu


def ended(owner, gpu, state: str, ended_by: str, exit_code: int | None) -> Slice:
    s = make_slice(owner.tenant, gpu, state=state, started=at(1), stopped=at(2.5))
    Slice.objects.filter(pk=s.pk).update(ended_by=ended_by, exit_code=exit_code)
    return s


def test_only_a_death_the_platform_or_a_neighbour_caused_counts_as_hurt(card, owner_a):
    job, platform = Slice.EndedBy.JOB, Slice.EndedBy.PLATFORM
    ended(owner_a, card, "completed", job, 0)  # finished well in the neighbour's hour
    ended(owner_a, card, "failed", job, 3)  # its own error exit
    ended(owner_a, card, "failed", job, 1)  # out of GPU memory at its own quota
    ended(owner_a, card, "failed", job, 137)  # the kernel, over its own host RAM
    killed = ended(owner_a, card, "failed", platform, 1)  # out of memory below its quota
    gone = ended(owner_a, card, "failed", platform, None)  # its container vanished
    k = kpis.compute(**DAY)
    # the six, and the offender itself (which ran, and is not hurt by its own incident)
    assert (k["slices_ran"], k["slices_hurt"]) == (7, 2)
    assert k["preemption_rate_pct"] == round(100 * 2 / 7, 2)
    [row] = k["by_node"]
    assert (row["slices_ran"], row["slices_hurt"]) == (7, 2)

    # the same deaths with no neighbour's incident open count against nobody
    Slice.objects.filter(pk__in=[killed.pk, gone.pk]).update(stopped_at=at(12))
    assert kpis.compute(**DAY)["slices_hurt"] == 0


def test_a_failure_recorded_before_its_cause_was_counts_as_it_did(card, owner_a):
    ended(owner_a, card, "failed", "", 1)  # no `ended_by`: from before it was recorded
    assert kpis.compute(**DAY)["slices_hurt"] == 1


def test_the_kpi_page_says_in_plain_words_what_does_not_count(client, ops_user):
    client.force_login(ops_user)
    body = client.get("/ops/incidents/kpis/").content.decode()
    assert "Only a death the platform or a neighbour caused counts" in body
    assert "finished (exit 0), stopped with an error of its own or ran out of memory" in body
