"""The docker subcommands that create and change containers: run/create (its flags made a
Container, its GPU device resolved), start/restart, stop/kill, pause/unpause and rm."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .containers import Container, parse_size_mb, process_environment
from .docker_flags import (
    RUN_FLAGS,
    SWITCH,
    VALUE,
    Flag,
    Parsed,
    UsageError,
    parse_flags,
    parse_gpus,
    parse_ports,
)
from .docker_formats import DEFAULT_CMD, image_ref, no_such_container
from .shell import Invocation
from .state import NodeState
from .workload import Workload

_NAME_RE = re.compile(r"^/?[a-zA-Z0-9][a-zA-Z0-9_.-]+$")


def _run_error(inv: Invocation, message: str, status: int = 125, cmd: str = "run") -> int:
    inv.err(f"docker: {message}.\nSee 'docker {cmd} --help'.\n")
    return status


class _Refused(Exception):  # noqa: N818 - control flow: the run ends with ``status``
    """docker refused the run: what it says is written, ``status`` is its exit status."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


@dataclass
class _RunRequest:
    """What `docker run` / `docker create` was asked for, its flags read and checked."""

    sub: str  # "run" or "create"
    flags: Parsed
    image: str
    cmd: list[str]
    env: list[str]
    labels: dict[str, str]
    host_config: dict[str, Any]
    gpu_request: str | None
    count: int | None  # GPUs asked for by number (-1: all)
    devices: list[str] | None  # or by id


def cmd_run(node: NodeState, inv: Invocation, args: list[str], *, create_only: bool = False) -> int:
    """`docker run` / `docker create`: the flags read, the container created (its name free,
    its image present), its GPU found and the container started; attached, its output."""
    try:
        req = _read_request(inv, args, create_only)
        with node.lock:
            node.refresh()
            c = _create(node, inv, req)
            if create_only:
                inv.out(c.id + "\n")
                return 0
            err = _resolve_device(node, c, req.count, req.devices)
            if err:
                c.exit_code = 128
                c.error = err
                return _run_error(inv, "Error response from daemon: " + err, cmd=req.sub)
            node.start_container(c)
            _instant_commands(node, c)
            node.refresh()
            if req.flags.has("detach"):
                inv.out(c.id + "\n")
                return 0
    except _Refused as refused:
        return refused.status
    return _attached(node, inv, c)


def _read_request(inv: Invocation, args: list[str], create_only: bool) -> _RunRequest:
    sub = "create" if create_only else "run"
    try:
        p = parse_flags(sub, args, RUN_FLAGS, interspersed=False)
    except UsageError as e:
        inv.err(f"{e}\n")
        raise _Refused(e.status) from None
    if not p.positional:
        inv.err(
            f"\"docker {sub}\" requires at least 1 argument.\nSee 'docker {sub} --help'.\n\n"
            f"Usage:  docker {sub} [OPTIONS] IMAGE [COMMAND] [ARG...]\n\n"
            + (
                "Create and run a new container from an image\n"
                if sub == "run"
                else "Create a new container\n"
            )
        )
        raise _Refused(1)
    host_config = _host_config(p, create_only)
    refusal = _cpu_limits(p, host_config) or _memory_limits(p, host_config)
    if refusal:
        raise _Refused(_run_error(inv, refusal, cmd=sub))
    gpu_request = p.get("gpus")
    count = devices = None
    if gpu_request is not None:
        try:
            count, devices = parse_gpus(gpu_request)
        except UsageError as e:
            inv.err(f"{e}\nSee 'docker {sub} --help'.\n")
            raise _Refused(125) from None
        host_config["DeviceRequests"] = [
            {
                "Driver": "",
                "Count": count if count is not None else 0,
                "DeviceIDs": devices,
                "Capabilities": [["gpu"]],
                "Options": {},
            }
        ]
    return _RunRequest(
        sub=sub,
        flags=p,
        image=p.positional[0],
        cmd=p.positional[1:],
        env=[e for e in p.all("env") if "=" in e],
        labels={k: v for k, _, v in (label.partition("=") for label in p.all("label"))},
        host_config=host_config,
        gpu_request=gpu_request,
        count=count,
        devices=devices,
    )


