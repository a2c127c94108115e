"""Loading a benchmark module from bench/ in a test (the scripts are not a package): the
seeds the scale tests share with the measurements, and the watchdog's scripted day."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py as a module, with bench/ on sys.path for its own `from _db import`
    (which leaves Django as pytest-django set it up). Loaded once per test session."""
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCH) not in sys.path:
        # last: bench/gateway.py must not shadow the gateway package
        sys.path.append(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
