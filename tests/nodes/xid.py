"""Test oracles for Xid events: kernel-log lines read with the sampler's own patterns, and
PCI addresses compared as one device. The platform parses neither itself (the sampler
reads the log on the node; the watchdog matches an Xid to its GPU)."""

from __future__ import annotations

import re

from nodes.sampler import XID_PID_RE, XID_RE
from nodes.telemetry import MAX_PID, MAX_XID, XidEvent

_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{1,2}):"
    r"(?P<device>[0-9A-Fa-f]{1,2})(?:\.[0-7])?$"
)


def parse_xid_lines(text: str) -> list[XidEvent]:
    """Xid events in kernel-log text (dmesg in any time format, kern.log, journalctl -k):
    `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, ...`. pid is None when the line
    has none, says pid='<unknown>' or pid=0 (kernel context). raw is the message from "NVRM:"
    on, without the log's timestamp and host prefix. Other lines are ignored."""
    events = []
    for line in text.splitlines():
        match = XID_RE.search(line)
        if not match:
            continue
        xid = int(match["xid"])
        pid_match = XID_PID_RE.match(match["rest"])
        pid = int(pid_match["pid"]) or None if pid_match else None  # pid=0: the kernel
        if xid > MAX_XID or (pid is not None and pid > MAX_PID):
            continue  # a corrupted line, not an event
        events.append(
            XidEvent(
                xid=xid,
                raw=line[match.start() :].strip(),
                pci_bus_id=match["bus"].lower(),
                pid=pid,
            )
        )
    return events


def pci_bus_key(bus_id: str | None) -> str | None:
    """Normalise a PCI address to "dddd:bb:dd" so that a GPU's "00000000:3B:00.0" and an Xid's
    "0000:3b:00" compare equal; None for anything that is not a PCI address."""
    if not bus_id:
        return None
    match = _PCI_RE.match(bus_id.strip())
    if not match:
        return None
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{int(match['bus'], 16):02x}:{int(match['device'], 16):02x}"
