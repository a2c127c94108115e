"""Unit tests for the pure detection rules (incidents.rules).

No database and no Django models: every rule is a plain function from views to
findings, checked against docs/domain.md's defaults (rules.Thresholds()).
"""

import random

import pytest

from incidents import rules
from incidents.rules import GpuView, ProcessView, SliceView, Thresholds

TH = Thresholds()


def _gpu(used_mb: int, total_mb: int = 10_000, **kw) -> GpuView:
    data = {"gpu_id": 7, "node_id": 3, "uuid": "GPU-abcdef123456-7890", **kw}
    return GpuView(total_mb=total_mb, used_mb=used_mb, **data)


def _slice(**kw) -> SliceView:
    data = {
        "slice_id": 42,
        "tenant_id": 9,
        "gpu_id": 7,
        "node_id": 3,
        "container_id": "ctr-slice-42",
        "quota_mb": 8192,
        **kw,
    }
    return SliceView(**data)


def _proc(**kw) -> ProcessView:
    data = {"gpu_id": 7, "pid": 1234, "used_mb": 2000, **kw}
    return ProcessView(**data)


def _by_rule(findings: list[rules.Finding]) -> dict[str, rules.Finding]:
    by_rule = {f.rule: f for f in findings}
    assert len(by_rule) == len(findings), "one finding per rule"
    return by_rule


def _actions(findings: list[rules.Finding]) -> list[str]:
    return [f.action for f in findings if f.action]


def _series(values: list[int], step_s: float = 30.0) -> list[tuple[float, int]]:
    return [(i * step_s, mb) for i, mb in enumerate(values)]


# --- defaults ---------------------------------------------------------------------------------


def test_thresholds_defaults_are_domain_md_numbers():
    assert TH.vram_warning_pct == 85.0
    assert TH.vram_critical_pct == 95.0
    assert TH.breaker_reset_pct == 85.0
    assert TH.process_jump_mb == 3072
    assert TH.sweep_high_pct == 90.0
    assert TH.sweep_rise_mb == 5120
    assert TH.sweep_window_s == 300
    assert TH.leak_window_s == 1800
    assert TH.idle_after_s == 900
    assert TH.bandwidth_pct == 70.0
    assert TH.quota_grace_samples == 1


# --- vram_pressure ----------------------------------------------------------------------------


def test_vram_just_under_the_warning_line_neither_warns_nor_clears():
    # 84.9%: a card hovering at the line must not open and close incidents
    assert rules.vram_pressure(_gpu(8490), TH) == []


def test_vram_well_below_warning_only_resolves_the_high_finding():
    findings = rules.vram_pressure(_gpu(7990), TH)  # 79.9%: 5 points under the line
    assert len(findings) == 1
    (f,) = findings
    assert f.rule == "vram_high"
    assert f.resolves is True
    assert f.action == ""
    assert f.target == "gpu:GPU-abcdef123456-7890"


def test_vram_at_85_percent_is_a_warning_without_action():
    findings = _by_rule(rules.vram_pressure(_gpu(8500), TH))
    assert set(findings) == {"vram_high"}
    f = findings["vram_high"]
    assert f.severity == rules.WARNING
    assert f.root_cause == rules.NO_ISOLATION
    assert f.resolves is False
    assert f.action == ""
    assert f.gpu_id == 7
    assert f.node_id == 3
    assert f.evidence == {"used_mb": 8500, "total_mb": 10_000, "percent": 85.0}


def test_vram_at_95_percent_is_critical_and_closes_the_gpu():
    findings = _by_rule(rules.vram_pressure(_gpu(9500), TH))
    assert set(findings) == {"vram_critical", "vram_high"}
    crit = findings["vram_critical"]
    assert crit.severity == rules.CRITICAL
    assert crit.action == rules.CLOSE_GPU
    assert crit.resolves is False
    assert findings["vram_high"].resolves is False
    assert _actions(list(findings.values())) == [rules.CLOSE_GPU]


def test_vram_just_below_95_percent_does_not_close_the_gpu():
    findings = _by_rule(rules.vram_pressure(_gpu(9499), TH))
    assert "vram_critical" not in findings
    assert _actions(list(findings.values())) == []


