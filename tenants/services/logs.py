"""A slice's output: read from its node with the ordinary `docker logs --timestamps`,
kept in the database (so the page and the API never wait on a node, the lines outlive the
container and a worker restart), bounded per slice and pruned after the slice stops.

Collection runs on a worker: a page or API read of a running slice asks for it (at most
once every few seconds per slice), and a stop takes the last lines before the container is
removed. Each read asks docker for what came since the last line kept, so nothing is read
twice and nothing between two reads is lost."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from nodes import services as node_services
from nodes import ssh
from nodes.errors import ContainerError

from ..log_lines import clean_line
from ..models import Slice, SliceLogLine

READ_TAIL = 2000  # lines asked of docker at most per read
DEBOUNCE_S = 2  # a running slice's log is read at most this often on demand
COLLECTING = (Slice.State.RUNNING, Slice.State.STOPPING)
PLATFORM_PREFIX = "[gpuplatform] "  # a line the platform wrote, not the container


def slice_logs_request(*, slice: Slice) -> None:
    """Ask a worker to read a running slice's new output (at most once per DEBOUNCE_S)."""
    running = slice.state == Slice.State.RUNNING and slice.container_id
    if running and cache.add(f"slice-logs:{slice.pk}", 1, timeout=DEBOUNCE_S):
        enqueue("telemetry.slice_logs", slice.pk)


def slice_logs_collect(*, slice_id: int) -> int:
    """Read what the slice's container printed since the last line kept and keep it;
    returns how many lines were added. Safe to run twice (a line is kept once). Raises
    ssh.SSHError or ContainerError when the node does not answer."""
    slice = Slice.objects.select_related("allocation__gpu__node").get(pk=slice_id)
    if slice.state not in COLLECTING or slice.allocation is None or not slice.container_id:
        return 0
    # where docker's output was read up to: the platform's own notes do not count
    kept = SliceLogLine.objects.filter(slice=slice).exclude(text__startswith=PLATFORM_PREFIX)
    last = kept.order_by("-seq").first()
    since = last.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if last else ""
    lines = node_services.container_logs_read(
        node=slice.allocation.gpu.node, container=slice.container_id, since=since, tail=READ_TAIL
    )
    seen = set()
    if last is not None:  # docker's --since is inclusive: the last moment's lines again
        seen = set(kept.filter(at=last.at).values_list("text", flat=True))
    rows = []
    for second, micro, text in lines:
        at = datetime.strptime(second, "%Y-%m-%dT%H:%M:%S").replace(microsecond=micro, tzinfo=UTC)
        line = clean_line(text)
        if last is not None and (at < last.at or (at == last.at and line in seen)):
            continue
        rows.append((at, line))
    if not rows:
        return 0
    try:
        with transaction.atomic():
            top = SliceLogLine.objects.filter(slice=slice).aggregate(m=Max("seq"))["m"] or 0
            SliceLogLine.objects.bulk_create(
                [
                    SliceLogLine(slice=slice, seq=top + n, at=at, text=text)
                    for n, (at, text) in enumerate(rows, start=1)
                ]
            )
            keep_from = top + len(rows) - settings.SLICE_LOG_KEEP_LINES
            if keep_from > 0:
                SliceLogLine.objects.filter(slice=slice, seq__lte=keep_from).delete()
    except IntegrityError:
        return 0  # another read kept these lines first
    return len(rows)


def slice_logs_note(*, slice: Slice, text: str) -> None:
    """Add the platform's own line to the slice's output, after what the container printed
    so far (read first, best effort), so `gpp logs` and the page show it where it happened.
    It starts with PLATFORM_PREFIX and never moves where docker's output is read from."""
    with contextlib.suppress(ssh.SSHError, ContainerError):
        slice_logs_collect(slice_id=slice.pk)
    line = clean_line(f"{PLATFORM_PREFIX}{text}")
    for _ in range(3):  # a collect on another worker may take the next number first
        try:
            with transaction.atomic():
                top = SliceLogLine.objects.filter(slice=slice).aggregate(m=Max("seq"))["m"]
                SliceLogLine.objects.create(
                    slice=slice, seq=(top or 0) + 1, at=timezone.now(), text=line
                )
            return
        except IntegrityError:
            continue


def slice_logs_final(*, slice: Slice) -> None:
    """The last lines of a slice about to lose its container: best effort (a node that
    does not answer leaves what was already kept)."""
    with contextlib.suppress(ssh.SSHError, ContainerError):
        slice_logs_collect(slice_id=slice.pk)


def slice_logs_prune(*, now: datetime | None = None) -> int:
    """Delete the lines of slices stopped longer ago than the retention period."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.SLICE_LOG_RETENTION_DAYS)
    deleted, _ = SliceLogLine.objects.filter(
        slice__state__in=Slice.FINAL_STATES, slice__stopped_at__lt=cutoff
    ).delete()
    return deleted
