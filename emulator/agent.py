"""The node agent on an emulated node: installed, started and reporting as the platform
expects (nodes/agent.py's `install` and `report`), with an empty journal. An emulated node
has no real processes to watch; its quotas are the emulator's own (emulator/vram.py). The
real agent runs on the node lab, where the proof of its enforcement is."""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass

from .shell import Invocation

MARKER = "AGENT_SOURCE"  # in the bootstrap the platform runs (nodes.agent.BOOTSTRAP)
_VERSION_RE = re.compile(rb'^VERSION = "([^"]+)"', re.M)


@dataclass
class EmulatedAgent:
    version: str = ""  # installed, "" when not
    running: bool = False
    stopped_at: float = 0.0
    started_at: float = 0.0
    journal_id: str = ""
    pid: int = 0


def is_agent(argv: list[str]) -> bool:
    at = argv.index("-c") + 1 if "-c" in argv else len(argv)
    return at < len(argv) and MARKER in argv[at]


def cmd_agent(agent: EmulatedAgent, inv: Invocation) -> int:
    args = inv.argv[inv.argv.index("-c") + 2 :]
    mode = args[0] if args else ""
    length, _, rest = inv.stdin.read().partition(b"\n")
    source = rest[: int(length)] if length.strip().isdigit() else b""
    found = _VERSION_RE.search(source)
    if mode == "install" and found:
        agent.version = found.group(1).decode()
        agent.running, agent.started_at = True, time.time()
        agent.journal_id = agent.journal_id or uuid.uuid4().hex
        agent.pid = 40000 + int(agent.started_at) % 10000
        doc = {"installed": agent.version, "started": True, "supervisor": "self"}
        inv.out(json.dumps({"schema": 1, **doc}) + "\n")
        return 0
    if mode == "report":
        inv.out(json.dumps(report(agent, found.group(1).decode() if found else "")) + "\n")
        return 0
    if mode == "stop":
        agent.running, agent.stopped_at = False, time.time()
        return 0
    inv.err(f"[emulator] the node agent has no mode {mode!r} here\n")
    return 2


def report(agent: EmulatedAgent, sender_version: str) -> dict:
    now = time.time()
    status = None
    if agent.version:
        status = {
            "version": agent.version,
            "pid": agent.pid,
            "started_at": agent.started_at,
            "last_loop_at": now if agent.running else agent.stopped_at,
            "loops": 1,
            "source": "nvml",
            "error": "",
            "watched": 0,
            "config": {},
        }
    return {
        "schema": 1,
        "version": sender_version,
        "now": now,
        "installed_version": agent.version,
        "status": status,
        "alive": agent.running,
        "journal_id": agent.journal_id,
        "entries": [],
        "more": False,
    }
