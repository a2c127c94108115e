"""The node lab for tests: lab nodes started once per session for each layout a test
asks for, handed out reset (no containers, a healthy card, the original host key, the
test's platform key authorised), stopped at the end of the session.

Where the lab cannot start, a lab test skips with the reason, except under CI (tests.ci),
where it fails: a green CI run always means the lab lane ran."""

from __future__ import annotations

import threading
from typing import NoReturn

from nodelab import Lab, LabNodeSpec, LabUnavailable
from tests.ci import missing


class LabPool:
    """Labs by layout, started on first use and kept for the session."""

    def __init__(self) -> None:
        self.labs: dict[tuple[LabNodeSpec, ...], Lab] = {}
        self.failed: str | None = None
        self.lock = threading.Lock()

    def get(self, specs: tuple[LabNodeSpec, ...], authorized_keys: list[str]) -> Lab:
        with self.lock:
            if self.failed is not None:
                unavailable(self.failed)
            lab = self.labs.get(specs)
            if lab is None:
                try:
                    lab = Lab.start(list(specs), authorized_keys=authorized_keys)
                except LabUnavailable as exc:
                    self.failed = str(exc)
                    unavailable(self.failed)
                self.labs[specs] = lab
            for node in lab.nodes:
                node.reset(authorized_keys)
            return lab

    def stop(self) -> list[str]:
        left = []
        for lab in self.labs.values():
            left += lab.stop()
        self.labs.clear()
        return left


def unavailable(reason: str) -> NoReturn:
    missing(f"the node lab cannot start here: {reason}")
