"""A slice's output against the node emulator's `docker logs --timestamps`: read on a
worker into the database, served by the API with a cursor and on the page live, each line
once and in order, bounded, cleaned of terminal escapes and escaped on the page, kept after
the container is removed at stop, pruned after the retention period."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tenants import services
from tenants.models import Role, Slice, SliceLogLine
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _texts(body) -> list[str]:
    return [line["text"] for line in body["lines"]]


def test_lines_come_through_the_api_once_each_in_order_with_a_cursor(running, api_a):
    emu, s = running
    services.slice_logs_collect(slice_id=s.pk)
    already = SliceLogLine.objects.filter(slice=s).count()  # what the job said at start
    emu.container_print(s.container_id, "epoch 1 loss 0.9\nepoch 2 loss 0.7")
    emu.container_print(s.container_id, "warning: \x1b[31mred\x1b[0m text", stream="stderr")
    services.slice_logs_collect(slice_id=s.pk)
    first = api_a.get(f"/api/v1/slices/{s.pk}/logs/", {"after": 0, "limit": 1000}).json()
    assert _texts(first)[already:] == ["epoch 1 loss 0.9", "epoch 2 loss 0.7", "warning: red text"]
    assert first["following"] is True and first["more"] is False
    cursor = first["next_cursor"]
    # nothing new: nothing again, however often it is read
    services.slice_logs_collect(slice_id=s.pk)
    again = api_a.get(f"/api/v1/slices/{s.pk}/logs/", {"after": cursor}).json()
    assert again["lines"] == [] and again["next_cursor"] == cursor
    emu.container_print(s.container_id, "epoch 3 loss 0.5")
    services.slice_logs_collect(slice_id=s.pk)
    more = api_a.get(f"/api/v1/slices/{s.pk}/logs/", {"after": cursor}).json()
    assert _texts(more) == ["epoch 3 loss 0.5"]
    seqs = list(SliceLogLine.objects.filter(slice=s).values_list("seq", flat=True))
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))


def test_paging_is_bounded_and_says_there_is_more(running, api_a, settings):
    emu, s = running
    emu.container_print(s.container_id, "\n".join(f"line {n}" for n in range(30)))
    services.slice_logs_collect(slice_id=s.pk)
    page = api_a.get(f"/api/v1/slices/{s.pk}/logs/", {"limit": 10}).json()
    assert len(page["lines"]) == 10 and page["more"] is True
    rest = api_a.get(f"/api/v1/slices/{s.pk}/logs/", {"after": page["next_cursor"], "limit": 1000})
    assert rest.json()["more"] is False
    # a slice keeps at most SLICE_LOG_KEEP_LINES: the oldest go first
    settings.SLICE_LOG_KEEP_LINES = 5
    emu.container_print(s.container_id, "\n".join(f"late {n}" for n in range(8)))
    services.slice_logs_collect(slice_id=s.pk)
    kept = list(SliceLogLine.objects.filter(slice=s).values_list("text", flat=True))
    assert kept == [f"late {n}" for n in range(3, 8)]


@pytest.mark.parametrize(
    ("query", "field"),
    [({"after": -1}, "after"), ({"after": "x"}, "after"), ({"limit": 0}, "limit"),
     ({"limit": 1001}, "limit")],
)  # fmt: skip
def test_a_bad_cursor_or_limit_is_a_400_naming_it(running, api_a, query, field):
    _, s = running
    answer = api_a.get(f"/api/v1/slices/{s.pk}/logs/", query)
    assert answer.status_code == 400 and field in answer.json()["fields"]


def test_the_output_outlives_the_container_and_is_pruned_after_retention(
    running, api_a, owner_a, settings
):
    emu, s = running
    emu.container_print(s.container_id, "saving checkpoint\nbye")
    services.slice_stop(slice=s, actor=owner_a.user)  # the stop reads the last lines
    s.refresh_from_db()
    assert s.state == Slice.State.STOPPED and emu.container(s.container_id) is None
    body = api_a.get(f"/api/v1/slices/{s.pk}/logs/").json()
    assert _texts(body)[-2:] == ["saving checkpoint", "bye"] and body["following"] is False
    services.slice_logs_prune(now=timezone.now() + timedelta(days=1))
    assert SliceLogLine.objects.filter(slice=s).exists()
    later = timezone.now() + timedelta(days=settings.SLICE_LOG_RETENTION_DAYS, hours=1)
    assert services.slice_logs_prune(now=later) > 0
    assert not SliceLogLine.objects.filter(slice=s).exists()


def test_who_reads_it_another_tenant_a_viewer_and_nobody(running, api_a, api_b, anon_api, owner_a):
    _, s = running
    assert api_b.get(f"/api/v1/slices/{s.pk}/logs/").status_code == 404
    assert anon_api.get(f"/api/v1/slices/{s.pk}/logs/").status_code == 401
    from tests.factories import make_token  # noqa: PLC0415 - only this test needs a viewer

    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER, user__email="v@a.test")
    from rest_framework.test import APIClient  # noqa: PLC0415 - as above

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(viewer.user)[1]}")
    assert client.get(f"/api/v1/slices/{s.pk}/logs/").status_code == 200


def test_the_page_shows_escaped_lines_and_polls_until_the_slice_is_done(running, client, owner_a):
    emu, s = running
    emu.container_print(s.container_id, "<script>alert(1)</script>")
    services.slice_logs_collect(slice_id=s.pk)
    client.force_login(owner_a.user)
    page = client.get(f"/slices/{s.pk}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert 'id="log-poll"' in page
    cursor = SliceLogLine.objects.filter(slice=s).order_by("-seq").first().seq
    emu.container_print(s.container_id, "next line")
    services.slice_logs_collect(slice_id=s.pk)
    fragment = client.get(f"/slices/{s.pk}/logs/", {"after": cursor}, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200
    text = fragment.content.decode()
    assert "next line" in text and 'hx-swap-oob="beforeend:#log-lines"' in text
    assert f"after={cursor + 1}" in text
    services.slice_stop(slice=s, actor=owner_a.user)
    done = client.get(f"/slices/{s.pk}/logs/", {"after": cursor + 1}, HTTP_HX_REQUEST="true")
    assert done.status_code == 286 and 'id="log-poll"' not in done.content.decode()
    assert client.get(f"/slices/{s.pk}/logs/", {"after": "x"}).status_code == 400


def test_the_platforms_note_goes_after_what_was_printed_and_never_hides_later_lines(running):
    """A note of the platform's (a preemption notice) reads the output first and is placed
    after it; lines the job prints later are read whatever the note's time says."""
    emu, s = running
    emu.container_print(s.container_id, "saving checkpoint")
    services.slice_logs_note(slice=s, text="Preemption notice: SIGTERM sent.")
    texts = list(SliceLogLine.objects.filter(slice=s).values_list("text", flat=True))
    assert texts[-2:] == ["saving checkpoint", "[gpuplatform] Preemption notice: SIGTERM sent."]
    # even a note stamped later than the job's next line does not move the reading point
    SliceLogLine.objects.filter(slice=s, text__startswith="[gpuplatform]").update(
        at=timezone.now() + timedelta(hours=1)
    )
    emu.container_print(s.container_id, "checkpoint saved")
    assert services.slice_logs_collect(slice_id=s.pk) == 1
    assert SliceLogLine.objects.filter(slice=s).last().text == "checkpoint saved"