def test_breaker_stays_open_at_90_percent_above_the_reset_line():
    findings = rules.vram_pressure(_gpu(9000, breaker_open=True), TH)
    assert rules.OPEN_GPU not in _actions(findings)
    assert rules.CLOSE_GPU not in _actions(findings)
    assert "vram_critical" not in _by_rule(findings)  # nothing resolves the breaker yet


def test_breaker_stays_open_exactly_at_the_reset_line():
    findings = rules.vram_pressure(_gpu(8500, breaker_open=True), TH)
    assert _actions(findings) == []


def test_breaker_reopens_below_85_percent_and_resolves():
    findings = _by_rule(rules.vram_pressure(_gpu(8400, breaker_open=True), TH))
    crit = findings["vram_critical"]
    assert crit.action == rules.OPEN_GPU
    assert crit.resolves is True
    assert "vram_high" not in findings  # the warning clears only under 80%


def test_breaker_already_open_at_96_percent_does_not_close_again():
    findings = _by_rule(rules.vram_pressure(_gpu(9600, breaker_open=True), TH))
    crit = findings["vram_critical"]
    assert crit.action == ""
    assert crit.resolves is False  # the incident stays open, just no second CLOSE_GPU
    assert _actions(list(findings.values())) == []


def test_breaker_hovering_between_94_and_96_percent_does_not_flap():
    breaker_open = False
    actions = []
    for used in [9400, 9600, 9400, 9500, 9450, 9600, 9400]:
        for f in rules.vram_pressure(_gpu(used, breaker_open=breaker_open), TH):
            if f.action == rules.CLOSE_GPU:
                breaker_open = True
            elif f.action == rules.OPEN_GPU:
                breaker_open = False
            if f.action:
                actions.append(f.action)
    assert actions == [rules.CLOSE_GPU]
    assert breaker_open is True


def test_vram_zero_total_gpu_does_not_divide_by_zero():
    findings = _by_rule(rules.vram_pressure(_gpu(0, total_mb=0), TH))
    assert set(findings) == {"vram_high"}
    assert findings["vram_high"].resolves is True
    assert findings["vram_high"].evidence["percent"] == 0.0
    # used memory on a card reporting no total must not crash either
    assert rules.vram_pressure(_gpu(500, total_mb=0), TH)


def test_custom_critical_threshold_changes_the_verdict():
    gpu = _gpu(9200)  # 92%
    assert rules.CLOSE_GPU not in _actions(rules.vram_pressure(gpu, TH))
    custom = Thresholds(vram_critical_pct=90)
    assert _actions(rules.vram_pressure(gpu, custom)) == [rules.CLOSE_GPU]


def test_custom_warning_threshold_changes_the_verdict():
    gpu = _gpu(7900)  # 79%
    assert _by_rule(rules.vram_pressure(gpu, TH))["vram_high"].resolves is True
    custom = Thresholds(vram_warning_pct=79)
    assert _by_rule(rules.vram_pressure(gpu, custom))["vram_high"].resolves is False


def test_custom_reset_threshold_changes_when_the_breaker_reopens():
    gpu = _gpu(8000, breaker_open=True)  # 80%
    assert _actions(rules.vram_pressure(gpu, TH)) == [rules.OPEN_GPU]
    custom = Thresholds(breaker_reset_pct=75)
    assert _actions(rules.vram_pressure(gpu, custom)) == []


@pytest.mark.parametrize("seed", range(5))
def test_vram_pressure_property_never_opens_and_closes_at_once(seed):
    rng = random.Random(seed)
    for _ in range(400):
        total = rng.choice([0, 1, 4096, 24_564, 81_920, rng.randint(1, 200_000)])
        used = rng.randint(0, max(total, 1) + 2000)
        gpu = _gpu(used, total_mb=total, breaker_open=rng.random() < 0.5)
        critical = rng.choice([TH.vram_critical_pct, rng.uniform(50, 100)])
        reset = rng.uniform(30, critical)
        th = Thresholds(vram_critical_pct=critical, breaker_reset_pct=reset)
        findings = rules.vram_pressure(gpu, th)
        actions = _actions(findings)
        pct = 100.0 * used / total if total > 0 else 0.0
        assert not (rules.CLOSE_GPU in actions and rules.OPEN_GPU in actions), gpu
        if rules.CLOSE_GPU in actions:
            assert pct >= critical, (gpu, th)
            assert not gpu.breaker_open
        if rules.OPEN_GPU in actions:
            assert pct < reset, (gpu, th)
            assert gpu.breaker_open
        assert len(actions) <= 1


