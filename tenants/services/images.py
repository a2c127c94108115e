"""The image allowlist ops keep: only these images can be launched."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.errors import Conflict, ServiceError
from gpuplatform.ops import require_ops
from nodes import runtime, ssh
from nodes import services as node_services
from nodes.docker_messages import image_env_refusal
from nodes.errors import ContainerError
from nodes.models import GateStatus, Node

from ..launch_input import clean_command
from ..locks import image_lock
from ..models import Image

# Docker's reference grammar, simplified: [registry[:port]/]path[:tag]
REFERENCE_RE = re.compile(
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$"
)
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()+-]{0,63}$")
MAX_PORTS = 8
SSH_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # the portable user names of POSIX


def _runtime_accepts(reference: str) -> bool:
    """The container runtime's own check: an allowlisted image must be launchable."""
    try:
        runtime.check_image(reference)
    except ValueError:
        return False
    return True


def _clean(data: Mapping[str, object]) -> dict[str, Any]:
    """An allowlist entry's fields, each checked and normalised (the ones given only),
    then the ports an entry's way of connecting needs."""
    out: dict[str, Any] = dict(data)
    if "name" in out:
        out["name"] = _clean_name(out["name"])
    if "reference" in out:
        out["reference"] = _clean_reference(out["reference"])
    if "digest" in out:
        out["digest"] = _clean_digest(out["digest"])
    if "default_command" in out:
        out["default_command"] = _clean_default_command(out["default_command"])
    if "ports" in out:
        out["ports"] = _clean_ports(out["ports"])
    if "ssh_user" in out:
        out["ssh_user"] = _clean_ssh_user(out["ssh_user"])
    if "connect" in out and out["connect"] not in Image.Connect.values:
        raise ServiceError("How tenants connect: ssh, jupyter or service.", field="connect")
    _check_connect_ports(connect=out.get("connect"), ports=out.get("ports"))
    return out


def _clean_name(value: object) -> str:
    name = str(value).strip()
    if not NAME_RE.match(name):
        raise ServiceError(
            "Name: letters, digits, spaces and . _ ( ) + -, up to 64 characters.", field="name"
        )
    return name


def _clean_reference(value: object) -> str:
    reference = str(value).strip()
    if len(reference) > 255 or not REFERENCE_RE.match(reference) or not _runtime_accepts(reference):
        raise ServiceError(
            "Not an image reference: expected e.g. pytorch/pytorch:2.4.0-cuda12.1-runtime.",
            field="reference",
        )
    return reference


def _clean_digest(value: object) -> str:
    digest = str(value or "").strip()
    if digest and not DIGEST_RE.match(digest):
        raise ServiceError("A digest looks like sha256:<64 hex digits>.", field="digest")
    return digest


def _clean_default_command(value: object) -> list[str]:
    try:
        return clean_command(value)
    except ServiceError as exc:
        raise ServiceError(exc.message, code=exc.code, field="default_command") from exc


def _clean_ports(value: object) -> list[int]:
    """Up to MAX_PORTS whole numbers from 1 to 65535, sorted, each once."""
    ports = value or []
    if not isinstance(ports, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in ports
    ):
        raise _ports_refused("invalid")  # not a list of whole numbers
    if len(ports) > MAX_PORTS:
        raise _ports_refused("max_length")
    if not all(1 <= p <= 65535 for p in ports):
        raise _ports_refused("max_value" if max(ports) > 65535 else "min_value")
    return sorted(set(ports))


def _ports_refused(code: str) -> ServiceError:
    return ServiceError(
        f"Ports are up to {MAX_PORTS} numbers between 1 and 65535.", code=code, field="ports"
    )


def _clean_ssh_user(value: object) -> str:
    user = value.strip() if isinstance(value, str) else None
    if not user or not SSH_USER_RE.match(user):
        raise ServiceError(
            "SSH user: a user name of up to 32 characters (a-z, 0-9, _ and -, "
            "starting with a letter or _).",
            field="ssh_user",
        )
    return user


def _check_connect_ports(*, connect: object, ports: list[int] | None) -> None:
    if connect == Image.Connect.SSH and ports is not None and 22 not in ports:
        raise ServiceError("An SSH image must expose port 22.", field="ports")
    if connect == Image.Connect.JUPYTER and ports is not None and 8888 not in ports:
        raise ServiceError("A Jupyter image must expose port 8888.", field="ports")


