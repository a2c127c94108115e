"""The docker CLI commands the platform runs on a GPU node, as argv lists, and parsers for
their output (Docker 26 with the NVIDIA Container Toolkit). Pure Python: no Django.

`run_argv` is the security boundary between a tenant's command/environment and the node:
every value is validated here and lands in its own argv item, so the `shlex.join` done by
the SSH layer can never turn tenant input into a new option or a shell construct.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from . import engines, host_keys, isolation, login_env, volumes
from .image_refs import exposed_tcp_ports

LABEL_OWNER = "gpuplatform.owner"
LABEL_MANAGED = "gpuplatform.managed"
# The quota the node agent holds the container to: docker's own record of the container,
# written at its creation, which nothing inside it can change (nodes/agent.py reads it).
LABEL_VRAM = "gpuplatform.vram_mb"
VRAM_ENV = "GPUPLATFORM_VRAM_LIMIT_MB"
MEMORY_FRACTION_ENV = "GPUPLATFORM_MEMORY_FRACTION"

# The quota library (HAMi-core style): the unsuffixed limit covers every visible device,
# `_0` the first one, which is the container's only device; both, whichever a build reads.
QUOTA_ENV = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0")
# Which of the driver's user-space libraries the toolkit puts in: compute and nvidia-smi,
# never display, video or graphics (replacing whatever an image's configuration says).
DRIVER_CAPABILITIES = "compute,utility"

ZERO_TIME = "0001-01-01T00:00:00Z"  # what docker prints for "never"

_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")  # docker's own rule for names
_REF_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")  # a name, a full id or an id prefix
_OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# A Docker network name; never `host` (the node's own network namespace) or `container:`.
_NETWORK_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$")
NO_NETWORK = "none"  # the container has its own loopback only: nothing can be published
_DEVICE_RE = re.compile(
    r"^(?:GPU-[0-9A-Fa-f-]+"
    r"|MIG-[0-9A-Fa-f-]+"  # R470+ drivers: MIG-<uuid>
    r"|MIG-GPU-[0-9A-Fa-f-]+/[0-9]+/[0-9]+)$"  # older drivers: MIG-GPU-<uuid>/<gi>/<ci>
)
# A shared object path for LD_PRELOAD: spaces and colons would separate several libraries.
_LIBRARY_RE = re.compile(r"^/[A-Za-z0-9._+/-]+\.so(?:\.[0-9]+)*$")

# github.com/distribution/reference: [domain/]path[:tag][@digest].
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_RE = re.compile(
    rf"^(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@sha256:[0-9a-f]{64})?$",
    re.ASCII,
)
_IMAGE_NAME_MAX = 255

_EXIT_RE = re.compile(r"^(?:Exited|Restarting) \((-?[0-9]+)\)")
# One binding of `docker ps`'s Ports column: "0.0.0.0:32768->8888/tcp", ":::32768->8888/tcp"
# (Docker 26), "[::]:32768->8888/tcp" (27+), ranges "0.0.0.0:32768-32769->80-81/tcp".
_PS_PORT_RE = re.compile(
    r"^(?:.*:)?(?P<host>[0-9]+)(?:-(?P<host_end>[0-9]+))?"
    r"->(?P<cont>[0-9]+)(?:-(?P<cont_end>[0-9]+))?/(?P<proto>[a-z]+)$"
)
# Where a new "key=value" starts inside ps's comma-joined Labels text.
_LABEL_START_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*=")

# `docker ps` joins every label with commas in Go map order, and image labels can hold
# commas themselves, so the platform's own labels are asked for one by one (`.Label`),
# each JSON-quoted, beside the whole row.
_PS_FORMAT = (
    '{"container":{{json .}},'
    f'"owner":{{{{.Label "{LABEL_OWNER}" | json}}}},'
    f'"managed":{{{{.Label "{LABEL_MANAGED}" | json}}}}}}'
)


class RuntimeParseError(ValueError):
    """Docker printed something this module does not understand."""


@dataclass(frozen=True)
class ContainerSpec:
    name: str  # container name, e.g. "gpp-slice-42"
    image: str  # image reference, may pin "@sha256:<64 hex>"
    owner_key: str  # opaque, e.g. "slice-42"
    device: str  # GPU UUID ("GPU-...") or MIG device UUID ("MIG-...")
    vram_mb: int  # the slice's VRAM quota in MiB
    # VRAM of the device the container sees: the physical GPU, or the MIG device when
    # `mig`; the caps' fractions are of what CUDA reports there (engines.reported_total_mb)
    gpu_total_mb: int
    cpus: Decimal  # a cap, e.g. Decimal("3.00")
    memory_mb: int  # host RAM cap (swap included)
    pids_limit: int
    command: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()  # tenant env
    ports: tuple[int, ...] = ()  # container ports, each on an ephemeral host port
    mig: bool = False
    quota_library: str = ""  # the node's software VRAM-quota .so ("" = none)
    network: str = "bridge"  # the node's container network (`none`: no published ports)
    # the tenant's volumes: (docker volume name, path in the container)
    mounts: tuple[tuple[str, str], ...] = ()
    mount_home: str = ""  # the SSH login's home a volume may take (volumes.home_of), or ""
    host_key_file: str = ""  # the slice's SSH host key on the node (nodes.host_keys), or ""
    login_env_file: str = ""  # the caps for SSH logins on the node (nodes.login_env), or ""


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    image: str
    owner_key: str  # from the LABEL_OWNER label, "" if none
    running: bool
    status: str  # created | running | paused | restarting | removing | exited | dead
    exit_code: int | None  # None while running, or when docker does not say
    oom_killed: bool  # the kernel's OOM killer (inspect only; ps cannot tell)
    error: str
    started_at: str  # raw docker timestamps, "" when unknown or never
    finished_at: str
    ports: dict[int, int]  # container port -> host port (tcp)
    labels: dict[str, str]
    env: tuple[str, ...] = ()  # Config.Env, "NAME=value" (inspect only: the image's merged in)


# --- building commands


def _int_at_least(field: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an integer, not {value!r}")
    if value < minimum:
        raise ValueError(f"{field} must be at least {minimum}, not {value}")
    return value


def _check_ref(field: str, value: object) -> str:
    if not isinstance(value, str) or not _REF_RE.fullmatch(value):
        raise ValueError(f"{field} must be a container name or id, not {value!r}")
    return value


def _check_owner(value: object) -> str:
    if not isinstance(value, str) or not _OWNER_RE.fullmatch(value):
        raise ValueError(
            f"owner_key must be 1-128 of [A-Za-z0-9_.:-] starting alphanumeric, not {value!r}"
        )
    return value


def check_image(image: object) -> str:
    if not isinstance(image, str) or not image:
        raise ValueError("image must be a non-empty image reference")
    if image.startswith("-"):
        raise ValueError(f"image must not start with '-': {image!r}")
    m = _IMAGE_RE.fullmatch(image)
    if m is None:
        raise ValueError(f"image is not a valid image reference: {image!r}")
    if len(m.group("name")) > _IMAGE_NAME_MAX:
        raise ValueError(f"image repository name is longer than {_IMAGE_NAME_MAX} characters")
    return image


def _check_value(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, not {value!r}")
    if any(ch in value for ch in "\0\n\r"):
        raise ValueError(f"{field} must not contain NUL or line breaks")
    return value


CPU_PERIOD_US = 100_000  # the kernel's default CFS period


def _cpu_quota(value: object) -> int:
    """The CFS quota (microseconds per CPU_PERIOD_US) that caps a container at `value`
    cores: the cap `--cpus` sets, given as the quota itself because docker refuses a
    --cpus above the node's core count, while a cap above what a node has only means the
    slice may use all of it (CPU is capped per slice, not reserved; placement counts VRAM)."""
    if isinstance(value, bool) or not isinstance(value, Decimal | int):
        raise ValueError(f"cpus must be a Decimal, not {value!r}")
    try:
        cpus = Decimal(value)
        quota = cpus * CPU_PERIOD_US
        if not cpus.is_finite() or quota < 1000 or quota != quota.to_integral_value():
            raise ValueError
    except (ValueError, InvalidOperation):
        # the kernel's quota is whole microseconds, at least 1 ms
        raise ValueError(
            f"cpus must be at least 0.01 with at most 5 decimals, not {value!r}"
        ) from None
    return int(quota)


def check_tenant_env(environment: tuple[tuple[str, str], ...]) -> None:
    """Raise ValueError naming the first variable a tenant may not set as given."""
    seen: set[str] = set()
    for item in environment:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError(f"environment items must be (name, value) pairs, not {item!r}")
        name, value = item
        if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
            raise ValueError(f"environment variable name {name!r} is not a valid name")
        if isolation.reserved_reason(name) is not None:
            raise ValueError(f"environment variable {isolation.refusal(name)}")
        if name in seen:
            # with duplicates, which one a program sees depends on its libc
            raise ValueError(f"environment variable {name} is given twice")
        seen.add(name)
        _check_value(f"environment variable {name}", value)


def platform_env(spec: ContainerSpec) -> list[tuple[str, str]]:
    """The VRAM caps every container gets: framework settings always, and the quota
    library's variables when the node has one and the device is not a MIG device (a MIG
    device is already a hardware partition)."""
    reported = engines.reported_total_mb(
        vram_mb=spec.vram_mb,
        device_mb=spec.gpu_total_mb,
        quota_library=bool(spec.quota_library),
        mig=spec.mig,
    )
    # Both fractions are of what CUDA reports in the container, not of the card: under the
    # quota library that is the slice itself (JAX would take 0.10 of it on an 80 GB card).
    share = engines.fraction(spec.vram_mb, reported)
    env = [
        (VRAM_ENV, str(spec.vram_mb)),
        # for a PyTorch job's torch.cuda.set_per_process_memory_fraction (the templates)
        (MEMORY_FRACTION_ENV, share),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", share),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("TF_FORCE_GPU_ALLOW_GROWTH", "true"),
        ("NVIDIA_DRIVER_CAPABILITIES", DRIVER_CAPABILITIES),
    ]
    if spec.quota_library and not spec.mig:
        # No bind mount: the library is put into the container by the node's toolkit hook
        # (ops install it with the NVIDIA Container Toolkit), so the platform never mounts
        # a host path into a tenant's container. These variables are what the container is
        # created with; the hook writes them into a read-only /overrideEnv and names the
        # library in a read-only /etc/ld.so.preload, so what a process inside later sets
        # or unsets does not change them (docs/isolation.md). The preflight proves a node
        # does so, or sells its cards whole.
        env += [(key, f"{spec.vram_mb}m") for key in QUOTA_ENV]
        env.append(("LD_PRELOAD", spec.quota_library))
    return env


def validate_spec(spec: ContainerSpec) -> None:
    """Raise ValueError naming the first field of `spec` that is not acceptable."""
    if not isinstance(spec.name, str) or not _NAME_RE.fullmatch(spec.name):
        raise ValueError(
            f"name must match [a-zA-Z0-9][a-zA-Z0-9_.-]+ (docker's rule), not {spec.name!r}"
        )
    check_image(spec.image)
    _check_owner(spec.owner_key)
    if not isinstance(spec.device, str) or not _DEVICE_RE.fullmatch(spec.device):
        raise ValueError(f"device must be a GPU-... or MIG-... UUID, not {spec.device!r}")
    if not isinstance(spec.mig, bool):
        raise ValueError(f"mig must be a bool, not {spec.mig!r}")
    if spec.mig != spec.device.startswith("MIG-"):
        raise ValueError(f"device {spec.device} does not agree with mig={spec.mig}")
    _int_at_least("vram_mb", spec.vram_mb)
    _int_at_least("gpu_total_mb", spec.gpu_total_mb)
    if spec.vram_mb > spec.gpu_total_mb:
        raise ValueError(
            f"vram_mb ({spec.vram_mb}) is more than the device has ({spec.gpu_total_mb})"
        )
    _cpu_quota(spec.cpus)
    _int_at_least("memory_mb", spec.memory_mb, minimum=6)  # docker's minimum is 6 MB
    _int_at_least("pids_limit", spec.pids_limit)
    if not isinstance(spec.command, tuple):
        raise ValueError("command must be a tuple of strings")
    for item in spec.command:
        # any text at all, it follows the image; only NUL cannot travel in an argv
        if not isinstance(item, str) or "\0" in item:
            raise ValueError(f"command items must be strings without NUL, not {item!r}")
    if not isinstance(spec.environment, tuple):
        raise ValueError("environment must be a tuple of (name, value) pairs")
    check_tenant_env(spec.environment)
    if not isinstance(spec.ports, tuple):
        raise ValueError("ports must be a tuple of port numbers")
    for port in spec.ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"ports must be between 1 and 65535, not {port!r}")
    if len(set(spec.ports)) != len(spec.ports):
        raise ValueError("ports must not repeat a port")
    if (
        not isinstance(spec.network, str)
        or not _NETWORK_RE.fullmatch(spec.network)
        or spec.network in ("host", "default")
    ):
        raise ValueError(
            f"network must be a Docker network name other than host, not {spec.network!r}"
        )
    if not isinstance(spec.quota_library, str) or (
        spec.quota_library and not _LIBRARY_RE.fullmatch(spec.quota_library)
    ):
        raise ValueError(
            f"quota_library must be an absolute path to a .so, not {spec.quota_library!r}"
        )
    volumes.check_mounts(spec.mounts, home=spec.mount_home)


def run_argv(spec: ContainerSpec) -> list[str]:
    """`docker run` for one slice. Raises ValueError naming the field that is wrong.

    Never --privileged, host namespaces, --device, --cap-add or a bind mount but the slice's
    own host key and login environment files, read-only (nodes.host_keys, nodes.login_env):
    the other mounts are the tenant's named
    volumes (`--mount type=volume`); the GPU comes only through `--gpus` (the toolkit)."""
    validate_spec(spec)
    memory = f"{spec.memory_mb}m"
    argv = [
        "docker",
        "run",
        "--detach",
        "--name",
        spec.name,
        "--gpus",
        # one device: docker's CSV parsing of --gpus needs no quoting without a comma
        f"device={spec.device}",
        "--cpu-period",
        str(CPU_PERIOD_US),
        "--cpu-quota",
        str(_cpu_quota(spec.cpus)),
        "--memory",
        memory,
        # the same as --memory: the cap is RAM plus swap, so no swap on top of it
        "--memory-swap",
        memory,
        "--pids-limit",
        str(spec.pids_limit),
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--init",  # reaps zombies and forwards SIGTERM, so `docker stop` is graceful
        "--network",
        spec.network,
        "--label",
        f"{LABEL_OWNER}={spec.owner_key}",
        "--label",
        f"{LABEL_MANAGED}=1",
        "--label",
        f"{LABEL_VRAM}={spec.vram_mb}",
        "--restart",
        "no",  # a dead container is the reconciler's to see, not docker's to hide
    ]
    # Tenant variables first; the platform's follow and cannot collide (reserved names).
    for name, value in (*spec.environment, *platform_env(spec)):
        argv += ["--env", f"{name}={value}"]
    # On a network without an outside (none) there is nothing to publish a port on.
    for port in spec.ports if spec.network != NO_NETWORK else ():
        argv += ["--publish", str(port)]
    for name, path in spec.mounts:
        argv += ["--mount", volumes.mount_arg(name, path, home=spec.mount_home)]
    argv += ["--mount", host_keys.mount_arg(spec.host_key_file)] if spec.host_key_file else []
    argv += ["--mount", login_env.mount_arg(spec.login_env_file)] if spec.login_env_file else []
    argv.append(spec.image)
    argv += spec.command
    return argv


def ps_argv(owner_key: str | None = None) -> list[str]:
    """Every platform container (LABEL_MANAGED), or every container of one owner (its
    LABEL_OWNER as well: docker ANDs label filters), exited ones too, full ids, one JSON
    object a line (see `parse_ps`)."""
    filters = ["--filter", f"label={LABEL_MANAGED}=1"]
    if owner_key is not None:
        filters += ["--filter", f"label={LABEL_OWNER}={_check_owner(owner_key)}"]
    return ["docker", "ps", "--all", "--no-trunc", *filters, "--format", _PS_FORMAT]


def inspect_argv(container: str) -> list[str]:
    # --type: a container, never an image or volume that happens to share the name
    return ["docker", "inspect", "--type", "container", _check_ref("container", container)]


def stop_argv(container: str, timeout_s: int = 10) -> list[str]:
    # -t: the long name is `--time` in older CLIs and `--timeout` in newer ones
    timeout = _int_at_least("timeout_s", timeout_s, minimum=0)
    return ["docker", "stop", "-t", str(timeout), _check_ref("container", container)]


def kill_argv(container: str, signal: str = "TERM") -> list[str]:
    """`docker kill --signal`: TERM is a preemption's notice to the main process, which runs
    on unless it ends itself. Only a signal the platform names, never one a tenant typed."""
    if signal not in ("TERM", "INT", "USR1"):
        raise ValueError(f"signal {signal!r} is not one the platform sends")
    return ["docker", "kill", "--signal", signal, _check_ref("container", container)]


def rm_argv(container: str) -> list[str]:
    return ["docker", "rm", "--force", _check_ref("container", container)]


# docker's --since takes an RFC 3339 time; the platform sends UTC with microseconds
_SINCE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$")
_LOG_LINE_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d{1,9})?Z ?(.*)$")


def logs_argv(container: str, *, since: str = "", tail: int = 1000) -> list[str]:
    """A container's output with docker's own timestamps, from `since` on (inclusive),
    at most the last `tail` lines."""
    argv = ["docker", "logs", "--timestamps", "--tail", str(_int_at_least("tail", tail))]
    if since:
        if not _SINCE_RE.fullmatch(since):
            raise ValueError(f"since must be an RFC 3339 UTC time, not {since!r}")
        argv += ["--since", since]
    return [*argv, _check_ref("container", container)]


def parse_log_lines(text: str) -> list[tuple[str, int, str]]:
    """(second, microseconds, text) per timestamped line `docker logs --timestamps`
    printed; a line without a timestamp (a wrapped one) continues the previous line."""
    out: list[tuple[str, int, str]] = []
    for line in text.splitlines():
        m = _LOG_LINE_RE.match(line)
        if m is None:
            if out:
                second, micro, before = out[-1]
                out[-1] = (second, micro, before + "\n" + line)
            continue
        fraction = (m.group(2) or ".0")[1:]
        out.append((m.group(1), int(fraction[:6].ljust(6, "0")), m.group(3)))
    return out


def logs_tail_argv(container: str, lines: int = 50) -> list[str]:
    """The last lines of a container's output (docker prints stdout and stderr as the
    container wrote them: read both)."""
    count = _int_at_least("lines", lines)
    return ["docker", "logs", "--tail", str(count), _check_ref("container", container)]


# --- parsing output


def _get(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise RuntimeParseError(f"{where}: {key} is missing or not {kind.__name__}: {value!r}")
    return value


def _opt_str(doc: dict[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RuntimeParseError(f"{where}: {key} is not a string: {value!r}")
    return value


def _timestamp(value: str) -> str:
    return "" if value in ("", ZERO_TIME) else value


_FRACTION_RE = re.compile(r"\.(\d+)")


def docker_time(value: str) -> datetime | None:
    """A docker timestamp (`State.StartedAt`, `State.FinishedAt`: RFC 3339 to the
    nanosecond) as an aware datetime; None for "", docker's "never" or anything else."""
    if not value or value == ZERO_TIME:
        return None
    # fromisoformat takes at most microseconds before Python 3.12
    text = _FRACTION_RE.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), value, count=1)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RuntimeParseError(f"{where}: labels are not a string map: {value!r}")
    return dict(value)