# --- quota_breach -----------------------------------------------------------------------------


def test_slice_under_quota_has_no_breach():
    assert rules.quota_breach(_slice(used_mb=4000, over_quota_streak=0), TH) == []


def test_slice_exactly_at_quota_has_no_breach():
    assert rules.quota_breach(_slice(used_mb=8192, over_quota_streak=0), TH) == []


def test_first_sample_over_quota_is_a_breach_within_grace_without_action():
    (f,) = rules.quota_breach(_slice(used_mb=8193, over_quota_streak=1), TH)
    assert f.rule == "quota_breach"
    assert f.severity == rules.CRITICAL
    assert f.root_cause == rules.NO_ISOLATION
    assert f.action == ""


def test_second_sample_over_quota_stops_the_slice():
    (f,) = rules.quota_breach(_slice(used_mb=9000, over_quota_streak=2), TH)
    assert f.action == rules.STOP_SLICE


def test_quota_breach_names_the_slice_tenant_and_evidence():
    (f,) = rules.quota_breach(_slice(used_mb=9000, over_quota_streak=2), TH)
    assert f.target == "slice:42"
    assert f.slice_id == 42
    assert f.tenant_id == 9
    assert f.gpu_id == 7
    assert f.node_id == 3
    assert f.evidence["used_mb"] == 9000
    assert f.evidence["quota_mb"] == 8192
    assert f.evidence["container_id"] == "ctr-slice-42"


def test_custom_quota_grace_delays_the_stop():
    s = _slice(used_mb=9000, over_quota_streak=2)
    (f,) = rules.quota_breach(s, Thresholds(quota_grace_samples=2))
    assert f.action == ""
    (f,) = rules.quota_breach(
        _slice(used_mb=9000, over_quota_streak=3), Thresholds(quota_grace_samples=2)
    )
    assert f.action == rules.STOP_SLICE


# --- process_jump -----------------------------------------------------------------------------


def test_process_jump_of_exactly_3072_mib_is_not_anomalous():
    p = _proc(used_mb=5072, previous_used_mb=2000)
    assert rules.process_jump(p, TH, owner=None) == []


def test_process_jump_of_3073_mib_is_anomalous():
    p = _proc(used_mb=5073, previous_used_mb=2000)
    (f,) = rules.process_jump(p, TH, owner=None)
    assert f.rule == "process_jump"
    assert f.target == "process:7:1234"
    assert f.root_cause == rules.APP_PARAMETERS
    assert f.evidence == {"pid": 1234, "from_mb": 2000, "to_mb": 5073}
    assert f.slice_id is None
    assert f.tenant_id is None


def test_process_without_previous_reading_is_not_a_jump():
    p = _proc(used_mb=20_000, previous_used_mb=None)
    assert rules.process_jump(p, TH, owner=None) == []


def test_process_shrinking_is_not_a_jump():
    p = _proc(used_mb=1000, previous_used_mb=9000)
    assert rules.process_jump(p, TH, owner=None) == []


def test_process_jump_carries_its_owner():
    p = _proc(used_mb=8000, previous_used_mb=1000)
    (f,) = rules.process_jump(p, TH, owner=_slice())
    assert f.slice_id == 42
    assert f.tenant_id == 9
    assert f.node_id == 3
    assert f.gpu_id == 7


def test_custom_process_jump_threshold_is_honoured():
    p = _proc(used_mb=3000, previous_used_mb=1000)
    assert rules.process_jump(p, TH, owner=None) == []
    assert len(rules.process_jump(p, Thresholds(process_jump_mb=1024), owner=None)) == 1


# --- bandwidth --------------------------------------------------------------------------------


def test_bandwidth_over_70_percent_throttles():
    (f,) = rules.bandwidth(_proc(memory_utilization=71), TH, owner=_slice())
    assert f.rule == "bandwidth_hog"
    assert f.action == rules.THROTTLE
    assert f.resolves is False
    assert f.target == "slice:42"
    assert f.slice_id == 42
    assert f.tenant_id == 9
    assert f.evidence["memory_utilization"] == 71