def _host_config(p: Parsed, create_only: bool) -> dict[str, Any]:
    """docker inspect's HostConfig from the flags (the limits come after); the keys that
    start with "_" are the emulator's own and inspect leaves them out."""
    return {
        "Binds": p.all("volume") or None,
        # --mount type=volume,source=<name>,target=<path>, as docker inspect shows it
        "Mounts": [_mount(m) for m in p.all("mount")] or None,
        "NetworkMode": p.get("network", "bridge"),
        "PortBindings": {},
        "RestartPolicy": {"Name": p.get("restart", "no"), "MaximumRetryCount": 0},
        "AutoRemove": p.has("rm"),
        "CapAdd": p.all("cap-add") or None,
        "CapDrop": p.all("cap-drop") or None,
        "SecurityOpt": p.all("security-opt") or None,
        "Privileged": p.has("privileged"),
        "ReadonlyRootfs": p.has("read-only"),
        "Runtime": p.get("runtime", "runc"),
        "ShmSize": 67108864,
        "NanoCpus": 0,
        "CpuPeriod": 0,
        "CpuQuota": 0,
        "Memory": 0,
        "MemorySwap": 0,
        "PidsLimit": None,
        "DeviceRequests": None,
        "Init": True if p.has("init") else None,
        "_Detach": p.has("detach") or create_only,
        "_User": p.get("user", ""),
        "_WorkingDir": p.get("workdir", ""),
    }


def _cpu_limits(p: Parsed, host_config: dict[str, Any]) -> str:
    """--cpus, --cpu-period and --cpu-quota into ``host_config``; what docker says of a bad
    one ("": nothing)."""
    cpus = p.get("cpus")
    if cpus is not None:
        try:
            host_config["NanoCpus"] = int(round(float(cpus) * 1e9))
        except ValueError:
            return (
                f'invalid argument "{cpus}" for "--cpus" flag: '
                f"failed to parse {cpus} as a rational number"
            )
    for flag, key in (("cpu-period", "CpuPeriod"), ("cpu-quota", "CpuQuota")):
        value = p.get(flag)
        if value is not None:
            try:
                host_config[key] = int(value)
            except ValueError:
                return (
                    f'invalid argument "{value}" for "--{flag}" flag: '
                    f'strconv.ParseInt: parsing "{value}": invalid syntax'
                )
    if host_config["NanoCpus"] and (host_config["CpuPeriod"] or host_config["CpuQuota"]):
        return (
            "Error response from daemon: Conflicting options: Nano CPUs and CPU Period "
            "cannot both be set"
        )
    return ""


def _memory_limits(p: Parsed, host_config: dict[str, Any]) -> str:
    """--memory and --pids-limit into ``host_config``; what docker says of a bad one."""
    mem = p.get("memory")
    if mem is not None:
        mb = parse_size_mb(mem if mem[-1:].isalpha() else mem + "b")
        if mb is None:
            return f'invalid argument "{mem}" for "-m, --memory" flag: invalid size: \'{mem}\''
        host_config["Memory"] = int(mb * 1024 * 1024)
        host_config["MemorySwap"] = host_config["Memory"] * 2
    pids = p.get("pids-limit")
    if pids is not None:
        try:
            host_config["PidsLimit"] = int(pids)
        except ValueError:
            return (
                f'invalid argument "{pids}" for "--pids-limit" flag: '
                f'strconv.ParseInt: parsing "{pids}": invalid syntax'
            )
    return ""


