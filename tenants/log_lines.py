"""A line of a slice's output as pages and the API show it: no terminal escapes or control
characters, capped in length. Pure."""

from __future__ import annotations

import re

LINE_MAX = 2000  # characters kept of one line
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean_line(text: str) -> str:
    """A line as a page may show it: no terminal escapes or control characters, capped."""
    text = _CONTROL.sub("", _ANSI.sub("", text.replace("\r", "")))
    return text[:LINE_MAX]
