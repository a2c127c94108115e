"""Where the image allowlist plugs in: the node policy's probe image is one of its images.

`nodes` knows nothing of tenants (tenants -> nodes), which keeps the allowlist; the tenants
app registers how to read it here (in its AppConfig.ready). With nothing registered no
image is allowlisted, so no probe image can be chosen: the gate fails closed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple


class AllowlistedImage(NamedTuple):
    reference: str  # what a container runs: reference, or reference@digest when pinned
    name: str  # what ops call it on the allowlist
    also: str = ""  # the unpinned reference of a pinned image ('' when not pinned)


AllowlistReader = Callable[[], Sequence[AllowlistedImage]]
_readers: list[AllowlistReader] = []


def register_allowlist(reader: AllowlistReader) -> AllowlistReader:
    if reader not in _readers:
        _readers.append(reader)
    return reader


def unregister_allowlist(reader: AllowlistReader) -> None:
    if reader in _readers:
        _readers.remove(reader)


def allowlisted_images() -> list[AllowlistedImage]:
    """Every image tenants may launch now, in the allowlist's order."""
    return [image for reader in list(_readers) for image in reader()]


def allowlisted(reference: str) -> AllowlistedImage | None:
    """The allowlist entry `reference` names (as it runs, or a pinned image by its
    reference alone), or None."""
    reference = (reference or "").strip()
    for image in allowlisted_images():
        if reference and reference in (image.reference, image.also):
            return image
    return None
