"""A launch and a resume as the API view and the page ask for them, and what they get
back: one typed request and one typed result (`tenants.services.slice_launch_request`,
`slice_resume_request`). Types only: the rules live in the launch service."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Image, LaunchTemplate, Purchase, Slice

__all__ = ["LaunchImage", "LaunchRequest", "LaunchResult", "Refusal", "ResumeRequest"]


@dataclass(frozen=True)
class LaunchRequest:
    """What a launch asks for. `image` and `model_request` may be left to the template;
    `image_reference` names an image instead of `image` (an allowlisted one by its
    reference, or one on no allowlist where the registry policy lets renters bring it)."""

    purchase: Purchase
    image: Image | None = None
    image_reference: str = ""
    model_request: Mapping[str, Any] | None = None
    command: Sequence[str] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    ssh_public_key: str = ""
    guaranteed: bool = True
    volumes: Sequence[Mapping[str, Any]] = ()
    template: LaunchTemplate | None = None
    idempotency_key: str = ""


@dataclass(frozen=True)
class LaunchImage:
    """The image a launch runs: an allowlist entry, or one the renter brought (`entry`
    None) under the registry policy's `policy` mode ("registry" or "any"), with the
    digest the renter pinned, if any."""

    entry: Image | None
    reference: str  # what the slice keeps as its image
    policy: str = ""
    digest: str = ""


@dataclass(frozen=True)
class ResumeRequest:
    """What a resume asks for: the purchase that pays (None: the one the resume page
    preselects, `selectors.purchase_resume_default`)."""

    purchase: Purchase | None = None
    idempotency_key: str = ""


@dataclass(frozen=True)
class Refusal:
    """The pre-launch check said no: why, and the estimate's breakdown."""

    message: str
    estimate: dict[str, Any]


@dataclass(frozen=True)
class LaunchResult:
    """The slice a launch or resume made (or found under its idempotency key); `created`
    is False for a replay; `refusal` is set when the VRAM check refused it."""

    slice: Slice
    created: bool
    refusal: Refusal | None = None
