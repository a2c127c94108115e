"""The preflight gate's judgement: whether a node's software may be trusted with tenants'
containers, from the facts its discovery read and what its probe containers saw.
Pure Python: no Django (nodes.services runs the probes and stores the verdict).

A node passes when its NVIDIA Container Toolkit and runc are at least the policy's minimum
versions (or their distribution build is on the policy's known-fixed list), its driver
branch is one the policy lists, dockerd remaps user namespaces where the policy requires
it, every one of its probe containers saw the hardening the platform asked for, and (on a
node behind the SSH gateway) it has what the gateway's relay runs: nsenter and python3. The
VRAM quota is judged apart: without a quota library the probes proved effective (refused
past its quota with the CUDA out-of-memory error, also to a process that changes its own
environment), a GPU that is not MIG-partitioned is sold only whole (see `Gate.quota`).
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
    "runc_path",  # the binary dockerd runs containers with (its default runtime)
    "runc_commit",
    "runc_package",  # the package that owns runc_path, whose build runc_build is
    "userns_remap",  # "true" | "false": dockerd runs containers in a remapped user namespace
    "toolkit_version",
    "toolkit_build",
    "toolkit_source",
)
# What the SSH gateway's relay runs on the node (nodes/relay.py): `nsenter` from util-linux
# enters the container's network namespace, the host's `python3` relays the bytes. Read by
# the preflight itself (nodes/services/gate.py) with these argv lists; each fact is the
# program's own version line, "" when it did not answer. Only a node whose access is
# "gateway" needs them.
RELAY_FACT_KEYS = ("relay_nsenter", "relay_python3")
RELAY_PROBES: dict[str, tuple[str, ...]] = {
    "relay_nsenter": ("nsenter", "--version"),
    "relay_python3": ("python3", "--version"),
}
RELAY_PACKAGES = {"relay_nsenter": "util-linux", "relay_python3": "python3"}
RELAY_PROGRAMS = {"relay_nsenter": "nsenter", "relay_python3": "python3"}
RELAY_MIN_PYTHON = (3, 8)  # the relay's source uses nothing newer
_RELAY_LINE_RE = {
    "relay_nsenter": re.compile(r"^nsenter from util-linux \S+$"),
    "relay_python3": re.compile(r"^Python 3\.[0-9]+(\.[0-9]+)?\S*$"),
}
ALL_FACT_KEYS = (*FACT_KEYS, *RELAY_FACT_KEYS)
PROBE_OWNER_PREFIX = "probe-node-"  # a probe container's owner key: "probe-node-<node id>"
# The node policy's settings ops may change (NodePolicy's fields; the API's order).
POLICY_FIELDS = (
    "min_toolkit_version",
    "min_runc_version",
    "driver_branches",
    "known_fixed_builds",
    "probe_image",
    "probe_command",
    "probe_environment",
    "require_userns_remap",
)
COMPONENTS = ("runc", "toolkit")
COMPONENT_NAMES = {"runc": "runc", "toolkit": "NVIDIA Container Toolkit"}


@dataclass(frozen=True)
class Advisory:
    """One vendor advisory the toolkit minimum answers: what it fixes and from which
    release, so a failing node's reason names only the advisories its version misses."""

    cves: tuple[str, ...]
    fixed_in: str
    what: str
    source: str  # the vendor's bulletin, so a reviewer can check the version against it

    def reason(self) -> str:
        return f"{' and '.join(self.cves)} ({self.what}) fixed in {self.fixed_in}"


