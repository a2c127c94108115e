"""The emulated wall clock. Node state is evaluated lazily from it, so nothing ticks in the
background and a test can move time forward (`Clock.advance`) or speed it up."""

from __future__ import annotations

import threading
import time


class Clock:
    """Emulated wall clock (epoch seconds): real time x speed, plus manual advances."""

    def __init__(self, speed: float = 1.0):
        self._lock = threading.Lock()
        self._base = time.time()
        self._mono = time.monotonic()
        self._speed = float(speed)

    def now(self) -> float:
        return self._base + (time.monotonic() - self._mono) * self._speed

    @property
    def speed(self) -> float:
        return self._speed

    def set_speed(self, speed: float) -> None:
        with self._lock:
            self._base, self._mono, self._speed = self.now(), time.monotonic(), float(speed)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._base += float(seconds)
