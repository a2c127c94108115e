"""The commands an emulated node knows, and the small coreutils-like ones it also answers."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from . import docker_cli, docker_volumes, gpu_tools, node_disks
from .shell import ExitShell, Handler, Invocation, StdinSource
from .state import NodeState

BIN_DIRS = ("/usr/local/sbin/", "/usr/local/bin/", "/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/")
MAX_SLEEP_S = 5.0


def _echo(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    newline, escapes = True, False
    while args and args[0] in ("-n", "-e", "-E", "-ne", "-en"):
        newline = newline and "n" not in args[0]
        escapes = "e" in args[0][1:]
        args = args[1:]
    text = " ".join(args)
    if escapes:
        text = text.encode().decode("unicode_escape", errors="replace")
    inv.out(text + ("\n" if newline else ""))
    return 0


def _printf(node: NodeState, inv: Invocation) -> int:
    if len(inv.argv) < 2:
        inv.err("printf: usage: printf [-v var] format [arguments]\n")
        return 2
    fmt, args = inv.argv[1], inv.argv[2:]
    fmt = fmt.replace("\\n", "\n").replace("\\t", "\t")
    out = []
    it = iter(args)
    while True:
        i = 0
        consumed = False
        while i < len(fmt):
            c = fmt[i]
            if c == "%" and i + 1 < len(fmt):
                verb = fmt[i + 1]
                i += 2
                if verb == "%":
                    out.append("%")
                else:
                    consumed = True
                    out.append(next(it, "0" if verb == "d" else ""))
                continue
            out.append(c)
            i += 1
        rest = list(it)
        if not consumed or not rest:
            break
        it = iter(rest)
    inv.out("".join(out))
    return 0


def _touch(node: NodeState, inv: Invocation) -> int:
    paths = [a for a in inv.argv[1:] if not a.startswith("-")]
    if not paths:
        inv.err("touch: missing file operand\nTry 'touch --help' for more information.\n")
        return 1
    with node.lock:
        for p in paths:
            path = inv.shell.path(p)
            node.files.setdefault(path, b"")
    return 0


def _install(node: NodeState, inv: Invocation) -> int:
    """coreutils' install as the platform uses it: `-d DIR` (a directory: nothing to keep
    here), or `SOURCE DEST` where SOURCE is /dev/stdin (a slice's host key file)."""
    args, valued = inv.argv[1:], {"-m", "-o", "-g"}
    plain = [
        a
        for i, a in enumerate(args)
        if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)
    ]
    if "-d" in args:
        return 0
    if len(plain) != 2:
        inv.err("install: missing destination file operand\n")
        return 1
    source, dest = plain
    with node.lock:
        if source == "/dev/stdin":
            data = inv.stdin.read()
        elif inv.shell.path(source) in node.files:
            data = node.files[inv.shell.path(source)]
        else:
            inv.err(f"install: cannot stat '{source}': No such file or directory\n")
            return 1
        node.files[inv.shell.path(dest)] = data
    return 0


def _proc_file(node: NodeState, path: str) -> bytes | None:
    parts = path.strip("/").split("/")
    if len(parts) != 3 or parts[0] != "proc" or not parts[1].isdigit():
        return None
    pid = int(parts[1])
    with node.lock:
        node.refresh()
        proc = next((p for p in node.processes if p.pid == pid), None)
        container = next((c for c in node.containers.values() if c.running and c.pid == pid), None)
        if proc is None and container is None:
            return None
        cid = container.id if container else (proc.container_id if proc else None)
        name = proc.name if proc else "python3"
    if parts[2] == "cgroup":
        if cid:
            return f"0::/system.slice/docker-{cid}.scope\n".encode()
        return b"0::/user.slice/user-1000.slice/session-3.scope\n"
    if parts[2] == "comm":
        return f"{name}\n".encode()
    if parts[2] == "cmdline":
        return f"{name}\0/app/main.py\0".encode()
    return None


def _cat(node: NodeState, inv: Invocation) -> int:
    paths = [a for a in inv.argv[1:] if a != "-" and not (a.startswith("-") and len(a) > 1)]
    if not paths:
        inv.out(inv.stdin.read())
        return 0
    status = 0
    for p in paths:
        path = inv.shell.path(p)
        data = _proc_file(node, path) if path.startswith("/proc/") else None
        if data is None:
            with node.lock:
                data = node.files.get(path)
        if data is None:
            inv.err(f"cat: {p}: No such file or directory\n")
            status = 1
        else:
            inv.out(data)
    return status


