"""Every benchmark that no other test loads runs here in a smoke mode: the same script and
functions as the full run, at tiny sizes, so a renamed argument or a changed service
breaks the suite instead of rotting the benchmark unseen. Each must exit 0 and print
every RESULT line it documents, in the house's form. No figure is asserted: these
machines are shared and noisy, and tiny sizes measure nothing worth holding."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci import missing

ROOT = Path(__file__).resolve().parent.parent
RESULT = re.compile(
    r"^RESULT (?P<metric>[a-z0-9_]+)=(?P<value>-?[0-9][0-9,.]*)"
    r"(?: (?P<unit>[A-Za-z/%]+))?(?: baseline=(?P<baseline>[0-9][0-9,.]*))?"
    r"(?: ratio=(?P<ratio>[0-9][0-9.e-]*))?$"
)

# bench -> (tiny arguments, the RESULT metrics it documents)
SMOKE: dict[str, tuple[list[str], set[str]]] = {
    "admission": (
        [
            "--gpus",
            "10",
            "--launches",
            "20",
            "--baseline-launches",
            "10",
            "--clients",
            "2",
            "--latency-runs",
            "2",
        ],
        {
            "admissions_per_s",
            "over_allocated_gpus",
            "launch_to_running_median_ms",
            "launch_to_running_p95_ms",
            "lab_launch_to_running_median_ms",
            "lab_launch_to_running_p95_ms",
        },
    ),  # fmt: skip
    "api_auth": (["--requests", "20"], {"token_auth_read_ms"}),
    "detection": (
        ["--runs", "2"],
        {"detection_to_stop_median_ms", "detection_to_stop_p95_ms", "end_to_end_p95_s"},
    ),
    "gateway": (
        ["--hold-s", "2", "--streams", "4", "--fetches", "1", "--payload-mb", "2"]
        + ["--setup-runs", "2", "--interval-s", "1"],
        {
            "gateway_throughput_mb_s",
            "gateway_throughput_ratio",
            "gateway_concurrent_ok",
            "gateway_setup_p95_ms",
        },
    ),
    "ingest": (["--nodes", "4", "--gpus", "2", "--rounds", "1"], {"ingest_rows_per_s"}),
    "pages_scale": (
        ["--small", "3", "--large", "6", "--incidents-small", "20", "--incidents-large", "60"],
        {
            f"{page}_{what}"
            for page in (
                "fleet",
                "fleet_refresh",
                "fleet_gpu_table",
                "node",
                "metrics",
                "ledger_page1",
                "ledger_filtered",
                "ledger_page500",
                "kpis_30d",
                "advisor_page",
                "advisor_api",
            )
            for what in ("ms", "growth", "queries")
        },
    ),  # fmt: skip
    "proxy": (
        ["--hold-s", "3", "--connections", "4", "--fetches", "1"]
        + ["--payload-mb", "2", "--ws-messages", "5", "--interval-s", "1"],
        {"proxy_throughput_mb_s", "proxy_ws_rtt_p95_ms", "proxy_concurrent_ok"},
    ),
    "sampling": (
        [
            "--nodes",
            "3",
            "--gpus",
            "2",
            "--rounds",
            "1",
            "--baseline-nodes",
            "2",
            "--lab-nodes",
            "1",
        ],
        {"node_samples_per_s", "lab_node_samples_per_s"},
    ),  # fmt: skip
    "telemetry_scale": (
        ["--nodes", "2", "--gpus", "2", "--rounds", "2"],
        {
            "ingest_rows_per_s",
            "prune_one_day_s",
            "prune_ratio",
            "prune_reclaim_s",
            "prune_wal_mib",
            "rollup_one_hour_s",
            "rollup_one_hour_python_mib",
            "advisor_30d_s",
        },
    ),  # fmt: skip
}


def run_bench(name: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        missing("the benchmarks run on PostgreSQL (set DATABASE_URL)")
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.lab  # admission and sampling measure on the node lab as well
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_benchmark_runs_at_tiny_sizes_and_prints_its_results(name):
    args, documented = SMOKE[name]
    done = run_bench(name, args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    malformed = [line for line in lines if not RESULT.match(line)]
    assert not malformed, malformed
    printed = {RESULT.match(line)["metric"] for line in lines}  # type: ignore[index]
    assert documented <= printed, f"missing: {sorted(documented - printed)}"
    for line in lines:
        match = RESULT.match(line)
        assert match is not None
        if match["ratio"] is not None:  # a ratio is to a baseline measured in the same run
            assert match["baseline"] is not None, line


def test_every_benchmark_is_smoked_or_loaded_by_a_test():
    """A new benchmark joins SMOKE, or a test of its own loads it (tests/bench_support)."""
    loaded = {"estimate", "estimator_truth", "watchdog_quality"}
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_")}
    assert scripts == set(SMOKE) | loaded, sorted(scripts ^ (set(SMOKE) | loaded))
