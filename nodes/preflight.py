"""The preflight gate's judgement: whether a node's software may be trusted with tenants'
containers, from the facts its discovery read and what its probe containers saw.
Pure Python: no Django (nodes.services runs the probes and stores the verdict).

A node passes when its NVIDIA Container Toolkit and runc are at least the policy's minimum
versions (or their distribution build is on the policy's known-fixed list), its driver
branch is one the policy lists, and its probe containers saw the hardening the platform
asked for. The VRAM quota is judged apart: without a quota library the probes proved
effective, a GPU that is not MIG-partitioned is sold only whole (see `Gate.quota`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

FACT_KEYS = (
    "os",
    "kernel",
    "docker_version",
    "cgroup_version",
    "runc_version",
    "runc_build",
    "toolkit_version",
    "toolkit_build",
    "toolkit_source",
)
COMPONENTS = ("runc", "toolkit")
COMPONENT_NAMES = {"runc": "runc", "toolkit": "NVIDIA Container Toolkit"}
# Why each minimum (DOMAIN.md, "What a node must have before it is trusted").
MINIMUM_WHY = {
    "toolkit": "CVE-2025-23266 (NVIDIAScape, a container escape through ENV LD_PRELOAD) and "
    "CVE-2025-23267 are fixed in 1.17.8",
    "runc": "CVE-2024-21626 (a leaked host directory descriptor) is fixed in 1.1.12",
}

# What the probe tries, in MiB: its quota, and what it allocates within and past it.
PROBE_QUOTA_MB = 256
PROBE_WITHIN_MB = 128
PROBE_PAST_MB = 512
PROBE_MEMORY_MB = 256
PROBE_PIDS = 64
PROBE_CPUS = "0.50"
PROBE_CPU_PERIOD_US = 100_000
PROBE_MARKER = "# gpuplatform-probe v1"
# The probe's own reading of its confinement, then the allocation command (ops' setting)
# and its exit status. A fixed script: nothing from a tenant is in it.
PROBE_SCRIPT = (
    f"{PROBE_MARKER}\n"
    "grep -E '^(CapEff|NoNewPrivs):' /proc/self/status\n"
    # cgroup v2 files, else v1's
    "m=$(cat /sys/fs/cgroup/memory.max 2>/dev/null"
    " || cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || echo unreadable)\n"
    "p=$(cat /sys/fs/cgroup/pids.max 2>/dev/null"
    " || cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || echo unreadable)\n"
    'c=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo "$(cat'
    " /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null) $(cat"
    ' /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null)")\n'
    'printf \'memory.max:\\t%s\\npids.max:\\t%s\\ncpu.max:\\t%s\\n\' "$m" "$p" "$c"\n'
    '"$@"\n'
    "printf 'alloc_exit:\\t%s\\n' \"$?\"\n"
)
_PROBE_LINE_RE = re.compile(
    r"^(?P<key>CapEff|NoNewPrivs|memory\.max|pids\.max|cpu\.max|alloc_exit):\s*(?P<value>.*)$"
)
_NUMBERS_RE = re.compile(r"^v?([0-9]+(?:\.[0-9]+)*)")
_BRANCH_RE = re.compile(r"^[0-9]{3,4}$")


def version_tuple(text: str) -> tuple[int, ...] | None:
    """The leading dotted numbers of a version ("1.1.5+ds1" -> (1, 1, 5)), None if none."""
    match = _NUMBERS_RE.match((text or "").strip())
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def check_version(text: str) -> str:
    """A minimum version as ops type it; raises ValueError naming the problem."""
    text = (text or "").strip()
    parsed = version_tuple(text)
    if parsed is None or len(parsed) < 2 or _NUMBERS_RE.match(text).group(0) != text:  # type: ignore[union-attr]
        raise ValueError(f"{text!r} is not a version like 1.17.8")
    return text


def check_branch(text: str) -> str:
    text = str(text).strip()
    if not _BRANCH_RE.match(text):
        raise ValueError(f"{text!r} is not a driver branch like 550")
    return text


@dataclass(frozen=True)
class KnownBuild:
    """A distribution build ops know carries the fix (a backport into an older number)."""

    component: str  # "runc" | "toolkit"
    build: str  # the package's full version, e.g. "1.1.5+ds1-1+deb12u1"
    reason: str


@dataclass(frozen=True)
class Policy:
    min_toolkit_version: str = "1.17.8"
    min_runc_version: str = "1.1.12"
    driver_branches: tuple[str, ...] = ()  # empty: any branch
    known_fixed: tuple[KnownBuild, ...] = ()


@dataclass(frozen=True)
class Check:
    name: str  # "toolkit", "runc", "driver", "docker", "hardening", "quota:<model>", "probe"
    ok: bool
    detail: str
    blocks: bool = True  # a failed check that stops placements (quota ones limit instead)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "blocks": self.blocks}


@dataclass(frozen=True)
class ProbeExpect:
    """What the probe must see of itself: what the platform asked docker for."""

    memory_max: str = str(PROBE_MEMORY_MB * 1024 * 1024)
    pids_max: str = str(PROBE_PIDS)
    cpu_max: str = f"{int(float(PROBE_CPUS) * PROBE_CPU_PERIOD_US)} {PROBE_CPU_PERIOD_US}"


@dataclass(frozen=True)
class ProbeRun:
    """One probe container: `kind` is "within" (must get its memory) or "past" (must be
    refused, where the quota library is loaded)."""

    gpu_model: str
    device: str
    kind: str
    error: str = ""  # it did not run to the end: why
    readings: Mapping[str, str] = field(default_factory=dict)

    @property
    def alloc_exit(self) -> int | None:
        value = self.readings.get("alloc_exit", "")
        return int(value) if value.lstrip("-").isdigit() else None

    def as_dict(self) -> dict[str, object]:
        return {
            "gpu_model": self.gpu_model,
            "device": self.device,
            "kind": self.kind,
            "error": self.error,
            "readings": dict(self.readings),
        }


def parse_probe_output(text: str) -> dict[str, str]:
    """The probe's labelled lines (the allocation command's own output is skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        match = _PROBE_LINE_RE.match(line.strip())
        if match and match.group("key") not in out:
            out[match.group("key")] = match.group("value").strip()
    return out