def test_bandwidth_still_over_limit_keeps_throttling_every_sample():
    (f,) = rules.bandwidth(_proc(memory_utilization=90), TH, owner=_slice(throttled=True))
    assert f.action == rules.THROTTLE  # another duty cycle for the next interval
    assert f.resolves is False


def test_bandwidth_at_70_percent_while_throttled_unthrottles_and_resolves():
    (f,) = rules.bandwidth(_proc(memory_utilization=70), TH, owner=_slice(throttled=True))
    assert f.action == rules.UNTHROTTLE
    assert f.resolves is True


def test_bandwidth_below_limit_while_throttled_unthrottles():
    (f,) = rules.bandwidth(_proc(memory_utilization=10), TH, owner=_slice(throttled=True))
    assert f.action == rules.UNTHROTTLE


def test_bandwidth_at_70_percent_unthrottled_is_nothing():
    assert rules.bandwidth(_proc(memory_utilization=70), TH, owner=_slice()) == []


def test_bandwidth_without_owner_is_nothing():
    assert rules.bandwidth(_proc(memory_utilization=99), TH, owner=None) == []


def test_bandwidth_without_utilization_reading_is_nothing():
    assert rules.bandwidth(_proc(memory_utilization=None), TH, owner=_slice()) == []
    assert rules.bandwidth(_proc(memory_utilization=None), TH, owner=_slice(throttled=True)) == []


def test_custom_bandwidth_threshold_is_honoured():
    p = _proc(memory_utilization=60)
    assert rules.bandwidth(p, TH, owner=_slice()) == []
    (f,) = rules.bandwidth(p, Thresholds(bandwidth_pct=50), owner=_slice())
    assert f.action == rules.THROTTLE


# --- orphans ----------------------------------------------------------------------------------


def test_process_in_a_known_slice_container_is_not_an_orphan():
    p = _proc(container_id="ctr-slice-42", used_mb=3000)
    assert rules.orphans(_gpu(3000), [p], {"ctr-slice-42"}, TH, streaks={}) == []


def test_process_in_unknown_container_first_sighting_is_orphan_without_action():
    p = _proc(container_id="ctr-stale", used_mb=3000)
    (f,) = rules.orphans(_gpu(3000), [p], {"ctr-slice-42"}, TH, streaks={})
    assert f.rule == "orphan_process"
    assert f.target == "process:7:1234"
    assert f.root_cause == rules.RECLAIM_FAILURE
    assert f.node_id == 3
    assert f.action == ""
    assert f.evidence["seen"] == 1
    assert f.evidence["container_id"] == "ctr-stale"


def test_orphan_confirmed_on_consecutive_samples_is_ended():
    p = _proc(container_id="ctr-stale", used_mb=3000)
    streaks = {(7, 1234): TH.orphan_confirm_samples - 1}
    (f,) = rules.orphans(_gpu(3000), [p], {"ctr-slice-42"}, TH, streaks=streaks)
    assert f.action == rules.END_ORPHAN
    assert f.evidence["seen"] == TH.orphan_confirm_samples


def test_orphan_streak_of_another_pid_does_not_confirm():
    p = _proc(container_id="ctr-stale", used_mb=3000)
    (f,) = rules.orphans(_gpu(3000), [p], set(), TH, streaks={(7, 9999): 5, (8, 1234): 5})
    assert f.action == ""


def test_process_without_container_is_an_orphan():
    p = _proc(container_id="", used_mb=3000)
    (f,) = rules.orphans(_gpu(3000), [p], {"ctr-slice-42"}, TH, streaks={})
    assert f.rule == "orphan_process"


def test_process_holding_no_memory_is_ignored():
    p = _proc(container_id="ctr-stale", used_mb=0)
    assert rules.orphans(_gpu(0), [p], set(), TH, streaks={}) == []


def test_used_memory_with_no_process_is_unattributed():
    (f,) = rules.orphans(_gpu(1025), [], set(), TH, streaks={})
    assert f.rule == "unattributed_memory"
    assert f.target == "gpu:GPU-abcdef123456-7890"
    assert f.root_cause == rules.RECLAIM_FAILURE
    assert f.evidence == {"used_mb": 1025, "processes": 0}


