"""The short version of bench/watchdog_quality.py: a scripted four-hour day on four
emulated nodes with every kind of injected fault among forty ordinary slices. Nothing
ordinary may file an incident, every fault must be caught by its rule within the rule's
own window plus two sampling intervals, once, and no neighbour is hurt. And the
benchmark's matcher itself, on fault and incident pairs, so that its strictness shows.
Then one round of its day against the node lab (bench/_agent_lab.py), which prints its
RESULT lines, and what it does where the lab cannot start."""

from __future__ import annotations

import importlib.util

import pytest
from django.apps import apps

from incidents.rules import Thresholds
from tenants.models import Tier
from tests.bench_support import load_bench
from tests.test_bench_smoke import RESULT


@pytest.fixture
def wq():
    return load_bench("watchdog_quality")


@pytest.fixture
def seeded_tiers(db):
    if not Tier.objects.exists():  # a transactional test's flush emptied the seeded tiers
        importlib.import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)


@pytest.mark.django_db(transaction=True)
def test_a_short_day_files_no_false_incident_and_misses_no_fault(settings, seeded_tiers, wq):
    settings.NODES_CONTAINER_SETTLE_S = 0  # every setting the day changes is undone after

    report = wq.simulate(slices=40, hours=4, nodes=4, seed=7)

    lines = "\n".join(report.lines())
    assert report.faults == 14, lines  # every kind of fault was injected and began
    assert report.false == [], lines
    assert report.missed == [], lines
    assert report.duplicates == 0, lines
    assert report.hurt == [], lines  # nobody stopped, throttled, failed or short of memory
    for rule, seconds in report.detect_s.items():
        assert round(max(seconds)) <= report.windows[rule] + wq.SLACK_S, (rule, seconds, lines)
    assert report.slices >= 40
    faults = {f.kind: f for f in report.faults_seen}
    # the bypasses ran where they had to: under a library that takes the node's limits
    for kind in ("env_control", "env_limit", "env_preload"):
        assert faults[kind].library == "enforcing", lines
    assert faults["static"].library == "bypassed", lines
    assert "static: stopped by accounting_drift" in report.notes, lines
    printed = results(report.lines())
    assert {"neighbours_hurt", "neighbours_harmed"} <= set(printed), lines
    assert printed["neighbours_harmed"] == str(len(report.harmed)), lines


def results(lines: list[str]) -> dict[str, str]:
    """The RESULT lines' values by metric, each line in the house's form."""
    out = {}
    for line in lines:
        if line.startswith("RESULT "):
            match = RESULT.match(line)
            assert match is not None, line
            assert match["ratio"] is None or match["baseline"] is not None, line
            out[match["metric"]] = match["value"]
    return out


def test_the_emulator_day_counts_harm_by_the_node_agents_rule(wq):
    # a 24 GB card: slice 1 holds 14,000 MiB of its 8 GB, slice 2 1,000 of its 8 GB,
    # slice 3 4,000 of its 4 GB; 4,576 MiB free, less than slice 2's 7,192 MiB unused
    snap = wq.CardSnapshot(24576, 20000, {1: (14000, 8192), 2: (1000, 8192), 3: (4000, 4096)})
    assert wq.harmed_on(snap) == [2]  # slice 3 has only 96 MiB unused; slice 1 offends
    # the same card with nobody over their quota: short, but of no one's doing
    fair = wq.CardSnapshot(24576, 20000, {1: (8000, 8192), 2: (1000, 8192), 4: (11000, 12288)})
    assert wq.harmed_on(fair) == []


# --- the matcher

TH = Thresholds()
T0 = 1_800_000_000.0


def matcher(wq, faults, **kw):
    windows = wq.rule_windows(TH, unreachable_after=3)
    return wq.Matcher(faults, windows=windows, th=TH, **kw)


