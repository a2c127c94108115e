"""Launch templates: ops write them (on an allowlisted image, with a command the engine
flags can follow and a job the estimate can read); tenants launch from them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from estimator.hub import HubReader
from gpuplatform.errors import Conflict, ServiceError
from gpuplatform.ops import require_ops
from nodes import engines

from ..hub import hub_prefetch
from ..launch_input import clean_command, clean_environment, launch_estimate_input
from ..locks import template_lock
from ..models import Image, LaunchTemplate

FIELDS = ("name", "description", "image", "engine", "command", "environment", "model_request")
# the largest tier is as good as any for checking that a template's job can be read
_ANY_TIER_MIB = 24 * 1024


class _TemplateFields(TypedDict):
    """A template's fields as `_clean` leaves them, ready to save."""

    name: str
    description: str
    image: Image
    engine: str
    command: list[str]
    environment: dict[str, str]
    model_request: object  # the job as given: launch_estimate_input has read it


def _clean(current: Mapping[str, object], hub: HubReader) -> _TemplateFields:
    name = str(current.get("name") or "").strip()
    if not name:
        raise ServiceError("A template needs a name.", field="name")
    image = current.get("image")
    if not isinstance(image, Image) or not image.is_active:
        raise ServiceError("An allowlisted image.", field="image")
    engine = current.get("engine") or ""
    if not isinstance(engine, str) or engine not in engines.ENGINES:
        raise ServiceError(
            f"The engine is one of {', '.join(e for e in engines.ENGINES if e)} (or none).",
            field="engine",
        )
    command = clean_command(current.get("command") or [])
    if engine in engines.FRACTION_FLAGS and not command:
        raise ServiceError(
            f"A {engine} template needs its command: the platform appends "
            f"{engines.FRACTION_FLAGS[engine]} to it at start.",
            field="command",
        )
    model_request = current.get("model_request") or {}
    launch_estimate_input(model_request, _ANY_TIER_MIB, hub=hub)  # refused with its field
    return {
        "name": name[:64],
        "description": str(current.get("description") or "")[:300],
        "image": image,
        "engine": engine,
        "command": command,
        "environment": clean_environment(current.get("environment") or {}),
        "model_request": model_request,
    }


def template_create(*, actor: User, **fields: object) -> LaunchTemplate:
    """A new template; a Hub model its job names is read before the transaction opens."""
    hub = hub_prefetch(fields.get("model_request"), user=actor)
    return _template_create(actor=actor, hub=hub, fields=fields)


@transaction.atomic
def _template_create(
    *, actor: User, hub: HubReader, fields: Mapping[str, object]
) -> LaunchTemplate:
    require_ops(actor, what="manage launch templates")
    data = _clean(fields, hub)
    try:
        with transaction.atomic():
            return LaunchTemplate.objects.create(**data)
    except IntegrityError as exc:
        raise Conflict(
            "A template with this name exists.", code="template_exists", field="name"
        ) from exc


def template_update(*, actor: User, template: LaunchTemplate, **changes: object) -> LaunchTemplate:
    """Change a template; slices launched from it keep what they started with. A Hub model
    its job names is read before the transaction opens."""
    model_request = changes.get("model_request", template.model_request)
    hub = hub_prefetch(model_request, user=actor)
    return _template_update(actor=actor, template=template, hub=hub, changes=changes)


@transaction.atomic
def _template_update(
    *, actor: User, template: LaunchTemplate, hub: HubReader, changes: Mapping[str, object]
) -> LaunchTemplate:
    require_ops(actor, what="manage launch templates")
    template = template_lock(template.pk)
    current = {f: getattr(template, f) for f in FIELDS}
    current.update({k: v for k, v in changes.items() if k in FIELDS})
    data = _clean(current, hub)
    for field, value in data.items():
        setattr(template, field, value)
    if "is_active" in changes:
        template.is_active = bool(changes["is_active"])
    try:
        with transaction.atomic():
            template.save()
    except IntegrityError as exc:
        raise Conflict(
            "A template with this name exists.", code="template_exists", field="name"
        ) from exc
    return template


@transaction.atomic
def template_withdraw(*, actor: User, template: LaunchTemplate) -> LaunchTemplate:
    """No longer offered; kept on record for the slices launched from it."""
    require_ops(actor, what="manage launch templates")
    LaunchTemplate.objects.filter(pk=template.pk).update(is_active=False)
    template.refresh_from_db()
    return template