def _head_tail(node: NodeState, inv: Invocation) -> int:
    n = 10
    args = inv.argv[1:]
    files = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-n" and i + 1 < len(args):
            n = int(args[i + 1].lstrip("+-") or 10)
            i += 1
        elif a.startswith("-n"):
            n = int(a[2:].lstrip("+-") or 10)
        elif a.startswith("-") and a[1:].isdigit():
            n = int(a[1:])
        else:
            files.append(a)
        i += 1
    data = (
        b"".join(node.files.get(inv.shell.path(f), b"") for f in files)
        if files
        else inv.stdin.read()
    )
    lines = data.splitlines(keepends=True)
    inv.out(b"".join(lines[:n] if inv.argv[0].endswith("head") else lines[-n:] if n else []))
    return 0


EMULATED_DISK_AVAIL = 500 * 1000**3  # what an emulated node's disks have free


def _df(node: NodeState, inv: Invocation) -> int:
    """GNU df as the platform asks it (`--output=avail -B1 -- PATH`): the bytes free."""
    inv.out(f"    Avail\n{EMULATED_DISK_AVAIL}\n")
    return 0


def _rm(node: NodeState, inv: Invocation) -> int:
    force = any(a.startswith("-") and "f" in a for a in inv.argv[1:])
    status = 0
    with node.lock:
        for p in (a for a in inv.argv[1:] if not a.startswith("-")):
            path = inv.shell.path(p)
            under = [k for k in node.files if k.startswith(path.rstrip("/") + "/")]
            if path in node.files:
                del node.files[path]
            elif under and any("r" in a for a in inv.argv[1:] if a.startswith("-")):
                for k in under:
                    del node.files[k]
            elif not force:
                inv.err(f"rm: cannot remove '{p}': No such file or directory\n")
                status = 1
    return status


def _ls(node: NodeState, inv: Invocation) -> int:
    paths = [a for a in inv.argv[1:] if not a.startswith("-")] or ["."]
    status = 0
    with node.lock:
        for p in paths:
            path = inv.shell.path(p)
            if path in node.files:
                inv.out(p + "\n")
                continue
            prefix = path.rstrip("/") + "/"
            names = sorted(
                {k[len(prefix) :].split("/")[0] for k in node.files if k.startswith(prefix)}
            )
            if not names:
                inv.err(f"ls: cannot access '{p}': No such file or directory\n")
                status = 2
            for name in names:
                inv.out(name + "\n")
    return status


def _uname(node: NodeState, inv: Invocation) -> int:
    parts = {
        "-s": "Linux",
        "-n": node.name,
        "-r": "5.15.0-105-generic",
        "-v": "#115-Ubuntu SMP Mon Apr 15 09:52:04 UTC 2024",
        "-m": "x86_64",
        "-o": "GNU/Linux",
    }
    args = inv.argv[1:] or ["-s"]
    if "-a" in args:
        inv.out(" ".join([*parts.values()][:5]) + " x86_64 x86_64 GNU/Linux\n")
        return 0
    inv.out(" ".join(parts.get(a, "") for a in args) + "\n")
    return 0


def _dmesg(node: NodeState, inv: Invocation) -> int:
    human = any(a in ("-T", "--ctime") for a in inv.argv[1:])
    with node.lock:
        entries = sorted(node.kernel_log)
        boot = node.boot_time
    for at, text in entries:
        if human:
            stamp = datetime.fromtimestamp(at, UTC).strftime("%a %b %d %H:%M:%S %Y")
        else:
            rel = max(0.0, at - boot)
            stamp = f"{int(rel):5d}.{int((rel % 1) * 1e6):06d}"
        inv.out(f"[{stamp}] {text}\n")
    return 0


def _sleep(node: NodeState, inv: Invocation) -> int:
    total = 0.0
    for a in inv.argv[1:]:
        mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(a[-1:], 1)
        try:
            total += float(a.rstrip("smhd") if a[-1:] in "smhd" else a) * mult
        except ValueError:
            if a == "infinity":
                total = MAX_SLEEP_S
                continue
            inv.err(
                f"sleep: invalid time interval '{a}'\nTry 'sleep --help' for more information.\n"
            )
            return 1
    time.sleep(min(total / max(node.clock.speed, 1e-9), MAX_SLEEP_S))
    return 0