def test_used_memory_up_to_1024_mib_with_no_process_is_not_flagged():
    assert rules.orphans(_gpu(1024), [], set(), TH, streaks={}) == []


def test_used_memory_with_processes_present_is_not_unattributed():
    p = _proc(container_id="ctr-slice-42", used_mb=500)
    assert rules.orphans(_gpu(9000), [p], {"ctr-slice-42"}, TH, streaks={}) == []


def test_custom_orphan_confirmation_is_honoured():
    p = _proc(container_id="ctr-stale", used_mb=3000)
    (f,) = rules.orphans(_gpu(3000), [p], set(), Thresholds(orphan_confirm_samples=1), streaks={})
    assert f.action == rules.END_ORPHAN


# --- hardware ---------------------------------------------------------------------------------

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
XID13 = "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception"


def test_xid_79_is_a_critical_hardware_fault_that_drains_the_gpu():
    (f,) = rules.hardware(
        _gpu(0), xids=[(79, XID79)], ecc_uncorrected=0, remapped_rows_failure=False
    )
    assert f.rule == "hardware_fault"
    assert f.severity == rules.CRITICAL
    assert f.root_cause == rules.HARDWARE
    assert f.action == rules.DRAIN_GPU
    assert f.target == "gpu:GPU-abcdef123456-7890"
    assert f.evidence["xid_lines"] == [XID79]
    assert "Xid 79" in f.title


def test_xid_13_alone_is_an_application_fault_not_hardware():
    assert (
        rules.hardware(
            _gpu(0), xids=[(13, XID13)], ecc_uncorrected=None, remapped_rows_failure=False
        )
        == []
    )


def test_xid_13_next_to_79_keeps_only_the_hardware_line():
    (f,) = rules.hardware(
        _gpu(0), xids=[(13, XID13), (79, XID79)], ecc_uncorrected=None, remapped_rows_failure=False
    )
    assert f.evidence["xid_lines"] == [XID79]


def test_uncorrectable_ecc_errors_are_a_hardware_fault():
    (f,) = rules.hardware(_gpu(0), xids=[], ecc_uncorrected=2, remapped_rows_failure=False)
    assert f.action == rules.DRAIN_GPU
    assert f.evidence["ecc_uncorrected"] == 2


def test_zero_or_unknown_ecc_count_is_not_a_fault():
    assert rules.hardware(_gpu(0), xids=[], ecc_uncorrected=0, remapped_rows_failure=False) == []
    assert rules.hardware(_gpu(0), xids=[], ecc_uncorrected=None, remapped_rows_failure=False) == []


def test_remapped_rows_failure_is_a_hardware_fault():
    (f,) = rules.hardware(_gpu(0), xids=[], ecc_uncorrected=None, remapped_rows_failure=True)
    assert f.action == rules.DRAIN_GPU
    assert f.evidence["remapped_rows_failure"] is True


def test_already_drained_gpu_is_not_drained_twice():
    (f,) = rules.hardware(
        _gpu(0, hardware_drained=True),
        xids=[(79, XID79)],
        ecc_uncorrected=None,
        remapped_rows_failure=False,
    )
    assert f.rule == "hardware_fault"
    assert f.action == ""


# --- unreachable ------------------------------------------------------------------------------


def test_unreachable_node_is_a_connectivity_incident_that_notifies_tenants():
    f = rules.unreachable(3, "gpu-node-a", "ssh: connect timed out")
    assert f.rule == "node_unreachable"
    assert f.target == "node:gpu-node-a"
    assert f.root_cause == rules.CONNECTIVITY
    assert f.severity == rules.CRITICAL
    assert f.action == rules.NOTIFY_TENANTS
    assert f.node_id == 3
    assert f.evidence["reason"] == "ssh: connect timed out"


def test_unreachable_reason_is_truncated():
    f = rules.unreachable(3, "n", "x" * 1000)
    assert len(f.detail) == 300
    assert len(f.evidence["reason"]) == 300


# --- fleet_sweep ------------------------------------------------------------------------------


def test_sweep_flags_a_card_above_90_percent():
    gpu = _gpu(9100)
    (f,) = rules.fleet_sweep(gpu, [(0.0, 9100), (30.0, 9100)], TH)
    assert f.rule == "fleet_sweep"
    assert f.resolves is False
    assert f.evidence["percent"] == 91.0