INSPECT_ON_NODES = 2  # nodes tried, most recently seen first
INSPECT_SEEN_WITHIN = timedelta(minutes=10)


class Inspection(TypedDict):
    """What an allowlist entry keeps of its image's inspection on a node."""

    inspected_at: datetime | None
    inspected_on: str
    inspected_image_id: str
    inspection_note: str


def _inspection(reference: str) -> Inspection:
    """Inspect the image's configuration on a node that passed the preflight gate: an
    image that sets a variable changing isolation (the NVIDIAScape pattern is `ENV
    LD_PRELOAD` in the image) is refused, naming it. With no node to ask, the entry is
    kept as not inspected: every start still checks the image on its node first."""
    nodes = (
        Node.objects.exclude(host_key="")
        .filter(
            status__in=[Node.Status.ACTIVE, Node.Status.DRAINING],
            gate_status=GateStatus.PASSED,
            last_seen_at__gte=timezone.now() - INSPECT_SEEN_WITHIN,
        )
        .order_by("-last_seen_at", "pk")[:INSPECT_ON_NODES]
    )
    why = "no node that passed the preflight gate answers"
    for node in nodes:
        try:
            config = node_services.image_inspect(node=node, reference=reference)
        except ssh.SSHError:
            why = f"node {node.name} did not answer"
            continue
        except ContainerError as exc:
            why = f"node {node.name}: {exc}"
            continue
        refusal = image_env_refusal(config)
        if refusal:
            raise ServiceError(
                f"This image cannot be allowlisted: {refusal}.",
                code="image_sets_reserved_variable",
                field="reference",
            )
        return {
            "inspected_at": timezone.now(),
            "inspected_on": node.name,
            "inspected_image_id": config.id[:80],
            "inspection_note": "",
        }
    return {
        "inspected_at": None,
        "inspected_on": "",
        "inspected_image_id": "",
        "inspection_note": f"Not inspected yet ({why})"[:250] + "; each start checks it first.",
    }


def _pinned(data: Mapping[str, Any]) -> str:
    return f"{data['reference']}@{data['digest']}" if data.get("digest") else data["reference"]


def image_create(*, actor: User, **fields: object) -> Image:
    require_ops(actor, what="manage the image allowlist")
    fields.setdefault("connect", Image.Connect.SSH)
    fields.setdefault("ports", [22] if fields["connect"] == Image.Connect.SSH else [])
    data = _clean(fields)
    if "reference" not in data:
        raise ServiceError("An image needs a reference.", field="reference")
    if Image.objects.filter(name=data.get("name")).exists():  # before asking a node
        raise Conflict("An image with this name exists.", code="image_exists", field="name")
    data.update(_inspection(_pinned(data)))  # outside any transaction: SSH takes a while
    return _image_save_new(data)


@transaction.atomic
def _image_save_new(data: dict[str, Any]) -> Image:
    try:
        with transaction.atomic():
            return Image.objects.create(**data)
    except IntegrityError as exc:
        raise Conflict(
            "An image with this name exists.", code="image_exists", field="name"
        ) from exc


def image_update(*, actor: User, image: Image, **changes: object) -> Image:
    """Change an allowlist entry; running slices keep the image they started with. A new
    reference or digest is inspected on a node again (a digest-pinned image that changes
    digest is another image)."""
    require_ops(actor, what="manage the image allowlist")
    current = Image.objects.get(pk=image.pk)
    inspected: Mapping[str, object] = {}
    if "reference" in changes or "digest" in changes:
        data = _clean(
            {
                "reference": changes.get("reference", current.reference),
                "digest": changes.get("digest", current.digest),
            }
        )
        if _pinned(data) != current.pinned_reference:
            inspected = _inspection(_pinned(data))
    return _image_save_changes(image=current, changes=changes, inspected=inspected)


@transaction.atomic
def _image_save_changes(
    *, image: Image, changes: Mapping[str, object], inspected: Mapping[str, object]
) -> Image:
    image = image_lock(image.pk)
    merged = {
        "connect": changes.get("connect", image.connect),
        "ports": changes.get("ports", image.ports),
        **changes,
    }
    data = _clean(merged)
    for key in changes:
        setattr(image, key, data[key])
    for key, value in inspected.items():
        setattr(image, key, value)
    try:
        with transaction.atomic():
            image.save()
    except IntegrityError as exc:
        raise Conflict(
            "An image with this name exists.", code="image_exists", field="name"
        ) from exc
    return image