def breach(wq, slice_id: int = 1, at: float = T0):
    return wq.Fault("leak", {"quota_breach": 0, "oom_exit": 0}, "quota_breach", at=at,
                    slice_id=slice_id)  # fmt: skip


def filed(wq, rule: str, at: float, pk: int = 1, **where):
    return wq.Filed(pk=pk, rule=rule, at=at, **where)


@pytest.mark.parametrize(
    ("seconds_after", "explained"),
    [
        (0, True),  # the sample that saw it begin
        (30, True),  # one sampling interval: the rule's own window
        (30 + 60, True),  # ... plus two sampling intervals
        (30 + 61, False),
        (-1, False),  # before the fault began: not its doing
        (73 * 60, False),  # what the old matching (about 73 minutes) took for it
    ],
)
def test_an_incident_is_the_faults_only_within_its_rules_window(wq, seconds_after, explained):
    f = breach(wq)
    i = filed(wq, "quota_breach", T0 + seconds_after, slice_id=1)
    assert matcher(wq, [f]).explains(f, i) is explained


def test_each_rules_window_comes_from_its_own_thresholds(wq):
    windows = wq.rule_windows(TH, unreachable_after=3)
    assert windows["quota_breach"] == 30
    assert windows["accounting_drift"] == TH.drift_samples * 30 == 60
    assert windows["idle_slice"] == TH.idle_after_s + 60 == 960
    assert windows["slow_leak"] == TH.leak_window_s + 60
    assert windows["node_unreachable"] == 3 * 30 + 60
    longer = wq.rule_windows(Thresholds(idle_after_s=1800, drift_samples=4), unreachable_after=5)
    assert (longer["idle_slice"], longer["accounting_drift"]) == (1860, 120)
    assert longer["node_unreachable"] == 5 * 30 + 60
    idle = wq.Fault("idle", {"idle_slice": 0}, "idle_slice", at=T0, slice_id=3)
    m = matcher(wq, [idle])
    assert m.explains(idle, filed(wq, "idle_slice", T0 + 930, slice_id=3))
    assert not m.explains(idle, filed(wq, "idle_slice", T0 + 960 + 61, slice_id=3))
    # a rule's condition may begin later than its fault: a static job passes its tier later
    static = wq.Fault("static", {"accounting_drift": 0, "quota_breach": 110},
                      "accounting_drift", at=T0, slice_id=4, strict=True)  # fmt: skip
    m = matcher(wq, [static])
    assert m.explains(static, filed(wq, "quota_breach", T0 + 140, slice_id=4))
    assert not m.explains(static, filed(wq, "quota_breach", T0 + 100, slice_id=4))


def test_an_incident_on_another_target_or_by_another_rule_is_false(wq):
    f = breach(wq, slice_id=1)
    card = wq.Fault("xid", {"hardware_fault": 0}, "hardware_fault", at=T0, gpu_id=5)
    node = wq.Fault("down", {"node_unreachable": 0}, "node_unreachable", at=T0, node_id=2)
    m = matcher(wq, [f, card, node])
    incidents = [
        filed(wq, "quota_breach", T0 + 30, pk=1, slice_id=2, gpu_id=5),  # a neighbour
        filed(wq, "idle_slice", T0 + 30, pk=2, slice_id=1),  # not a rule of the fault
        filed(wq, "hardware_fault", T0 + 30, pk=3, gpu_id=6, node_id=2),  # another card
        filed(wq, "node_unreachable", T0 + 60, pk=4, node_id=3),  # another node
        filed(wq, "quota_breach", T0 + 30, pk=5, slice_id=1),
        filed(wq, "hardware_fault", T0 + 30, pk=6, gpu_id=5),
        filed(wq, "node_unreachable", T0 + 120, pk=7, node_id=2),
    ]
    match = m.match(incidents)
    assert [i.pk for i in match.false] == [1, 2, 3, 4]
    assert {k: [i.pk for i in v] for k, v in match.by_fault.items()} == {0: [5], 1: [6], 2: [7]}