def test_sweep_card_at_exactly_90_percent_is_normal():
    (f,) = rules.fleet_sweep(_gpu(9000), [(0.0, 9000)], TH)
    assert f.resolves is True


def test_sweep_flags_a_rise_of_5121_mib_within_300_s():
    gpu = _gpu(15_121, total_mb=80_000)
    series = [(0.0, 10_000), (150.0, 12_000), (300.0, 15_121)]
    (f,) = rules.fleet_sweep(gpu, series, TH)
    assert f.resolves is False
    assert f.evidence["rise_mb"] == 5121


def test_sweep_does_not_flag_a_rise_of_exactly_5120_mib():
    gpu = _gpu(15_120, total_mb=80_000)
    (f,) = rules.fleet_sweep(gpu, [(0.0, 10_000), (300.0, 15_120)], TH)
    assert f.resolves is True


def test_sweep_does_not_flag_the_same_rise_spread_over_10_minutes():
    gpu = _gpu(15_121, total_mb=80_000)
    # every 30 s for 10 minutes, rising 5121 MiB overall: the 5-minute window sees half
    series = [(i * 30.0, 10_000 + round(5121 * i / 20)) for i in range(21)]
    assert series[-1][1] - series[0][1] == 5121
    (f,) = rules.fleet_sweep(gpu, series, TH)
    assert f.resolves is True
    assert f.evidence["rise_mb"] < TH.sweep_rise_mb


def test_sweep_does_not_count_a_rise_its_slices_hold_within_their_quotas():
    gpu = _gpu(16_000, total_mb=80_000)
    series = [(0.0, 10_000), (150.0, 13_000), (300.0, 16_000)]
    # a training slice grew from 2 GB to 8 GB, its quota 12 GB: what was sold
    in_quota = {0.0: 2_000, 150.0: 5_000, 300.0: 8_000}
    (f,) = rules.fleet_sweep(gpu, series, TH, in_quota=in_quota)
    assert f.resolves is True
    assert f.evidence["rise_mb"] == 0


def test_sweep_counts_the_rise_beyond_what_slices_hold_within_quota():
    gpu = _gpu(17_000, total_mb=80_000)
    series = [(0.0, 10_000), (300.0, 17_000)]
    # a slice grew 1 GB within quota; the other 6 GB belong to nobody
    (f,) = rules.fleet_sweep(gpu, series, TH, in_quota={0.0: 4_000, 300.0: 5_000})
    assert f.resolves is False
    assert f.evidence["rise_mb"] == 6_000
    assert "6000 MiB" in f.title


def test_sweep_normal_card_resolves():
    (f,) = rules.fleet_sweep(_gpu(4000), _series([4000] * 11), TH)
    assert f.resolves is True
    assert f.action == ""
    assert f.title == "Card back to normal"


def test_sweep_with_no_series_judges_on_percent_alone():
    assert rules.fleet_sweep(_gpu(4000), [], TH)[0].resolves is True
    assert rules.fleet_sweep(_gpu(9500), [], TH)[0].resolves is False


def test_custom_sweep_thresholds_are_honoured():
    (f,) = rules.fleet_sweep(_gpu(8600), [(0.0, 8600)], Thresholds(sweep_high_pct=85))
    assert f.resolves is False
    series = [(0.0, 1000), (60.0, 3000)]
    assert rules.fleet_sweep(_gpu(3000), series, TH)[0].resolves is True
    assert (
        rules.fleet_sweep(_gpu(3000), series, Thresholds(sweep_rise_mb=1024))[0].resolves is False
    )


# --- leak_or_burst and slow_leak --------------------------------------------------------------


def _steady(per_sample: int, minutes: int, start: int = 2000) -> list[tuple[float, int]]:
    n = minutes * 2  # one sample every 30 s
    return _series([start + per_sample * i for i in range(n + 1)])


def test_steady_growth_over_30_minutes_is_a_leak():
    series = _steady(40, 30)
    assert series[-1][0] == 1800.0
    assert rules.leak_or_burst(series, TH) == "leak"