def _create(node: NodeState, inv: Invocation, req: _RunRequest) -> Container:
    """The container, added to the node (caller holds node.lock): its ports bound, its name
    free, its image present."""
    sub, host_config = req.sub, req.host_config
    try:
        ports = parse_ports(req.flags.all("publish"), node)
    except UsageError as e:
        inv.err(f"{e}\nSee 'docker {sub} --help'.\n")
        raise _Refused(125) from None
    for cport, hip, hport in ports:
        host_config["PortBindings"].setdefault(cport, []).append(
            {"HostIp": hip, "HostPort": str(hport) if hport else ""}
        )
    name = req.flags.get("name")
    if name is not None:
        refusal = _name_refusal(node, name)
        if refusal:
            raise _Refused(_run_error(inv, refusal, cmd=sub))
        name = name.lstrip("/")
    image = req.image
    if (
        node.images is not None
        and image not in node.images
        and image_ref(image) not in {image_ref(i) for i in node.images}
    ):
        repo = image_ref(image).rsplit(":", 1)[0]
        inv.err(f"Unable to find image '{image_ref(image)}' locally\n")
        raise _Refused(
            _run_error(
                inv,
                f"Error response from daemon: pull access denied for {repo}, repository does "
                "not exist or may require 'docker login': denied: requested access to the "
                "resource is denied",
                cmd=sub,
            )
        )
    now = node.clock.now()
    # docker's merge: the image's configuration first, `--env` replaces a name in it
    given = {e.partition("=")[0] for e in req.env}
    own = node.image_env.get(image_ref(image), node.image_env.get(image, []))
    env = [e for e in own if e.partition("=")[0] not in given] + req.env + node.run_env_extra
    c = Container(
        id=node.new_container_id(),
        name=name or node.random_name(),
        image=image,
        cmd=req.cmd or list(DEFAULT_CMD),
        env=env,
        labels=req.labels,
        created=now,
        host_config=host_config,
        ports=ports,
        gpu_request=req.gpu_request,
        auto_remove=req.flags.has("rm"),
    )
    node.containers[c.id] = c
    return c


def _name_refusal(node: NodeState, name: str) -> str:
    """Why the daemon refuses ``name`` ("": it does not): not a name, or taken."""
    if not _NAME_RE.match(name):
        return (
            f"Error response from daemon: Invalid container name ({name}), only "
            "[a-zA-Z0-9][a-zA-Z0-9_.-] are allowed"
        )
    name = name.lstrip("/")
    clash = next((c for c in node.containers.values() if c.name == name), None)
    if clash is None:
        return ""
    return (
        f'Error response from daemon: Conflict. The container name "/{name}" is already '
        f'in use by container "{clash.id}". You have to remove (or rename) that '
        "container to be able to reuse that name"
    )


