"""A neighbour that measures harm from inside: the lab workload's probe (WORKLOAD_PROBE_MB,
nodelab/node/workload.c) asks for memory inside its own quota every tick and logs whether
it got it. The lab tests and the lab bench read its log the same way."""

from __future__ import annotations

import re

# An honest neighbour for an 8 GB slice: it holds 1,000 MiB and asks for 6,000 MiB more
# every tick, always inside its own quota, so every refusal its log prints
# ("gpu-workload: probe <time> refused") is harm another job did to it.
PROBING_NEIGHBOUR = {
    "WORKLOAD_PROFILE": "steady",
    "WORKLOAD_MB": "1000",
    "WORKLOAD_PROBE_MB": "6000",
    "WORKLOAD_SM_UTIL": "0",
    "WORKLOAD_MEM_UTIL": "0",
}
PROBE_RE = re.compile(r"gpu-workload: probe (?P<t>[0-9.]+) (?P<r>ok|refused)")


def probe_readings(log: str) -> list[tuple[float, bool]]:
    """(unix time, got it) for each probe in a neighbour's log, in order."""
    return [(float(m["t"]), m["r"] == "ok") for m in PROBE_RE.finditer(log)]


def longest_refusal(readings: list[tuple[float, bool]]) -> tuple[float, bool]:
    """The longest run of refused probes, from the first refusal to the next success (to
    the last probe where none came), and whether the last probe was refused."""
    longest, began = 0.0, None
    for t, ok in readings:
        if not ok and began is None:
            began = t
        elif ok and began is not None:
            longest, began = max(longest, t - began), None
    if began is not None:
        longest = max(longest, readings[-1][0] - began)
    return longest, began is not None