def test_steady_growth_over_30_minutes_is_a_slow_leak_finding():
    series = _steady(40, 30)
    (f,) = rules.slow_leak(_slice(), series, TH)
    assert f.rule == "slow_leak"
    assert f.target == "slice:42"
    assert f.root_cause == rules.RECLAIM_FAILURE
    assert f.slice_id == 42
    assert f.tenant_id == 9
    assert f.evidence == {"growth_mb": 2400, "minutes": 30.0, "points": 61, "since_epoch": 0.0}


def test_one_3gb_jump_then_flat_is_a_burst_not_a_leak():
    values = [2000] * 10 + [5072] * 51
    series = _series(values)
    assert rules.leak_or_burst(series, TH) == "burst"
    assert rules.slow_leak(_slice(), series, TH) == []


def test_growth_over_only_10_minutes_does_not_cover_the_window():
    series = _steady(200, 10)
    assert series[-1][1] - series[0][1] >= TH.leak_min_growth_mb
    assert rules.leak_or_burst(series, TH) is None
    assert rules.slow_leak(_slice(), series, TH) == []


def test_noisy_up_and_down_without_net_growth_is_neither():
    rng = random.Random(1)
    values = [4000 + rng.randint(-300, 300) for _ in range(61)]
    values[-1] = values[0]
    assert rules.leak_or_burst(_series(values), TH) is None


def test_sawtooth_with_net_growth_is_not_a_leak():
    # +100, -50 alternating: 1500 MiB net over 30 min, but half the steps fall
    values = [2000]
    for i in range(60):
        values.append(values[-1] + (100 if i % 2 == 0 else -50))
    series = _series(values)
    assert series[-1][1] - series[0][1] == 1500
    assert rules.leak_or_burst(series, TH) is None


def test_steady_growth_below_min_growth_is_not_a_leak():
    series = _steady(15, 30)  # 900 MiB < 1024
    assert rules.leak_or_burst(series, TH) is None
    assert rules.slow_leak(_slice(), series, TH) == []


def test_one_jump_carrying_most_growth_on_top_of_slow_creep_is_a_burst():
    # 59 steps of +20 MiB and one jump of 1800 MiB: the jump is ~60% of the growth
    values = [2000]
    for i in range(60):
        values.append(values[-1] + (1800 if i == 30 else 20))
    series = _series(values)
    assert series[-1][1] - series[0][1] == 2980
    assert rules.leak_or_burst(series, TH) == "burst"
    assert rules.slow_leak(_slice(), series, TH) == []


def test_growth_with_a_third_of_steps_falling_is_not_steady():
    # up 60, up 60, down 30, repeated: 2/3 of steps rise, 1/3 fall, 1800 MiB net
    values = [2000]
    for i in range(60):
        values.append(values[-1] + (-30 if i % 3 == 2 else 60))
    series = _series(values)
    assert series[-1][1] - series[0][1] == 1800
    assert rules.leak_or_burst(series, TH) is None


def test_growth_in_only_a_third_of_steps_is_not_a_leak():
    # +80 MiB every third sample, flat otherwise: 1600 MiB net, but most steps do not rise
    values = [2000]
    for i in range(60):
        values.append(values[-1] + (80 if i % 3 == 0 else 0))
    series = _series(values)
    assert series[-1][1] - series[0][1] == 1600
    assert rules.leak_or_burst(series, TH) is None


def test_too_few_points_is_neither():
    assert rules.leak_or_burst([(0.0, 0), (900.0, 2000), (1800.0, 4000)], TH) is None


def test_two_equal_jumps_then_flat_is_a_burst():
    values = [2000] * 10 + [3600] * 20 + [5200] * 31  # two jumps of 1600 MiB
    assert rules.leak_or_burst(_series(values), TH) == "burst"


def test_custom_leak_window_is_honoured():
    series = _steady(200, 10)  # covers 600 s
    assert rules.leak_or_burst(series, TH) is None
    assert rules.leak_or_burst(series, Thresholds(leak_window_s=600)) == "leak"


# --- idle -------------------------------------------------------------------------------------


def test_idle_14_minutes_is_nothing():
    assert rules.idle(_slice(), idle_for_s=14 * 60, warned_for_s=None, th=TH) == []


