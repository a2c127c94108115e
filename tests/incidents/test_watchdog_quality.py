"""The short version of bench/watchdog_quality.py: a scripted four-hour day on four
emulated nodes with every kind of injected fault among forty ordinary slices. Nothing
ordinary may file an incident, every fault must be caught by its rule within one
sampling interval plus the rule's own window, once, and no neighbour is hurt."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from django.apps import apps

from tenants.models import Tier

pytestmark = pytest.mark.django_db(transaction=True)

BENCH = Path(__file__).resolve().parents[2] / "bench" / "watchdog_quality.py"


def load_bench(monkeypatch):  # type: ignore[no-untyped-def]
    # bench/ on sys.path, as when the script runs, for its `from _db import ...` (which
    # leaves Django as pytest-django set it up)
    monkeypatch.syspath_prepend(str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("watchdog_quality", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("watchdog_quality", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def seeded_tiers(db):  # type: ignore[no-untyped-def]
    if not Tier.objects.exists():  # a transactional test's flush emptied the seeded tiers
        importlib.import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)


def test_a_short_day_files_no_false_incident_and_misses_no_fault(  # type: ignore[no-untyped-def]
    settings, seeded_tiers, monkeypatch
):
    settings.NODES_CONTAINER_SETTLE_S = 0  # every setting the day changes is undone after
    wq = load_bench(monkeypatch)

    report = wq.simulate(slices=40, hours=4, nodes=4, seed=7)

    lines = "\n".join(report.lines())
    assert report.faults == 10, lines  # every kind of fault was injected and began
    assert report.false == [], lines
    assert report.missed == [], lines
    assert report.duplicates == 0, lines
    assert report.hurt == [], lines
    for rule, seconds in report.detect_s.items():
        assert round(max(seconds)) <= wq.WINDOW_S[rule], (rule, seconds, lines)
    assert report.slices >= 40
