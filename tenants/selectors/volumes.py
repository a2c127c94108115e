"""Reads of volumes: a tenant's volumes, the storage price, the nodes that hold them, and
the volumes a slice mounts (checked at launch, where it must run, what docker mounts)."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db.models import QuerySet

from gpuplatform.errors import Conflict, ServiceError
from nodes import volumes

from ..models import Image, Slice, SliceMount, StoragePrice, Tenant, Volume


def volumes_only_used_by(slice: Slice) -> list[Volume]:
    """The slice's volumes that no other slice (not terminated) has mounted."""
    mine = SliceMount.objects.filter(slice=slice).values_list("volume_id", flat=True)
    shared = (
        SliceMount.objects.filter(volume_id__in=mine, slice__terminated_at__isnull=True)
        .exclude(slice=slice)
        .values_list("volume_id", flat=True)
    )
    return list(Volume.objects.filter(pk__in=mine, state=Volume.State.READY).exclude(pk__in=shared))


def volume_list(*, tenant: Tenant | None) -> QuerySet[Volume]:
    """The tenant's volumes, deleted ones included (their record stays), newest first."""
    return Volume.objects.for_tenant(tenant).order_by("-created_at", "-id")


def storage_price() -> Decimal:
    """Credits per GB-hour: the newest price ops set, else the default setting."""
    latest = StoragePrice.objects.order_by("-created_at", "-id").first()
    if latest is not None:
        return latest.credits_per_gb_hour
    return Decimal(str(settings.VOLUME_PRICE_GB_HOUR))


def volume_nodes() -> list[int]:
    """Nodes that hold a ready volume (each is measured on its own)."""
    return sorted(
        set(Volume.objects.filter(state=Volume.State.READY).values_list("node_id", flat=True))
    )


def image_mount_home(image: Image | None) -> str:
    """The home of an SSH image's login user (`/home/<ssh_user>`), where a volume may go so
    the login's files survive a stop; "" for any other image, and for root."""
    if image is None or image.connect != Image.Connect.SSH:
        return ""
    return volumes.home_of(image.ssh_user)


def mounts_clean(
    *, tenant: Tenant, mounts: object, image: Image | None = None
) -> list[tuple[Volume, str]]:
    """A launch's `volumes`: [{"volume": id, "path": "/data/x"}], checked against the
    tenant's own ready volumes (an SSH image's login home is a path one may take too).
    Another tenant's volume reads like one that does not exist. All of them must be on
    one node (the slice runs there)."""
    home = image_mount_home(image)
    if mounts in (None, []):
        return []
    if not isinstance(mounts, list) or len(mounts) > volumes.MAX_MOUNTS:
        raise ServiceError(
            f'At most {volumes.MAX_MOUNTS} volumes, e.g. [{{"volume": 3, "path": "/data"}}].',
            field="volumes",
        )
    out = [
        _mount(tenant=tenant, item=item, where=f"volumes.{n}", home=home)
        for n, item in enumerate(mounts)
    ]
    if len({v.pk for v, _ in out}) != len(out):
        raise ServiceError("A volume is mounted once per slice.", field="volumes")
    paths = [p for _, p in out]
    for p in paths:
        if any(q != p and (q.startswith(p + "/")) for q in paths) or paths.count(p) > 1:
            raise ServiceError("Two volumes cannot share a path or nest.", field="volumes")
    if len({v.node_id for v, _ in out}) > 1:
        raise ServiceError(
            "These volumes are on different nodes; a slice runs on one node.", field="volumes"
        )
    return out


def _mount(*, tenant: Tenant, item: object, where: str, home: str) -> tuple[Volume, str]:
    """One mount of a launch: the tenant's ready volume and the path it goes at."""
    if not isinstance(item, dict) or set(item) != {"volume", "path"}:
        raise ServiceError('Each is {"volume": <id>, "path": "/data/..."}.', field=where)
    pk, path = item["volume"], item["path"]
    if isinstance(pk, bool) or not isinstance(pk, int):
        raise ServiceError("A volume id.", field=f"{where}.volume")
    volume = Volume.objects.for_tenant(tenant).filter(pk=pk).select_related("node").first()
    if volume is None or volume.state in (Volume.State.DELETED, Volume.State.DELETING):
        raise ServiceError(
            f"No volume {pk} of yours.", code="does_not_exist", field=f"{where}.volume"
        )
    if volume.state != Volume.State.READY:
        raise Conflict(
            f"Volume {volume.name} is {volume.state}.",
            code="volume_not_ready",
            field=f"{where}.volume",
        )
    refusal = volumes.mount_path_refusal(path, home=home)
    if refusal:
        raise ServiceError(f"The mount path: {refusal}.", field=f"{where}.path")
    return volume, path


def slice_volume_node_id(slice: Slice) -> int | None:
    """The node a slice must run on: its volumes' (None when it mounts none)."""
    return SliceMount.objects.filter(slice=slice).values_list("volume__node_id", flat=True).first()


def slice_mount_args(slice: Slice) -> tuple[tuple[str, str], ...]:
    """What the slice's container mounts: (docker volume name, path), by path."""
    return tuple(
        SliceMount.objects.filter(slice=slice)
        .order_by("path")
        .values_list("volume__docker_name", "path")
    )
