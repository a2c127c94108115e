"""Exceptions of the nodes app that other apps catch: `from nodes.errors import
ContainerError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runtime import ContainerInfo


class ContainerError(Exception):
    """The node refused or failed a container operation; the message says why."""

    def __init__(self, message: str, *, info: ContainerInfo | None = None) -> None:
        super().__init__(message)
        self.info = info