def card(wq, used: int, fault_used: int, quota: int = 4096, neighbour: int = 9000):
    return wq.CardSnapshot(24576, used, {1: (fault_used, quota), 2: (neighbour, 12288)})


def test_a_card_alarm_is_the_faults_only_when_its_own_memory_took_the_card_over(wq):
    f = breach(wq, slice_id=1)
    ledger = wq.CardLedger()
    # 85% of 24576 MiB is 20890 MiB
    ledger.record(7, T0 + 30, card(wq, used=21500, fault_used=4000))  # within its quota
    ledger.record(7, T0 + 60, card(wq, used=21500, fault_used=6000))  # 1904 MiB past it
    ledger.record(7, T0 + 90, card(wq, used=23000, fault_used=5096))  # 1000 past: not enough
    m = matcher(wq, [f], ledger=ledger, slice_gpu={1: 7})
    assert not m.explains(f, filed(wq, "vram_high", T0 + 30, gpu_id=7))  # the neighbours'
    assert m.explains(f, filed(wq, "vram_high", T0 + 60, gpu_id=7))
    assert not m.explains(f, filed(wq, "vram_high", T0 + 90, gpu_id=7))
    assert not m.explains(f, filed(wq, "vram_high", T0 + 60, gpu_id=8))  # not its card
    assert not m.explains(f, filed(wq, "vram_critical", T0 + 60, gpu_id=7))  # under 95%
    # nor a card alarm of a fault that has no memory of its own on the card
    xid = wq.Fault("xid", {"hardware_fault": 0}, "hardware_fault", at=T0, gpu_id=7)
    assert not matcher(wq, [xid], ledger=ledger).explains(xid, filed(wq, "vram_high", T0 + 60,
                                                                     gpu_id=7))  # fmt: skip


def test_a_sweeps_rise_is_the_faults_when_its_own_memory_rose_that_much(wq):
    f = breach(wq, slice_id=1)
    ledger = wq.CardLedger()
    ledger.record(7, T0, card(wq, used=12000, fault_used=4000))
    ledger.record(7, T0 + 240, card(wq, used=18000, fault_used=10000))  # 5904 MiB past
    ledger.record(3, T0, card(wq, used=8000, fault_used=0, neighbour=4000))
    ledger.record(3, T0 + 240, card(wq, used=15000, fault_used=0, neighbour=11000))
    m = matcher(wq, [f], ledger=ledger, slice_gpu={1: 7})
    assert m.explains(f, filed(wq, "fleet_sweep", T0 + 240, gpu_id=7))
    # a neighbour's own rise on another card, with the faulty slice's card map pointing
    # there: still not the fault's
    other = matcher(wq, [f], ledger=ledger, slice_gpu={1: 3})
    assert not other.explains(f, filed(wq, "fleet_sweep", T0 + 240, gpu_id=3))


def test_an_incident_filed_again_for_one_fault_is_a_duplicate(wq):
    f = breach(wq, slice_id=1)
    m = matcher(wq, [f])
    match = m.match(
        [
            filed(wq, "quota_breach", T0 + 30, pk=1, slice_id=1),
            filed(wq, "quota_breach", T0 + 60, pk=2, slice_id=1),  # after the first resolved
            filed(wq, "oom_exit", T0 + 60, pk=3, slice_id=1),  # another rule: not a duplicate
        ]
    )
    assert match.false == [] and [i.pk for i in match.duplicates] == [2]
    # two at once, one fault: the second is a duplicate too
    match = m.match([filed(wq, "quota_breach", T0 + 30, pk=k, slice_id=1) for k in (4, 5, 6)])
    assert [i.pk for i in match.duplicates] == [5, 6]