def test_idle_15_minutes_never_warned_warns_the_tenant():
    (f,) = rules.idle(_slice(), idle_for_s=15 * 60, warned_for_s=None, th=TH)
    assert f.rule == "idle_slice"
    assert f.action == rules.WARN_IDLE
    assert f.severity == rules.INFO
    assert f.root_cause == rules.RECLAIM_FAILURE
    assert f.target == "slice:42"
    assert f.tenant_id == 9


def test_idle_warned_4_minutes_ago_waits_without_action():
    (f,) = rules.idle(_slice(), idle_for_s=19 * 60, warned_for_s=4 * 60, th=TH)
    assert f.action == ""
    assert f.severity == rules.INFO


def test_idle_warned_5_minutes_ago_stops_the_slice():
    (f,) = rules.idle(_slice(used_mb=6000), idle_for_s=20 * 60, warned_for_s=5 * 60, th=TH)
    assert f.action == rules.STOP_SLICE
    assert f.severity == rules.WARNING
    assert f.evidence == {"idle_s": 1200, "used_mb": 6000, "since_epoch": None}


def test_idle_none_means_it_computed():
    assert rules.idle(_slice(), idle_for_s=None, warned_for_s=None, th=TH) == []
    assert rules.idle(_slice(), idle_for_s=None, warned_for_s=600, th=TH) == []


def test_custom_idle_thresholds_are_honoured():
    th = Thresholds(idle_after_s=600, idle_stop_after_s=60)
    (f,) = rules.idle(_slice(), idle_for_s=600, warned_for_s=None, th=th)
    assert f.action == rules.WARN_IDLE
    (f,) = rules.idle(_slice(), idle_for_s=700, warned_for_s=60, th=th)
    assert f.action == rules.STOP_SLICE


# --- findings ---------------------------------------------------------------------------------


def test_finding_key_is_rule_and_target():
    (f,) = rules.quota_breach(_slice(used_mb=9000, over_quota_streak=1), TH)
    assert f.key == ("quota_breach", "slice:42")


# --- two counts of a slice's memory ------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml", "library", "apart"),
    [
        (4000, 3600, False),  # 400 MiB apart: under 512 (10% would be 400)
        (4000, 3400, True),  # 600 apart: over 512
        (8000, 7400, False),  # 600 apart: under 10% of 8000, the larger
        (8000, 7100, True),  # 900 apart: over 800
        (3000, 0, True),  # the library counts nothing: not loaded, or failing open
    ],
)
def test_accounting_drift_needs_the_larger_of_512_mib_and_10_percent(nvml, library, apart):
    [found] = rules.accounting_drift(_slice(), nvml_mb=nvml, library_mb=library, streak=2, th=TH)
    assert (not found.resolves) == apart


def test_accounting_drift_opens_on_the_second_sample_with_both_numbers():
    assert rules.accounting_drift(_slice(), nvml_mb=5000, library_mb=3000, streak=1, th=TH) == []
    [finding] = rules.accounting_drift(_slice(), nvml_mb=5000, library_mb=3000, streak=2, th=TH)
    assert finding.rule == "accounting_drift" and not finding.resolves
    assert finding.evidence == {
        "nvml_mb": 5000,
        "library_mb": 3000,
        "difference_mb": 2000,
        "threshold_mb": 512,
        "samples": 2,
    }
    assert "NVML counts 5000 MiB, the quota library 3000 MiB" in finding.title
    [back] = rules.accounting_drift(_slice(), nvml_mb=5000, library_mb=4900, streak=0, th=TH)
    assert back.resolves and back.target == finding.target


def test_memory_the_quota_library_does_not_see_stops_the_slice_alone():
    """NVML above the library's books: something escaped the library (a static job, raw
    device calls, books written over), so nothing inside holds that memory to the quota."""
    [escaped] = rules.accounting_drift(_slice(), nvml_mb=3000, library_mb=0, streak=2, th=TH)
    assert escaped.severity == rules.CRITICAL and escaped.action == rules.STOP_SLICE
    assert "Stopping its container alone" in escaped.detail
    # the library counting more than NVML sees harms nobody else: a warning, no stop
    [over] = rules.accounting_drift(_slice(), nvml_mb=0, library_mb=3000, streak=2, th=TH)
    assert over.severity == rules.WARNING and over.action == ""