# The NVIDIA Container Toolkit advisories the default minimum covers, oldest first; the
# default (Policy.min_toolkit_version, NodePolicy's field) is the newest `fixed_in`.
TOOLKIT_ADVISORIES = (
    Advisory(
        ("CVE-2025-23266", "CVE-2025-23267"),
        "1.17.8",
        "NVIDIAScape, a container escape through ENV LD_PRELOAD, and a link followed by "
        "the update-ldcache hook",
        "https://nvidia.custhelp.com/app/answers/detail/a_id/5659",
    ),
    Advisory(
        ("CVE-2026-24260",),
        "1.19.1",
        "a time-of-check time-of-use race leading to code execution, escalation of "
        "privileges or data tampering, in every release up to 1.19.0",
        "https://nvidia.custhelp.com/app/answers/detail/a_id/5850",
    ),
)
TOOLKIT_MINIMUM = TOOLKIT_ADVISORIES[-1].fixed_in
# Why each minimum (README, "Policy"): runc's has one advisory, the toolkit's are above.
MINIMUM_WHY = {
    "toolkit": "; ".join(a.reason() for a in TOOLKIT_ADVISORIES),
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
# What a tenant's own process may do to a quota library that obeys its environment
# (HAMi#723): each is a probe past the quota that must still be refused.
PROBE_RAISED_LIMIT = "81920m"
PROBE_WRAPPERS: dict[str, tuple[str, ...]] = {
    "within": (),
    "past": (),
    "env-set": (
        "env",
        "CUDA_DISABLE_CONTROL=true",
        f"CUDA_DEVICE_MEMORY_LIMIT={PROBE_RAISED_LIMIT}",
        f"CUDA_DEVICE_MEMORY_LIMIT_0={PROBE_RAISED_LIMIT}",
    ),
    "env-unset": ("env", "-u", "LD_PRELOAD"),
}
PROBE_KINDS = tuple(PROBE_WRAPPERS)
BYPASS_KINDS = ("env-set", "env-unset")
BYPASS_WORDS = {
    "env-set": f"sets CUDA_DISABLE_CONTROL=true and CUDA_DEVICE_MEMORY_LIMIT={PROBE_RAISED_LIMIT}",
    "env-unset": "unsets LD_PRELOAD",
}
PROBE_MARKER = "# gpuplatform-probe v2"
# Every line the script prints itself starts with the run's nonce; every line of the
# allocation command (ops' setting: its output is not trusted) starts with "| ", so the
# command cannot print a line the platform takes for the script's.
COMMAND_PREFIX = "| "
HARDENING_KEYS = ("CapEff", "NoNewPrivs", "memory.max", "pids.max", "cpu.max")
FRAME_KEYS = (*HARDENING_KEYS, "alloc_exit", "end")
_NONCE_RE = re.compile(r"^[0-9a-f]{32}$")
# The CUDA out-of-memory error as an allocation program reports it: the driver API's
# name, PyTorch's message, the runtime API's name and cudaGetErrorString's words.
OOM_RE = re.compile(
    r"CUDA_ERROR_OUT_OF_MEMORY|CUDA out of memory|cudaErrorMemoryAllocation|\bout of memory\b",
    re.IGNORECASE,
)
PROBE_OUTPUT_LINES = 20  # the command's last lines kept with the verdict
_OUTPUT_LINE_CHARS = 300


def probe_script(nonce: str) -> str:
    """The probe's script, run as `sh -c SCRIPT probe <allocation argv>`: it reads its own
    confinement, runs the allocation with every line of its output prefixed, then prints
    the allocation's exit status and an end line. A fixed text around the platform's
    nonce: nothing from a tenant or from ops is in it."""
    if not _NONCE_RE.match(nonce):
        raise ValueError("the nonce is 32 lowercase hex digits")
    return (
        f"{PROBE_MARKER}\n"
        f"N={nonce}\n"
        # fd 3: the container's output, kept from the allocation command (3>&- below)
        "exec 3>&1\n"
        'say() { printf \'%s %s\\t%s\\n\' "$N" "$1" "$2" >&3; }\n'
        # the shell's own status, read by the shell itself (no grep to trust)
        "cap=unreadable; nnp=unreadable\n"
        "while read -r k v; do case $k in CapEff:) cap=$v;; NoNewPrivs:) nnp=$v;; esac;"
        " done </proc/self/status\n"
        # cgroup v2 files, else v1's
        "m=$(cat /sys/fs/cgroup/memory.max 2>/dev/null"
        " || cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || echo unreadable)\n"
        "p=$(cat /sys/fs/cgroup/pids.max 2>/dev/null"
        " || cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || echo unreadable)\n"
        'c=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo "$(cat'
        " /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null) $(cat"
        ' /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null)")\n'
        'say CapEff "$cap"; say NoNewPrivs "$nnp"\n'
        'say memory.max "$m"; say pids.max "$p"; say cpu.max "$c"\n'
        # The command's stdout and stderr go through a pipe whose reader prefixes each
        # line; its exit status comes back on fd 4, which (like fd 3) it does not get.
        's=$( { { "$@" 4>&- 2>&1; echo "$?" >&4; } 3>&- | while IFS= read -r l'
        ' || [ -n "$l" ]; do printf \'| %s\\n\' "$l"; done >&3; } 4>&1 )\n'
        "case $s in ''|*[!0-9]*) s=unreadable;; esac\n"
        'say alloc_exit "$s"\n'
        "say end done\n"
        "exit 0\n"
    )


def probe_command(nonce: str, kind: str, allocation: Iterable[str]) -> tuple[str, ...]:
    """The probe container's command: the script, then the allocation argv (behind the
    kind's `env` wrapper for the probes that play a tenant changing its environment)."""
    return ("sh", "-c", probe_script(nonce), "probe", *PROBE_WRAPPERS[kind], *allocation)


def probe_alloc_mb(kind: str) -> int:
    return PROBE_WITHIN_MB if kind == "within" else PROBE_PAST_MB


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
    min_toolkit_version: str = TOOLKIT_MINIMUM
    min_runc_version: str = "1.1.12"
    driver_branches: tuple[str, ...] = ()  # empty: any branch
    known_fixed: tuple[KnownBuild, ...] = ()
    require_userns_remap: bool = False


@dataclass(frozen=True)
class Check:
    # "toolkit", "runc", "driver", "docker", "userns", "relay", "probe", "hardening",
    # "quota:<model>"
    name: str
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
    """One probe container: `kind` is "within" (must get its memory), "past" (must be
    refused with the out-of-memory error, where the quota library is loaded), or one of
    BYPASS_KINDS (past the quota from a process that changed its own environment: must
    be refused all the same)."""

    gpu_model: str
    device: str
    kind: str
    error: str = ""  # it did not run to the end: why
    readings: Mapping[str, str] = field(default_factory=dict)  # the script's own lines
    output: tuple[str, ...] = ()  # the allocation command's last lines, as it printed them

    @property
    def alloc_exit(self) -> int | None:
        value = self.readings.get("alloc_exit", "")
        return int(value) if value.isdigit() else None

    @property
    def label(self) -> str:
        return f"the {self.kind} probe on {self.gpu_model} ({self.device})"

    def as_dict(self) -> dict[str, object]:
        return {
            "gpu_model": self.gpu_model,
            "device": self.device,
            "kind": self.kind,
            "error": self.error,
            "readings": dict(self.readings),
            "output": list(self.output),
        }


@dataclass(frozen=True)
class ProbeOutput:
    readings: dict[str, str]
    output: tuple[str, ...]
    problem: str = ""  # the output cannot be the script's own: why (readings are then empty)


def parse_probe_output(text: str, nonce: str) -> ProbeOutput:
    """The script's own lines (those that start with this run's nonce, each once) and the
    allocation command's (prefixed by the script). A framed line that appears twice, or
    anything after the end line, means something else wrote the container's output: the
    readings are then not taken at all."""
    readings: dict[str, str] = {}
    output: list[str] = []
    framed = nonce + " "
    problem = ""
    # "\n" only: a command's line holding "\r" or another separator that str.splitlines
    # honours must stay one line, behind its prefix
    lines = text.split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        if "end" in readings and not problem:
            problem = "there is output after the probe's end line"
        if line.startswith(framed):
            key, _, value = line[len(framed) :].partition("\t")
            if key not in FRAME_KEYS:
                problem = problem or f"the probe's frame holds an unknown line {key[:40]!r}"
            elif key in readings:
                problem = problem or f"the probe's {key} line appears twice"
            else:
                readings[key] = value.strip()
        elif line.startswith(COMMAND_PREFIX):
            output.append(line[len(COMMAND_PREFIX) :][:_OUTPUT_LINE_CHARS])
        elif line.strip():
            output.append(line[:_OUTPUT_LINE_CHARS])  # the shell's or docker-init's own
    kept = tuple(output[-PROBE_OUTPUT_LINES:])
    if problem:
        return ProbeOutput({}, kept, f"{problem}: its readings are not trusted")
    readings.pop("end", None)
    return ProbeOutput(readings, kept)


def probe_environment(env: Mapping[str, str], alloc_mb: int) -> tuple[tuple[str, str], ...]:
    """The ops-set probe environment with `{alloc_mb}` replaced by what to allocate."""
    return tuple(sorted((k, str(v).replace("{alloc_mb}", str(alloc_mb))) for k, v in env.items()))


@dataclass(frozen=True)
class Gate:
    checks: tuple[Check, ...]
    # per GPU model that is not MIG-partitioned: "proven" (the quota library refused every
    # probe past its quota with the out-of-memory error), "absent" (no library),
    # "ineffective" (the plain probe got past it), "environment" (a probe that changed its
    # own environment got past it), "unproven" (the probes could not tell)
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


def _component(
    component: str, version: str, build: str, minimum: str, policy: Policy, path: str = ""
) -> Check:
    name = COMPONENT_NAMES[component]
    shown = version + (f" (build {build})" if build and build != version else "")
    shown += f" at {path}" if path else ""
    known = _known_fixed(policy, component, build)
    if known is not None:
        return Check(component, True, f"{name} {shown}: a known-fixed build ({known.reason})")
    have, need = version_tuple(version), version_tuple(minimum)
    if have is None:
        return Check(component, False, f"{name}: its version could not be read on the node")
    if need is not None and have < need:
        return Check(
            component, False, f"{name} {shown} is older than {minimum} ({_why(component, have)})"
        )
    return Check(component, True, f"{name} {shown}")


def _why(component: str, have: tuple[int, ...]) -> str:
    """The advisories a version below the minimum misses: a node one release behind is
    told of the one it lacks, not of every advisory since the oldest."""
    if component != "toolkit":
        return MINIMUM_WHY[component]
    missed = [a for a in TOOLKIT_ADVISORIES if have < (version_tuple(a.fixed_in) or ())]
    if not missed:  # ops set a minimum past every advisory listed here
        return "the node policy's minimum"
    return "; ".join(a.reason() for a in missed)


def _userns(facts: Mapping[str, str]) -> Check:
    seen = facts.get("userns_remap", "")
    if seen == "true":
        return Check("userns", True, "dockerd remaps user namespaces (userns-remap)")
    if seen == "false":
        return Check(
            "userns",
            False,
            "dockerd does not remap user namespaces (userns-remap), which the policy "
            "requires: a container's root would be the node's root",
        )
    return Check(
        "userns",
        False,
        "whether dockerd remaps user namespaces could not be read, and the policy requires it",
    )


def relay_reading(key: str, exit_status: int, output: bytes | str) -> str:
    """A relay fact from its probe (RELAY_PROBES[key]): the program's version line when it
    ran and said what that program says ("nsenter from util-linux 2.38.1", "Python
    3.11.2"), else "" (not installed: the shell's 127; or something else answered)."""
    if exit_status != 0:
        return ""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:100]
    return line if _RELAY_LINE_RE[key].match(line) else ""