def test_a_strict_fault_is_caught_only_by_its_own_rule(wq):
    static = wq.Fault("static", {"accounting_drift": 0, "quota_breach": 110},
                      "accounting_drift", at=T0, slice_id=4, strict=True)  # fmt: skip
    leak = breach(wq, slice_id=5)
    m = matcher(wq, [static, leak])
    late = filed(wq, "quota_breach", T0 + 140, slice_id=4)
    assert m.caught(static, [late]) is None  # the library's books were never compared
    drift = filed(wq, "accounting_drift", T0 + 60, pk=2, slice_id=4)
    assert m.caught(static, [late, drift]) == drift
    oom = filed(wq, "oom_exit", T0 + 30, pk=3, slice_id=5)
    assert m.caught(leak, [oom]) == oom  # placed under a library, an OOM exit catches it


@pytest.mark.django_db(transaction=True)
def test_a_neighbours_burst_is_absorbed_by_preempting_interruptible_slices_only(
    settings, seeded_tiers, wq, tmp_path
):
    settings.NODES_CONTAINER_SETTLE_S = 0
    from _preemption import preemption_day  # noqa: PLC0415 - bench/ is on sys.path only now

    report = preemption_day(tmp_path, emulated_time=wq.emulated_time)
    lines = "\n".join(report.lines())
    assert report.peak_pct >= 85, lines  # the card really crossed its warning line
    assert report.hurt == [], lines  # no full-price slice stopped, failed or preempted
    assert report.short_of_memory == [], lines
    assert len(report.preempted) >= 1 and report.newest_first, lines
    assert len(report.preempted) < report.interruptible, lines  # only as many as needed
    assert report.resumable, lines  # stopped with its volumes kept, counted for ops
    assert report.billed_after_notice == 0, lines  # the grace period and after: not billed


# --- the day against the node lab (bench/_agent_lab.py)

LAB_RESULTS = {
    "lab_breach_to_kill_p95_ms",
    "lab_missed_kills",
    "lab_neighbour_short_s_max",
    "lab_neighbours_hurt",
    "lab_false_stops",
}


@pytest.fixture
def agent_lab(wq):
    from _agent_lab import SPECS, run_rounds  # noqa: PLC0415 - bench/ is on sys.path only now

    return SPECS, run_rounds


@pytest.mark.lab
@pytest.mark.django_db(transaction=True)
def test_one_lab_round_kills_both_offenders_and_stops_no_honest_slice(
    seeded_tiers, lab_fleet, agent_lab
):
    specs, run_rounds = agent_lab
    fleet = lab_fleet(specs)

    report = run_rounds(fleet.lab, fleet.registered, rounds=1)

    lines = "\n".join(report.lines())
    printed = results(report.lines())
    assert set(printed) >= LAB_RESULTS, lines
    assert report.missed == [] and len(report.kills_ms) == 2, lines  # static, zeroed books
    # three neighbours, the job that lifts its own limit, the MIG job: none touched
    assert report.honest == 5 and report.false_stops == [], lines
    assert len(report.neighbours) == 3 and all(n.probes > 5 for n in report.neighbours), lines
    assert printed["lab_false_stops"] == "0", lines
    assert "own-limit (round 1): refused by the quota library at 8000 MiB" in report.notes, lines


@pytest.mark.parametrize(("ci", "exits"), [("true", True), ("", False)])
def test_without_the_lab_it_says_why_and_fails_only_under_ci(settings, monkeypatch, wq, ci, exits):
    import _agent_lab  # noqa: PLC0415 - bench/ is on sys.path only now

    def unavailable(*args, **kwargs):
        raise _agent_lab.LabUnavailable("dockerd is not installed")

    monkeypatch.setattr(_agent_lab.Lab, "start", unavailable)
    monkeypatch.setenv("CI", ci)
    if exits:
        with pytest.raises(SystemExit) as done:
            _agent_lab.lab_main(rounds=1)
        assert "dockerd is not installed" in str(done.value.code)
    else:
        lines = _agent_lab.lab_main(rounds=1)
        assert lines == ["no lab run: the node lab cannot start here: dockerd is not installed"]
