"""Exceptions of the nodes app that other apps catch (nodes.services re-exports them, so
`from nodes.services import ContainerError` still works)."""

from __future__ import annotations


class ContainerError(Exception):
    """The node refused or failed a container operation; the message says why."""

    def __init__(self, message: str, *, info=None):
        super().__init__(message)
        self.info = info