def probe_environment(env: Mapping[str, str], alloc_mb: int) -> tuple[tuple[str, str], ...]:
    """The ops-set probe environment with `{alloc_mb}` replaced by what to allocate."""
    return tuple(sorted((k, str(v).replace("{alloc_mb}", str(alloc_mb))) for k, v in env.items()))


@dataclass(frozen=True)
class Gate:
    checks: tuple[Check, ...]
    # per GPU model that is not MIG-partitioned: "proven" (the quota library refused the
    # probe past its quota), "absent" (no library), "ineffective" (the probe got past it),
    # "unproven" (the probe could not tell)
    quota: Mapping[str, str]

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks if c.blocks)

    @property
    def reason(self) -> str:
        return "; ".join(c.detail for c in self.checks if c.blocks and not c.ok)


def proven_models(quota: Mapping[str, str]) -> list[str]:
    """The models whose VRAM quota a probe proved: only their cards (not MIG-partitioned)
    are sold in slices; the others whole, unless ops accept the watchdog alone."""
    return sorted(m for m, state in quota.items() if state == "proven")


def _known_fixed(policy: Policy, component: str, build: str) -> KnownBuild | None:
    if not build:
        return None
    return next(
        (k for k in policy.known_fixed if k.component == component and k.build == build), None
    )


def _component(component: str, version: str, build: str, minimum: str, policy: Policy) -> Check:
    name = COMPONENT_NAMES[component]
    shown = version + (f" (build {build})" if build and build != version else "")
    known = _known_fixed(policy, component, build)
    if known is not None:
        return Check(component, True, f"{name} {shown}: a known-fixed build ({known.reason})")
    have, need = version_tuple(version), version_tuple(minimum)
    if have is None:
        return Check(component, False, f"{name}: its version could not be read on the node")
    if need is not None and have < need:
        return Check(
            component,
            False,
            f"{name} {shown} is older than {minimum} ({MINIMUM_WHY[component]})",
        )
    return Check(component, True, f"{name} {shown}")


