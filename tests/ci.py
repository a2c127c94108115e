"""CI is CI: what a test does when a part it needs is missing (the node lab, Redis,
chromium, PostgreSQL). On a laptop it skips with the reason; under CI it fails with it, so a
green CI run always means every lane ran. CI is any non-empty `CI` other than `false` or
`0` (any case): CI services set `true`, `1` or their own name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, NoReturn

import pytest

NOT_CI = frozenset({"", "false", "0"})


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() not in NOT_CI


def missing_verdict(
    reason: str, environ: Mapping[str, str] | None = None
) -> tuple[Literal["fail", "skip"], str]:
    """Whether a test missing a part fails or skips here, and the message it says."""
    environ = os.environ if environ is None else environ
    if in_ci(environ):
        return "fail", f"{reason} (CI={environ['CI']}: under CI a missing part fails, never skips)"
    return "skip", reason


def missing(reason: str) -> NoReturn:
    """End the test for a missing part: a skip, or under CI a failure."""
    verdict, message = missing_verdict(reason)
    if verdict == "fail":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
