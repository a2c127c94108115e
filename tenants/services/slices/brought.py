"""Images renters bring (docs/images.md) through a slice's life: the image a launch names
(an allowlist entry chosen by id or named by its reference, else a reference the registry
policy allows, else a refusal that names the policy), the policy asked again at a resume
and in the queue, and each start's pull with the tenant's own registry login."""

from __future__ import annotations

from gpuplatform.errors import NotAllowed, ServiceError
from nodes import runtime
from nodes import services as node_services
from nodes.errors import ContainerError
from nodes.image_refs import image_key, reference_parts
from nodes.models import AgentState, NodeAgent
from nodes.registry_pull import BroughtImage

from ...image_policy import ANY, refusal
from ...launch_request import LaunchImage
from ...models import Image, Slice
from ...selectors import LoginUnreadable, image_list, registry_login_for, registry_policy_decide
from ..registries import registry_credential_touch

MAX_REFERENCE = 255


def launch_image_choose(*, image: Image | None, reference: str = "") -> LaunchImage:
    """The image a launch runs: the allowlist entry chosen (`image`) or named by its
    reference, exactly as before registry rules existed; else a reference on no allowlist
    that the registry policy lets renters bring. Raises ServiceError (no image, both, not
    a reference, a digest without its tag) or NotAllowed (the policy says no, named)."""
    reference = str(reference or "").strip()
    if image is not None and reference:
        raise ServiceError(
            "Choose an allowlisted image or name an image reference, not both.",
            field="image_reference",
        )
    if image is not None:
        return LaunchImage(image, image.pinned_reference)
    if not reference:
        raise ServiceError("Pick an image, or a template.", code="required", field="image")
    reference = _reference_clean(reference)
    entry = _allowlisted(reference)
    if entry is not None:
        return LaunchImage(entry, entry.pinned_reference)
    decision = registry_policy_decide(reference=reference)
    if not decision.allows:
        raise NotAllowed(
            refusal(reference, decision), code="image_not_allowed", field="image_reference"
        )
    return LaunchImage(None, reference, decision.mode, reference_parts(reference).digest)


def _reference_clean(reference: str) -> str:
    try:
        if len(reference) > MAX_REFERENCE:
            raise ValueError
        runtime.check_image(reference)
    except ValueError:
        raise ServiceError(
            "Not an image reference: expected e.g. ghcr.io/acme/train:2 or "
            "docker.io/library/python:3.12.",
            field="image_reference",
        ) from None
    parts = reference_parts(reference)
    if parts.digest and not parts.tag:
        raise ServiceError(
            "Name the tag with the digest (repository:tag@sha256:…): every start asks the "
            "registry for that tag with your tenant's own login, and then runs the digest.",
            code="image_reference_needs_tag",
            field="image_reference",
        )
    return reference


def _allowlisted(reference: str) -> Image | None:
    """The active allowlist entry `reference` names (as it runs, or a pinned entry by its
    reference alone), Docker Hub's spellings counted alike."""
    key = image_key(reference)
    for entry in image_list(active_only=True):
        if key in (image_key(entry.reference), image_key(entry.pinned_reference)):
            return entry
    return None


def slice_image_policy_refresh(*, slice: Slice) -> str:
    """Ask the registry policy again for a slice's brought image (a resume, the queue):
    '' when it still allows it, with the slice's mode brought up to date (unsaved: the
    caller saves `image_policy`); else why not, naming the policy. An allowlisted image
    is the allowlist's to judge ('')."""
    if not slice.brought:
        return ""
    decision = registry_policy_decide(reference=slice.image)
    if not decision.allows:
        return refusal(slice.image, decision)
    slice.image_policy = decision.mode
    return ""


def slice_image_bring(*, slice: Slice) -> BroughtImage:
    """Pull a placed slice's brought image on its node with its tenant's own login
    (nodes.services.image_bring), and keep the digest and the ports it declares on the
    slice. Raises ContainerError (refused, in words) or ssh.SSHError."""
    node = slice.allocation.gpu.node  # type: ignore[union-attr]  # a provisioning slice is placed
    if slice.image_policy == ANY and not _agent_runs(node.pk):
        raise ContainerError(
            f"node {node.name}'s agent is not running, and this image runs only on nodes "
            "where it does (the registry policy's 'any image')"
        )
    try:
        login = registry_login_for(tenant_id=slice.tenant_id, reference=slice.image)
    except LoginUnreadable:
        registry = reference_parts(slice.image).registry
        raise ContainerError(
            f"your tenant's saved login for {registry} can no longer be read (the platform's "
            "key changed): save it again on the Registries page"
        ) from None
    brought = node_services.image_bring(
        node=node,
        reference=slice.image,
        owner_key=slice.owner_key,
        pinned=slice.image_digest,
        login=login,
    )
    if login is not None:
        registry_credential_touch(tenant_id=slice.tenant_id, registry=login.registry)
    slice.image_digest, slice.image_ports = brought.digest, list(brought.ports)
    Slice.objects.filter(pk=slice.pk).update(
        image_digest=slice.image_digest, image_ports=slice.image_ports
    )
    return brought


def _agent_runs(node_id: int) -> bool:
    return NodeAgent.objects.filter(node_id=node_id, state=AgentState.OK).exists()