def _hardening(runs: Iterable[ProbeRun], expect: ProbeExpect) -> Check:
    runs = list(runs)
    readings = next((r.readings for r in runs if not r.error and r.readings), None)
    if readings is None:
        error = next((r.error for r in runs if r.error), "")
        return Check(
            "hardening",
            False,
            "no probe container reported its confinement" + (f" ({error})" if error else ""),
        )
    wrong = []
    if readings.get("CapEff", "").strip("0") != "":
        wrong.append(f"capabilities {readings.get('CapEff') or 'unreadable'} (asked: none)")
    if readings.get("NoNewPrivs") != "1":
        wrong.append(f"NoNewPrivs {readings.get('NoNewPrivs') or 'unreadable'} (asked: 1)")
    for key, want in (
        ("memory.max", expect.memory_max),
        ("pids.max", expect.pids_max),
        ("cpu.max", expect.cpu_max),
    ):
        if readings.get(key) != want:
            wrong.append(f"cgroup {key} {readings.get(key) or 'unreadable'} (asked: {want})")
    if wrong:
        return Check("hardening", False, "the probe container saw " + ", ".join(wrong))
    return Check(
        "hardening",
        True,
        "no capabilities, no new privileges, and the memory, process and CPU limits asked for",
    )


def _quota(model: str, runs: list[ProbeRun], library: str) -> tuple[str, Check]:
    name = f"quota:{model}"
    if not library:
        return "absent", Check(
            name, False, f"{model}: no VRAM quota library on the node: sold whole", blocks=False
        )
    within = next((r for r in runs if r.kind == "within"), None)
    past = next((r for r in runs if r.kind == "past"), None)
    if within is None or past is None or within.error or past.error:
        error = next((r.error for r in (within, past) if r is not None and r.error), "")
        return "unproven", Check(
            name,
            False,
            f"{model}: the quota probe did not finish{': ' + error if error else ''}",
            blocks=False,
        )
    if within.alloc_exit != 0:
        return "unproven", Check(
            name,
            False,
            f"{model}: the probe could not allocate {PROBE_WITHIN_MB} MiB within its "
            f"{PROBE_QUOTA_MB} MiB quota (exit {within.alloc_exit}): the probe image or the "
            "node's GPU path does not work",
            blocks=False,
        )
    if past.alloc_exit == 0:
        return "ineffective", Check(
            name,
            False,
            f"{model}: the probe allocated {PROBE_PAST_MB} MiB past its {PROBE_QUOTA_MB} MiB "
            f"quota: the quota library ({library}) is not enforcing",
            blocks=False,
        )
    return "proven", Check(
        name,
        True,
        f"{model}: the quota library refused {PROBE_PAST_MB} MiB past a {PROBE_QUOTA_MB} MiB "
        "quota and allowed what fits",
        blocks=False,
    )


def evaluate(
    *,
    facts: Mapping[str, str],
    driver_version: str,
    policy: Policy,
    runs: Iterable[ProbeRun],
    software_models: Iterable[str],
    quota_library: str,
    expect: ProbeExpect | None = None,
    probe_error: str = "",
) -> Gate:
    """The verdict. `software_models`: the models of the node's GPUs that are not
    MIG-partitioned (their quota is the library's); `probe_error`: why no probe ran."""
    runs = list(runs)
    checks = [
        _component(
            "toolkit",
            facts.get("toolkit_version", ""),
            facts.get("toolkit_build", ""),
            policy.min_toolkit_version,
            policy,
        ),
        _component(
            "runc",
            facts.get("runc_version", ""),
            facts.get("runc_build", ""),
            policy.min_runc_version,
            policy,
        ),
    ]
    branch = (driver_version or "").split(".")[0]
    if not branch:
        checks.append(Check("driver", False, "the driver's version could not be read"))
    elif policy.driver_branches and branch not in policy.driver_branches:
        checks.append(
            Check(
                "driver",
                False,
                f"driver {driver_version} is on branch {branch}, not one the policy lists "
                f"({', '.join(policy.driver_branches)})",
            )
        )
    else:
        checks.append(Check("driver", True, f"driver {driver_version} (branch {branch})"))
    docker = facts.get("docker_version", "")
    checks.append(
        Check("docker", True, f"Docker Engine {docker}")
        if docker
        else Check("docker", False, "Docker Engine did not answer `docker version`")
    )
    if probe_error:
        checks.append(Check("probe", False, f"the probe could not run: {probe_error}"))
    checks.append(_hardening(runs, expect or ProbeExpect()))
    quota: dict[str, str] = {}
    for model in sorted(set(software_models)):
        state, check = _quota(model, [r for r in runs if r.gpu_model == model], quota_library)
        quota[model] = state
        checks.append(check)
    return Gate(checks=tuple(checks), quota=quota)