def _relay(facts: Mapping[str, str]) -> Check:
    """What a node behind the SSH gateway runs for each stream into a slice."""
    missing = [
        f"{RELAY_PROGRAMS[k]} (Debian's {RELAY_PACKAGES[k]} package)"
        for k in RELAY_FACT_KEYS
        if not facts.get(k, "")
    ]
    python = version_tuple(facts.get("relay_python3", "").removeprefix("Python "))
    old = python is not None and python < RELAY_MIN_PYTHON
    if missing or old:
        lacks = f"it lacks {' and '.join(missing)}" if missing else ""
        if old:
            lacks += (" and " if lacks else "") + (
                f"its {facts['relay_python3']} is older than the relay needs "
                f"({'.'.join(map(str, RELAY_MIN_PYTHON))})"
            )
        return Check(
            "relay",
            False,
            "the SSH gateway reaches slices on this node with nsenter and python3 "
            f"(nodes/relay.py), but {lacks}: install it, or set the node's access to direct",
        )
    return Check(
        "relay",
        True,
        "the SSH gateway's relay: " + ", ".join(facts[k] for k in RELAY_FACT_KEYS),
    )


def _hardening_wrong(readings: Mapping[str, str], expect: ProbeExpect) -> list[str]:
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
    return wrong


def _hardening(runs: Iterable[ProbeRun], expect: ProbeExpect) -> Check:
    """Every probe that read its confinement must have seen what was asked: the probes
    differ in card, device and command, and any one of them confined less is a node that
    does not confine reliably."""
    runs = list(runs)
    reported = [r for r in runs if any(k in r.readings for k in HARDENING_KEYS)]
    if not reported:
        error = next((r.error for r in runs if r.error), "")
        return Check(
            "hardening",
            False,
            "no probe container reported its confinement" + (f" ({error})" if error else ""),
        )
    wrong = [(r, _hardening_wrong(r.readings, expect)) for r in reported]
    wrong = [(r, w) for r, w in wrong if w]
    if wrong:
        return Check(
            "hardening",
            False,
            "; ".join(f"{r.label} saw " + ", ".join(w) for r, w in wrong),
        )
    silent = len(runs) - len(reported)
    return Check(
        "hardening",
        True,
        "no capabilities, no new privileges, and the memory, process and CPU limits asked "
        f"for, in each of {len(reported)} probe container{'s' if len(reported) != 1 else ''}"
        + (f" ({silent} did not report: see the quota)" if silent else ""),
    )


