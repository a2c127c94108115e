"""The slice page's port addresses, drawn by the edge app's own partial."""

from __future__ import annotations

from typing import Any

from django import template

from tenants.models import Image, Membership, Role, Slice

from .. import services

register = template.Library()


@register.inclusion_tag("edge/_slice_ports.html")
def slice_ports(slice: Slice, membership: Membership) -> dict[str, Any]:
    running = slice.state == Slice.State.RUNNING
    ports = services.port_addresses(slice=slice)
    return {
        "slice": slice,
        "ports": ports,
        "public_any": any(p["public"] for p in ports),
        "jupyter": _jupyter(slice, membership, ports),
        "running": running,
        "may_open": membership.role in services.OPEN_ROLES,
        "is_owner": membership.role == Role.OWNER,
    }


def _jupyter(slice: Slice, membership: Membership, ports: list[dict[str, Any]]) -> dict | None:
    """A Jupyter image's Open button: its port (8888 where declared, else its first) and the
    path that signs in with the slice's own Jupyter token (owners and members only: a
    viewer never sees the token)."""
    entry = slice.image_entry
    token = (slice.connection or {}).get("token", "")
    if entry is None or entry.connect != Image.Connect.JUPYTER or not token or not ports:
        return None
    if membership.role not in services.OPEN_ROLES:
        return None
    declared = [p["port"] for p in ports]
    port = 8888 if 8888 in declared else declared[0]
    return {"port": port, "next": f"/lab?token={token}"}
