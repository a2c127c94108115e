"""Where the watchdog's VRAM warning line plugs in: the fleet page marks a card at or over
the line ops set for the watchdog, so the page and the incidents never disagree.

`nodes` knows nothing of incidents (incidents -> nodes); the incidents app registers how
to read its thresholds here (in its AppConfig.ready). With nothing registered the
watchdog's default line holds.
"""

from __future__ import annotations

from collections.abc import Callable

DEFAULT_WARNING_PCT = 85.0

WarningLineReader = Callable[[], float]
_readers: list[WarningLineReader] = []


def register_warning_line(reader: WarningLineReader) -> WarningLineReader:
    if reader not in _readers:
        _readers.append(reader)
    return reader


def unregister_warning_line(reader: WarningLineReader) -> None:
    if reader in _readers:
        _readers.remove(reader)


def warning_pct() -> float:
    """The VRAM warning line now, % of a card's memory (the last registered reader's)."""
    return float(_readers[-1]()) if _readers else DEFAULT_WARNING_PCT


def pct_text(pct: float) -> str:
    """85.0 -> "85", 82.5 -> "82.5": a line as people write it."""
    return f"{pct:g}"