def refusal(run: ProbeRun) -> tuple[bool | None, str]:
    """Whether a probe past its quota was refused by the quota library: (True, "") when
    its allocation failed with the CUDA out-of-memory error, (False, "") when it got the
    memory, (None, why) when it failed some other way (a crash, a missing or broken
    program, a signal), which proves nothing about the quota."""
    code = run.alloc_exit
    last = next((line for line in reversed(run.output) if line.strip()), "")
    said = f": {last[:200]}" if last else ""
    if code is None:
        return None, f"its allocation reported no exit status{said}"
    if code == 0:
        return False, ""
    if code in (126, 127):
        return None, f"the allocation command could not be run (exit {code}{said})"
    if code > 128:
        return None, f"the allocation command was killed by signal {code - 128}{said}"
    if any(OOM_RE.search(line) for line in run.output):
        return True, ""
    return None, (
        f"the allocation failed (exit {code}) but not with the CUDA out-of-memory error{said}"
    )


def _quota(model: str, runs: list[ProbeRun], library: str) -> tuple[str, Check]:
    name = f"quota:{model}"

    def limited(state: str, detail: str, ok: bool = False) -> tuple[str, Check]:
        return state, Check(name, ok, f"{model}: {detail}", blocks=False)

    if not library:
        return limited("absent", "no VRAM quota library on the node: sold whole")
    by_kind = {r.kind: r for r in runs}
    missing = [k for k in PROBE_KINDS if k not in by_kind]
    failed = [by_kind[k] for k in PROBE_KINDS if k in by_kind and by_kind[k].error]
    if missing or failed:
        why = failed[0].error if failed else f"no {missing[0]} probe ran"
        return limited("unproven", f"the quota probe did not finish: {why}: sold whole")
    within, past = by_kind["within"], by_kind["past"]
    if within.alloc_exit != 0:
        return limited(
            "unproven",
            f"the probe could not allocate {PROBE_WITHIN_MB} MiB within its {PROBE_QUOTA_MB} "
            f"MiB quota (exit {within.alloc_exit}): the probe image or the node's GPU path "
            "does not work: sold whole",
        )
    refused, why = refusal(past)
    if refused is False:
        return limited(
            "ineffective",
            f"the probe allocated {PROBE_PAST_MB} MiB past its {PROBE_QUOTA_MB} MiB quota: the "
            f"quota library ({library}) is not enforcing: sold whole",
        )
    if refused is None:
        return limited("unproven", f"the quota is not proven: {why}: sold whole")
    got_past = []
    for kind in BYPASS_KINDS:
        refused, why = refusal(by_kind[kind])
        if refused is None:
            return limited(
                "unproven",
                f"the quota is not proven against a process that {BYPASS_WORDS[kind]}: "
                f"{why}: sold whole",
            )
        if refused is False:
            got_past.append(BYPASS_WORDS[kind])
    if got_past:
        return limited(
            "environment",
            f"the quota library ({library}) can only be configured by environment: a process "
            f"that {' or one that '.join(got_past)} allocated {PROBE_PAST_MB} MiB past its "
            f"{PROBE_QUOTA_MB} MiB quota: sold whole",
        )
    return limited(
        "proven",
        f"the quota library refused {PROBE_PAST_MB} MiB past a {PROBE_QUOTA_MB} MiB quota "
        "with the out-of-memory error, also to a process that "
        f"{' and to one that '.join(BYPASS_WORDS[k] for k in BYPASS_KINDS)}, and allowed "
        "what fits",
        ok=True,
    )