def _attached(node: NodeState, inv: Invocation, c: Container) -> int:
    """Attached: waits (bounded) for the container to exit, then shows its output."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with node.lock:
            node.refresh()
            if not c.running:
                break
        time.sleep(0.05)
    with node.lock:
        for _, stream, line in c.logs:
            (inv.out if stream == "stdout" else inv.err)(line + "\n")
        status = c.exit_code if not c.running else 0
        if c.auto_remove and not c.running:
            node.containers.pop(c.id, None)
    return status


def _resolve_device(
    node: NodeState, c: Container, count: int | None, devices: list[str] | None
) -> str:
    if c.gpu_request is None:
        return ""
    if devices is not None:
        picked = []
        for d in devices:
            hit = node.gpu_by_id(d)
            if hit is None:
                return (
                    "failed to create task for container: failed to create shim task: OCI runtime "
                    "create failed: runc create failed: unable to start container process: error "
                    "during container init: error running hook #0: error running hook: exit status "
                    "1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: "
                    f"device error: {d}: unknown device: unknown"
                )
            gpu, mig = hit
            picked.append((gpu.index, None if mig is None else gpu.mig_devices.index(mig)))
        if not picked:
            return ""
        c.device = picked[0]
        return ""
    n = len(node.gpus) if count is None or count == -1 else count
    if n > len(node.gpus):
        return (
            "failed to create task for container: failed to create shim task: OCI runtime create "
            "failed: runc create failed: unable to start container process: error during container "
            "init: error running hook #0: error running hook: exit status 1, stdout: , stderr: "
            f"Auto-detected mode as 'legacy'\nnvidia-container-cli: device error: {n - 1}: "
            "unknown device: unknown"
        )
    if n > 0 and node.gpus:
        gpu = node.gpus[0]
        c.device = (0, 0 if gpu.mig_enabled and gpu.mig_devices else None)
    return ""


PROBE_MARKER = "# gpuplatform-probe v2"  # nodes.preflight's probe script
_PROBE_NONCE_RE = re.compile(r"^N=([0-9a-f]+)$", re.MULTILINE)


def _probe(node: NodeState, c: Container) -> None:
    """The platform's preflight probe: what the container would read of its own
    confinement, then its allocation of WORKLOAD_MB MiB (the workload's knob) against
    the caps the container really got, framed as the script frames it (its own lines
    behind the run's nonce, the allocation's behind "| "). A node whose quota library
    obeys each process's environment (catalog.QUOTA_FROM_ENVIRONMENT) lets a probe
    that changes its own environment past the quota (containers.process_environment)."""
    match = _PROBE_NONCE_RE.search(c.cmd[2])
    nonce = match.group(1) if match else ""
    hc = c.host_config
    caps = "0000000000000000" if "ALL" in (hc.get("CapDrop") or []) else "00000000a80425fb"
    nnp = "1" if "no-new-privileges" in (hc.get("SecurityOpt") or []) else "0"
    memory = str(hc.get("Memory") or "max")
    pids = str(hc.get("PidsLimit") or "max")
    quota, period = hc.get("CpuQuota") or 0, hc.get("CpuPeriod") or 100000
    cpu = f"{quota} {period}" if quota else f"max {period}"
    now = node.clock.now()
    c.log(
        now,
        "stdout",
        f"{nonce} CapEff\t{caps}\n{nonce} NoNewPrivs\t{nnp}\n{nonce} memory.max\t{memory}\n"
        f"{nonce} pids.max\t{pids}\n{nonce} cpu.max\t{cpu}",
    )
    want = Workload.from_env(process_environment(c.cmd, c.env_dict)).base_mb
    hard = node.hard_limit(c)
    total = 0.0
    if c.device is not None:
        gpu = node.gpus[c.device[0]]
        total = float(gpu.model.memory_mb)
    code = 1 if c.device is None or want > total or (hard is not None and want > hard) else 0
    if c.device is None:
        c.log(now, "stdout", "| RuntimeError: CUDA error: no CUDA-capable device is detected")
    elif code:
        c.log(
            now,
            "stdout",
            f"| torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want:.2f} MiB",
        )
    c.log(now, "stdout", f"{nonce} alloc_exit\t{code}\n{nonce} end\tdone")
    c.workload = None
    node.container_exit(c, now, 0)


def _instant_commands(node: NodeState, c: Container) -> None:
    """Containers whose command finishes at once (true, echo, nvidia-smi -L ...)."""
    if not c.cmd:
        return
    base = c.cmd[0].rsplit("/", 1)[-1]
    probe = base in ("sh", "bash") and len(c.cmd) > 2 and c.cmd[1] == "-c"
    if probe and c.cmd[2].startswith(PROBE_MARKER):
        _probe(node, c)
        return
    now = node.clock.now()
    if base in ("true", "false", "echo", "nvidia-smi", "exit"):
        text = ""
        code = 1 if base == "false" else 0
        if base == "echo":
            text = " ".join(c.cmd[1:])
        elif base == "nvidia-smi" and c.device is not None:
            gpu = node.gpus[c.device[0]]
            text = f"GPU 0: {gpu.model.name} (UUID: {gpu.uuid})"
            if c.device[1] is not None:
                mig = gpu.mig_devices[c.device[1]]
                text += f"\n  MIG {mig.profile.name:<11} Device  0: (UUID: {mig.uuid})"
        elif base == "nvidia-smi":
            c.log(now, "stderr", "bash: nvidia-smi: command not found")
            code = 127
        c.workload = None
        if text:
            c.log(now, "stdout", text)
        node.container_exit(c, now, code)


def _each(
    node: NodeState,
    inv: Invocation,
    cmd: str,
    refs: list[str],
    action: Callable[[Container], str],
) -> int:
    if not refs:
        inv.err(f"\"docker {cmd}\" requires at least 1 argument.\nSee 'docker {cmd} --help'.\n")
        return 1
    status = 0
    with node.lock:
        node.refresh()
        for ref in refs:
            c = node.find_container(ref)
            if c is None:
                no_such_container(inv, ref)
                status = 1
                continue
            err = action(c)
            if err:
                inv.err(err + "\n")
                status = 1
            else:
                inv.out(ref + "\n")
    return status


def cmd_stop(node: NodeState, inv: Invocation, args: list[str], *, kill: bool = False) -> int:
    flags = [Flag(("signal", "s"), VALUE)] + ([] if kill else [Flag(("time", "t"), VALUE)])
    try:
        p = parse_flags("kill" if kill else "stop", args, flags, interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status

    def action(c: Container) -> str:
        if kill and not c.running:
            return (
                f"Error response from daemon: cannot kill container: {c.id}: "
                f"container {c.id} is not running"
            )
        node.stop_container(c, 137)
        if c.auto_remove:
            node.containers.pop(c.id, None)
        return ""

    return _each(node, inv, "kill" if kill else "stop", p.positional, action)


def cmd_start(node: NodeState, inv: Invocation, args: list[str], *, restart: bool = False) -> int:
    try:
        p = parse_flags(
            "restart" if restart else "start",
            args,
            [
                Flag(("attach", "a"), SWITCH),
                Flag(("interactive", "i"), SWITCH),
                Flag(("time", "t"), VALUE),
            ],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status

    def action(c: Container) -> str:
        if c.paused and not restart:
            return (
                "Error response from daemon: cannot start a paused container, try unpause "
                "instead\nError: failed to start containers: " + c.id
            )
        if c.running and not restart:
            return ""
        if c.running:
            node.stop_container(c, 137)
        count, devices = (None, None)
        if c.gpu_request:
            count, devices = parse_gpus(c.gpu_request)
        err = _resolve_device(node, c, count, devices)
        if err:
            c.error = err
            return (
                "Error response from daemon: "
                + err
                + "\nError: failed to start containers: "
                + c.id
            )
        node.start_container(c)
        _instant_commands(node, c)
        return ""

    return _each(node, inv, "restart" if restart else "start", p.positional, action)


def cmd_pause(node: NodeState, inv: Invocation, args: list[str], *, unpause: bool = False) -> int:
    """`docker pause` / `docker unpause` (the cgroup freezer): a paused container keeps
    its memory, computes nothing, and its workload's clock stands still."""
    cmd = "unpause" if unpause else "pause"
    try:
        p = parse_flags(cmd, args, [], interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status

    def action(c: Container) -> str:
        err = node.unpause_container(c) if unpause else node.pause_container(c)
        return f"Error response from daemon: {err}" if err else ""

    return _each(node, inv, cmd, p.positional, action)


def cmd_rm(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags(
            "rm",
            args,
            [
                Flag(("force", "f"), SWITCH),
                Flag(("volumes", "v"), SWITCH),
                Flag(("link", "l"), SWITCH),
            ],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    force = p.has("force")

    def action(c: Container) -> str:
        if c.running and not force:
            return (
                f'Error response from daemon: cannot remove container "/{c.name}": container is '
                "running: stop the container before removing or force remove"
            )
        if c.running:
            node.stop_container(c, 137)
        node.containers.pop(c.id, None)
        return ""

    if force and not p.positional:
        return 0
    return _each(node, inv, "rm", p.positional, action)


def _mount(spec: str) -> dict[str, str]:
    fields = dict(kv.partition("=")[::2] for kv in spec.split(","))
    return {
        "Type": fields.get("type", "volume"),
        "Source": fields.get("source", fields.get("src", "")),
        "Target": fields.get("target", fields.get("dst", fields.get("destination", ""))),
    }