def parse_ps_labels(text: str) -> dict[str, str]:
    """ps's Labels column ("k=v,k=v", Go map order). A value may hold commas, so a comma
    starts a new label only where a key and "=" follow; best effort, `inspect` is exact."""
    labels: dict[str, str] = {}
    key: str | None = None
    for part in text.split(",") if text else []:
        if key is None or _LABEL_START_RE.match(part):
            key, _, value = part.partition("=")
            labels[key] = value
        else:
            labels[key] += "," + part
    return labels


def parse_ps_ports(text: str) -> dict[int, int]:
    """ps's Ports column -> {container port: host port}, tcp only (the platform publishes
    tcp). Exposed but unpublished ports ("8888/tcp") have no host port and are left out."""
    ports: dict[int, int] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item or "->" not in item:
            continue
        m = _PS_PORT_RE.fullmatch(item)
        if m is None:
            raise RuntimeParseError(f"docker ps: unreadable port binding {item!r}")
        if m["proto"] != "tcp":
            continue
        host, cont = int(m["host"]), int(m["cont"])
        span = int(m["cont_end"] or cont) - cont
        for k in range(span + 1):
            ports.setdefault(cont + k, host + k)
    return ports


def parse_ps(text: str) -> list[ContainerInfo]:
    """Lines of `ps_argv`'s format, or of plain `--format '{{json .}}'`."""
    out: list[ContainerInfo] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"docker ps line {n}"
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RuntimeParseError(f"{where} is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise RuntimeParseError(f"{where} is not a JSON object")
        exact: dict[str, str] = {}
        if "container" in doc:
            for label, key in ((LABEL_OWNER, "owner"), (LABEL_MANAGED, "managed")):
                value = _opt_str(doc, key, where)
                if value:
                    exact[label] = value
            doc = doc["container"]
            if not isinstance(doc, dict):
                raise RuntimeParseError(f"{where}: container is not a JSON object")
        cid = _get(doc, "ID", str, where)
        if not cid:
            raise RuntimeParseError(f"{where}: ID is empty")
        state = _get(doc, "State", str, where)
        status_text = _opt_str(doc, "Status", where)
        m = _EXIT_RE.match(status_text)
        labels = {**parse_ps_labels(_opt_str(doc, "Labels", where)), **exact}
        # Names lists link aliases too ("db,web/db"); the container's own has no slash
        names = [x for x in _opt_str(doc, "Names", where).split(",") if x and "/" not in x]
        out.append(
            ContainerInfo(
                id=cid,
                name=names[0] if names else "",
                image=_opt_str(doc, "Image", where),
                owner_key=labels.get(LABEL_OWNER, ""),
                # as inspect's State.Running: paused and restarting containers count
                running=state in ("running", "paused", "restarting"),
                status=state,
                exit_code=int(m.group(1)) if m else None,
                oom_killed=False,
                error="",
                started_at="",
                finished_at="",
                ports=parse_ps_ports(_opt_str(doc, "Ports", where)),
                labels=labels,
            )
        )
    return out


def _inspect_ports(value: Any, where: str) -> dict[int, int]:
    """NetworkSettings.Ports: {"8888/tcp": [{"HostIp": "0.0.0.0", "HostPort": "32768"},
    ...] | null}; a stopped container has none."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RuntimeParseError(f"{where}: NetworkSettings.Ports is not an object")
    ports: dict[int, int] = {}
    for key, bindings in value.items():
        port, _, proto = str(key).partition("/")
        if proto not in ("", "tcp") or not bindings:
            continue
        if not port.isdigit() or not isinstance(bindings, list):
            raise RuntimeParseError(f"{where}: unreadable port binding {key!r}: {bindings!r}")
        for b in bindings:
            host = b.get("HostPort") if isinstance(b, dict) else None
            if not isinstance(host, str) or not host.isdigit():
                raise RuntimeParseError(f"{where}: unreadable host port for {key!r}: {b!r}")
            ports.setdefault(int(port), int(host))
    return ports


def _env_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuntimeParseError(f"{where}: Config.Env is not a list of strings")
    return tuple(value)


def image_inspect_argv(reference: str) -> list[str]:
    """`docker image inspect` of one image (a JSON array of one object)."""
    return ["docker", "image", "inspect", "--", check_image(reference)]


def pull_argv(reference: str) -> list[str]:
    return ["docker", "pull", "--quiet", "--", check_image(reference)]


@dataclass(frozen=True)
class ImageConfig:
    id: str
    env: tuple[str, ...]  # the image configuration's Env, "NAME=value"
    repo_digests: tuple[str, ...]
    user: str = ""  # Config.User: whom the container runs as ("" = root), owns its volumes
    exposed_ports: tuple[int, ...] = ()  # Config.ExposedPorts, tcp only, sorted
    size: int = 0  # bytes, unpacked (docker's Size; 0 when it says none)


def parse_image_inspect(text: str) -> ImageConfig:
    try:
        docs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuntimeParseError(f"docker image inspect output is not JSON: {exc}") from None
    if not isinstance(docs, list) or len(docs) != 1 or not isinstance(docs[0], dict):
        raise RuntimeParseError("docker image inspect output is not an array of one object")
    doc = docs[0]
    config = doc.get("Config") or {}
    if not isinstance(config, dict):
        raise RuntimeParseError("docker image inspect: Config is not an object")
    digests = doc.get("RepoDigests") or []
    if not isinstance(digests, list):
        raise RuntimeParseError("docker image inspect: RepoDigests is not a list")
    size = doc.get("Size")
    return ImageConfig(
        id=_get(doc, "Id", str, "docker image inspect"),
        env=_env_list(config.get("Env"), "docker image inspect"),
        repo_digests=tuple(str(d) for d in digests),
        user=_opt_str(config, "User", "docker image inspect"),
        exposed_ports=exposed_tcp_ports(config.get("ExposedPorts")),
        size=size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0,
    )


def parse_inspect(text: str) -> list[ContainerInfo]:
    """`docker inspect` of containers: a JSON array (`[]` when none were found)."""
    if not text.strip():
        return []
    try:
        docs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuntimeParseError(f"docker inspect output is not JSON: {exc}") from None
    if not isinstance(docs, list):
        raise RuntimeParseError("docker inspect output is not a JSON array")
    out: list[ContainerInfo] = []
    for n, doc in enumerate(docs):
        where = f"docker inspect item {n}"
        if not isinstance(doc, dict):
            raise RuntimeParseError(f"{where} is not a JSON object")
        cid = _get(doc, "Id", str, where)
        state = _get(doc, "State", dict, where)
        config = doc.get("Config") or {}
        network = doc.get("NetworkSettings") or {}
        if not isinstance(config, dict) or not isinstance(network, dict):
            raise RuntimeParseError(f"{where}: Config or NetworkSettings is not an object")
        running = _get(state, "Running", bool, f"{where} State")
        exit_code = _get(state, "ExitCode", int, f"{where} State")
        labels = _str_map(config.get("Labels"), where)
        out.append(
            ContainerInfo(
                id=cid,
                name=_opt_str(doc, "Name", where).removeprefix("/"),
                # Config.Image is the reference it was started from (the top-level Image
                # is the sha256 image id)
                image=_opt_str(config, "Image", where),
                owner_key=labels.get(LABEL_OWNER, ""),
                running=running,
                status=_get(state, "Status", str, f"{where} State"),
                exit_code=None if running else exit_code,
                oom_killed=state.get("OOMKilled") is True,
                error=_opt_str(state, "Error", where),
                started_at=_timestamp(_opt_str(state, "StartedAt", where)),
                finished_at=_timestamp(_opt_str(state, "FinishedAt", where)),
                ports=_inspect_ports(network.get("Ports"), where),
                labels=labels,
                env=_env_list(config.get("Env"), where),
            )
        )
    return out
