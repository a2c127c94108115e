"""Talking to the node agent (nodes/agent.py) from the platform: the argv and stdin that
run one of its modes over SSH, and what a report says of the agent. Pure: no Django."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import agent

# nodes.models.AgentState's values
OK, ABSENT, OLD, SILENT = "ok", "absent", "old", "silent"
# The loop writes its status every reading (at most a second apart): older than this and
# it is not running, whatever its pid file says.
STALE_AFTER_S = 5.0
INSTALL_TIMEOUT_S = 30.0
REPORT_TIMEOUT_S = 15.0
REINSTALL_AFTER_S = 30.0


@functools.lru_cache(maxsize=1)
def agent_preamble() -> bytes:
    source = Path(agent.__file__).read_bytes()
    return str(len(source)).encode() + b"\n" + source


def agent_argv(mode: str, *args: str) -> list[str]:
    return ["python3", "-c", agent.BOOTSTRAP, mode, *args]


@dataclass(frozen=True)
class Verdict:
    state: str
    reason: str
    version: str = ""


def agent_verdict(report: dict[str, Any]) -> Verdict:
    """Absent, old, not answering, or running, from one report."""
    if report.get("failed"):
        return Verdict(SILENT, str(report["failed"]))
    installed = str(report.get("installed_version") or "")
    status = report.get("status") if isinstance(report.get("status"), dict) else None
    running = str(status.get("version", "")) if status else ""
    if not installed:
        return Verdict(ABSENT, "The node agent is not installed.")
    if installed != agent.VERSION or (running and running != agent.VERSION):
        older = installed if installed != agent.VERSION else running
        return Verdict(
            OLD, f"The node has agent {older}; this platform ships {agent.VERSION}.", older
        )
    if status is None or not report.get("alive"):
        return Verdict(SILENT, "The node agent is not running.", installed)
    age = float(report.get("now", 0)) - float(status.get("last_loop_at", 0))
    if age > STALE_AFTER_S:
        return Verdict(SILENT, f"The node agent's last reading was {age:.0f} s ago.", installed)
    # one failed reading is not blindness: an error that lasts is
    since = status.get("error_since")
    if status.get("error") and float(report.get("now", 0)) - float(since or 0) > STALE_AFTER_S:
        return Verdict(SILENT, f"The node agent cannot read the GPUs: {status['error']}"[:500])
    return Verdict(OK, "", running)