def _components(facts: Mapping[str, str], policy: Policy) -> list[Check]:
    """The NVIDIA Container Toolkit and runc against the policy's minimums."""
    return [
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
            path=facts.get("runc_path", ""),
        ),
    ]


def _driver(driver_version: str, policy: Policy) -> Check:
    """The driver's branch (its major version) against the branches the policy lists."""
    branch = (driver_version or "").split(".")[0]
    if not branch:
        return Check("driver", False, "the driver's version could not be read")
    if policy.driver_branches and branch not in policy.driver_branches:
        return Check(
            "driver",
            False,
            f"driver {driver_version} is on branch {branch}, not one the policy lists "
            f"({', '.join(policy.driver_branches)})",
        )
    return Check("driver", True, f"driver {driver_version} (branch {branch})")


def _docker(facts: Mapping[str, str]) -> Check:
    docker = facts.get("docker_version", "")
    if docker:
        return Check("docker", True, f"Docker Engine {docker}")
    return Check("docker", False, "Docker Engine did not answer `docker version`")


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
    relay_required: bool = False,
) -> Gate:
    """The verdict. `software_models`: the models of the node's GPUs that are not
    MIG-partitioned (their quota is the library's); `probe_error`: why no probe ran;
    `relay_required`: the node is reached through the SSH gateway (RELAY_FACT_KEYS)."""
    runs = list(runs)
    checks = [*_components(facts, policy), _driver(driver_version, policy), _docker(facts)]
    if policy.require_userns_remap:
        checks.append(_userns(facts))
    if relay_required:
        checks.append(_relay(facts))
    if probe_error:
        checks.append(Check("probe", False, f"the probe could not run: {probe_error}"))
    checks.append(_hardening(runs, expect or ProbeExpect()))
    quota: dict[str, str] = {}
    for model in sorted(set(software_models)):
        state, check = _quota(model, [r for r in runs if r.gpu_model == model], quota_library)
        quota[model] = state
        checks.append(check)
    return Gate(checks=tuple(checks), quota=quota)