def _test(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    if inv.argv[0] == "[":
        if not args or args[-1] != "]":
            inv.err("bash: [: missing `]'\n")
            return 2
        args = args[:-1]
    negate = False
    if args[:1] == ["!"]:
        negate, args = True, args[1:]
    result = False
    if not args:
        result = False
    elif len(args) == 1:
        result = args[0] != ""
    elif len(args) == 2:
        op, val = args
        if op in ("-e", "-f", "-r", "-s", "-x"):
            path = inv.shell.path(val)
            with node.lock:
                result = path in node.files and (op != "-s" or bool(node.files[path]))
        elif op == "-d":
            prefix = inv.shell.path(val).rstrip("/") + "/"
            with node.lock:
                result = prefix in ("/", "/tmp/", "/home/") or any(  # noqa: S108 - emulated fs
                    k.startswith(prefix) for k in node.files
                )
        elif op == "-z":
            result = val == ""
        elif op == "-n":
            result = val != ""
    elif len(args) == 3:
        a, op, b = args
        binary: dict[str, Callable[[], bool]] = {
            "=": lambda: a == b,
            "==": lambda: a == b,
            "!=": lambda: a != b,
            "-eq": lambda: int(a) == int(b),
            "-ne": lambda: int(a) != int(b),
            "-lt": lambda: int(a) < int(b),
            "-gt": lambda: int(a) > int(b),
            "-le": lambda: int(a) <= int(b),
            "-ge": lambda: int(a) >= int(b),
        }
        try:
            result = binary[op]()
        except (KeyError, ValueError):
            inv.err(f"bash: test: {op}: binary operator expected\n")
            return 2
    return 0 if bool(result) != negate else 1


def _exit(node: NodeState, inv: Invocation) -> int:
    code = (
        int(inv.argv[1])
        if len(inv.argv) > 1 and inv.argv[1].lstrip("-").isdigit()
        else inv.shell.last_status
    )
    raise ExitShell(code & 0xFF)


def _sh(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    while args and args[0].startswith("-") and "c" not in args[0]:
        args = args[1:]
    if args and args[0].startswith("-") and "c" in args[0]:
        if len(args) < 2:
            inv.err(f"{inv.argv[0]}: -c: option requires an argument\n")
            return 2
        return inv.shell.run_nested(args[1], inv)
    script = inv.stdin.read().decode(errors="replace")
    return inv.shell.run_nested(script, inv)


def _timeout(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    while args and args[0].startswith("-"):
        if args[0] in ("-s", "-k", "--signal", "--kill-after") and len(args) > 1:
            args = args[2:]
        else:
            args = args[1:]
    if len(args) < 2:
        inv.err("timeout: missing operand\nTry 'timeout --help' for more information.\n")
        return 125
    return inv.shell.run_argv(args[1:], inv)


def _env(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    env = dict(inv.env)
    if args[:1] in (["-i"], ["--ignore-environment"]):
        env, args = {}, args[1:]
    while args and "=" in args[0] and not args[0].startswith("="):
        k, _, v = args[0].partition("=")
        env[k] = v
        args = args[1:]
    if not args:
        inv.out("".join(f"{k}={v}\n" for k, v in env.items() if not k.startswith("__")))
        return 0
    return inv.shell.run_argv(args, inv, env)


def _exec(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    if args[:1] == ["command"]:
        args = args[1:]
    if not args:
        return 0
    return inv.shell.run_argv(args, inv)


def _command_v(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    verbose = bool(args) and args[0] in ("-v", "-V")
    names = args[1:] if verbose else args
    if inv.argv[0] == "command" and not verbose:
        return _exec(node, inv) if names else 0
    status = 0
    for n in names:
        h = lookup(node, n)
        if h is None:
            status = 1
            if inv.argv[0] == "which":
                continue
        else:
            inv.out((n if n in _SHELL_BUILTINS else f"/usr/bin/{n}") + "\n")
    return status


UTIL_LINUX_VERSION = "2.37.2"  # Ubuntu 22.04's, like the rest of the emulated host


def _nsenter(node: NodeState, inv: Invocation) -> int:
    """util-linux's nsenter: its version; entering a namespace is not emulated (the
    gateway's relay runs against the node lab)."""
    args = inv.argv[1:]
    if args[:1] in (["--version"], ["-V"]):
        inv.out(f"nsenter from util-linux {UTIL_LINUX_VERSION}\n")
        return 0
    if not args or args[0] in ("--help", "-h"):
        inv.out("\nUsage:\n nsenter [options] [<program> [<argument>...]]\n")
        return 0 if args else 1
    inv.err("nsenter: [emulator] entering namespaces is not emulated on this node\n")
    return 1


def _kill(node: NodeState, inv: Invocation) -> int:
    pids = [a for a in inv.argv[1:] if not a.startswith("-")]
    if inv.argv[1:2] == ["-s"]:
        pids = pids[1:]
    status = 0
    for p in pids:
        if not p.isdigit() or not node.kill_pid(int(p)):
            inv.err(f"bash: kill: ({p}) - No such process\n")
            status = 1
    return status


def _simple_out(
    text: Callable[[NodeState, Invocation], str],
) -> Callable[[NodeState, Invocation], int]:
    def handler(node: NodeState, inv: Invocation) -> int:
        inv.out(text(node, inv))
        return 0

    return handler


def _date(node: NodeState, inv: Invocation) -> int:
    now = datetime.fromtimestamp(node.clock.now(), UTC)
    fmt = next((a[1:] for a in inv.argv[1:] if a.startswith("+")), None)
    if fmt:
        inv.out(now.strftime(fmt.replace("%N", f"{now.microsecond * 1000:09d}")) + "\n")
    else:
        inv.out(now.strftime("%a %b %d %H:%M:%S UTC %Y") + "\n")
    return 0


_SHELL_BUILTINS = {
    "echo",
    "printf",
    "true",
    "false",
    ":",
    "test",
    "[",
    "exit",
    "command",
    "exec",
    "kill",
    "cd",
    "export",
}

_REGISTRY: dict[str, Callable[[NodeState, Invocation], int]] = {
    "python3": gpu_tools.cmd_python3,
    "python": gpu_tools.cmd_python3,
    "python3.10": gpu_tools.cmd_python3,
    "nvidia-smi": gpu_tools.cmd_nvidia_smi,
    "docker": docker_cli.cmd_docker,
    "du": docker_volumes.cmd_du,
    **node_disks.COMMANDS,  # the volumes' own filesystems, and sudo
    "echo": _echo,
    "printf": _printf,
    "true": lambda n, i: 0,
    ":": lambda n, i: 0,
    "false": lambda n, i: 1,
    "touch": _touch,
    "install": _install,
    "cat": _cat,
    "head": _head_tail,
    "tail": _head_tail,
    "rm": _rm,
    "df": _df,
    "ls": _ls,
    "mkdir": lambda n, i: 0,
    "cd": lambda n, i: 0,
    "export": lambda n, i: 0,
    "hostname": _simple_out(lambda n, i: n.name + "\n"),
    "uname": _uname,
    "id": _simple_out(
        lambda n, i: "uid=1000({u}) gid=1000({u}) groups=1000({u}),999(docker)\n".format(
            u=i.env.get("USER", "gpuplatform")
        )
    ),
    "whoami": _simple_out(lambda n, i: i.env.get("USER", "gpuplatform") + "\n"),
    "nproc": _simple_out(lambda n, i: "64\n"),
    "uptime": _simple_out(
        lambda n, i: (
            f" up {int((n.clock.now() - n.boot_time) // 86400)} days,  "
            "1 user,  load average: 0.42, 0.40, 0.38\n"
        )
    ),
    "date": _date,
    "dmesg": _dmesg,
    "sleep": _sleep,
    "test": _test,
    "[": _test,
    "exit": _exit,
    "sh": _sh,
    "bash": _sh,
    "timeout": _timeout,
    "env": _env,
    "exec": _exec,
    "command": _command_v,
    "which": _command_v,
    "kill": _kill,
    "nsenter": _nsenter,
}


def lookup(node: NodeState, name: str) -> Handler | None:
    path = name
    if "/" in name:
        for d in BIN_DIRS:
            if name.startswith(d) and "/" not in name[len(d) :]:
                name = name[len(d) :]
                break
        else:
            return _no_such_file(name)
    if name in node.missing_tools:
        return _no_such_file(path) if path != name else None
    fn = _REGISTRY.get(name)
    if fn is None:
        return None
    return lambda inv: fn(node, inv)


def _no_such_file(name: str) -> Handler:
    def handler(inv: Invocation) -> int:
        inv.err(f"bash: {name}: No such file or directory\n")
        return 127

    return handler


__all__ = ["lookup", "StdinSource"]
