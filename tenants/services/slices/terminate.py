"""Terminate: end a slice for good. Stop keeps a slice resumable (its volumes, its
settings); terminate stops it if it runs and marks it so it can never be resumed, and can
delete the volumes that only it used."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from gpuplatform.errors import NotAllowed

from ...locks import slice_lock, volume_lock
from ...models import Membership, Slice
from ...selectors import volumes_only_used_by
from ..audit import audit_event_record
from ..volumes import volume_discard
from .stop import slice_stop


@transaction.atomic
def slice_terminate(*, membership: Membership, slice: Slice, delete_volumes: bool = False) -> Slice:
    """Stop the slice if it is not stopped, mark it terminated, and with `delete_volumes`
    delete the volumes only it used (a terminated slice is the tenant's last use of them)."""
    if not membership.can_write:
        raise NotAllowed("Viewers cannot terminate slices.")
    if slice.tenant_id != membership.tenant_id:
        raise Slice.DoesNotExist
    if not slice.is_final:
        slice = slice_stop(slice=slice, actor=membership.user, reason="Terminated by its tenant.")
    slice = slice_lock(slice.pk)
    if slice.terminated_at is not None:
        return slice
    slice.terminated_at = timezone.now()
    slice.save(update_fields=["terminated_at"])
    deleted = []
    if delete_volumes:
        for volume in volumes_only_used_by(slice):
            volume_discard(
                volume=volume_lock(volume.pk), actor=membership.user, why="deleted with its slice"
            )
            deleted.append(volume.name)
    audit_event_record(
        tenant=slice.tenant,
        actor=membership.user,
        action="slice.terminate",
        summary=f"Slice {slice.pk} terminated"
        + (f"; volumes deleted: {', '.join(deleted)}" if deleted else ""),
        data={"slice": slice.pk, "volumes_deleted": deleted},
    )
    return slice
