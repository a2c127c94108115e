"""Where the watchdog's VRAM warning line plugs in: the fleet page marks a card at or over
the line ops set for the watchdog, so the page and the incidents never disagree.

`nodes` knows nothing of incidents (incidents -> nodes); the incidents app sets how to read
its thresholds here (in its AppConfig.ready). Until it does, the watchdog's default line.
"""

from __future__ import annotations

from collections.abc import Callable

DEFAULT_WARNING_PCT = 85.0  # incidents.rules.Thresholds.vram_warning_pct's default

_reader: Callable[[], float] | None = None


def set_warning_line_reader(reader: Callable[[], float]) -> None:
    global _reader
    _reader = reader


def warning_pct() -> float:
    """The VRAM warning line now, % of a card's memory."""
    return DEFAULT_WARNING_PCT if _reader is None else float(_reader())


def pct_text(pct: float) -> str:
    """85.0 -> "85", 82.5 -> "82.5": a line as people write it."""
    return f"{pct:g}"
