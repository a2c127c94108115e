"""How the emulated docker CLI reads its arguments: flags as docker's (cobra/pflag) parser
takes them, the flags of `docker run`, and the values of --gpus and --publish."""

from __future__ import annotations

from dataclasses import dataclass, field

from .state import NodeState


class UsageError(Exception):
    def __init__(self, message: str, status: int = 125):
        super().__init__(message)
        self.status = status


@dataclass
class Flag:
    names: tuple[str, ...]
    takes_value: bool
    repeat: bool = False


@dataclass
class Parsed:
    values: dict[str, list[str]] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)

    def get(self, key: str, default: str | None = None) -> str | None:
        v = self.values.get(key)
        return v[-1] if v else default

    def all(self, key: str) -> list[str]:
        return self.values.get(key, [])

    def has(self, key: str) -> bool:
        return key in self.values


def parse_flags(cmd: str, args: list[str], flags: list[Flag], interspersed: bool) -> Parsed:
    """``args`` as docker's parser reads them: long flags (``--name value``, ``--name=value``),
    bundled short ones (``-dit``, ``-e A=1``, ``-eA=1``), positionals (after the first one,
    all positional unless ``interspersed``), and ``--`` ending the flags."""
    by_name = {name: flag for flag in flags for name in flag.names}
    out = Parsed()
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out.positional += args[i + 1 :]
            break
        if a.startswith("--") and len(a) > 2:
            i = _long_flag(cmd, args, i, by_name, out)
        elif a.startswith("-") and len(a) > 1:
            i = _short_flags(cmd, args, i, by_name, out)
        else:
            if not interspersed:
                out.positional += args[i:]
                break
            out.positional.append(a)
        i += 1
    return out


def _long_flag(cmd: str, args: list[str], i: int, by_name: dict[str, Flag], out: Parsed) -> int:
    """``args[i]`` is ``--name[=value]``: records it; the index of the last argument used."""
    name, eq, val = args[i][2:].partition("=")
    flag = by_name.get(name)
    if flag is None:
        raise UsageError(f"unknown flag: --{name}\nSee 'docker {cmd} --help'.")
    key = flag.names[0]
    if not flag.takes_value:
        out.values.setdefault(key, []).append(val if eq else "true")
        return i
    if not eq:
        if i + 1 >= len(args):
            raise UsageError(f"flag needs an argument: --{name}\nSee 'docker {cmd} --help'.")
        i += 1
        val = args[i]
    out.values.setdefault(key, []).append(val)
    return i


def _short_flags(cmd: str, args: list[str], i: int, by_name: dict[str, Flag], out: Parsed) -> int:
    """``args[i]`` is ``-abc``: switches up to the first flag that takes a value, which takes
    the rest of the word (past an ``=``) or the next argument; the index of the last used."""
    a = args[i]
    for j in range(1, len(a)):
        ch = a[j]
        flag = by_name.get(ch)
        if flag is None:
            raise UsageError(f"unknown shorthand flag: '{ch}' in {a}\nSee 'docker {cmd} --help'.")
        key = flag.names[0]
        if not flag.takes_value:
            out.values.setdefault(key, []).append("true")
            continue
        rest = a[j + 1 :]
        if rest.startswith("="):
            rest = rest[1:]
        if not rest:
            if i + 1 >= len(args):
                raise UsageError(
                    f"flag needs an argument: '{ch}' in -{ch}\nSee 'docker {cmd} --help'."
                )
            i += 1
            rest = args[i]
        out.values.setdefault(key, []).append(rest)
        break
    return i


VALUE = True  # Flag(names, VALUE): the flag takes a value
SWITCH = False  # Flag(names, SWITCH): a switch, on when given
RUN_FLAGS = [
    Flag(("name",), VALUE),
    Flag(("gpus",), VALUE),
    Flag(("cpus",), VALUE),
    Flag(("cpu-period",), VALUE),
    Flag(("cpu-quota",), VALUE),
    Flag(("memory", "m"), VALUE),
    Flag(("memory-swap",), VALUE),
    Flag(("memory-reservation",), VALUE),
    Flag(("pids-limit",), VALUE),
    Flag(("cap-drop",), VALUE),
    Flag(("cap-add",), VALUE),
    Flag(("security-opt",), VALUE),
    Flag(("label", "l"), VALUE),
    Flag(("env", "e"), VALUE),
    Flag(("publish", "p"), VALUE),
    Flag(("runtime",), VALUE),
    Flag(("restart",), VALUE),
    Flag(("network", "net"), VALUE),
    Flag(("shm-size",), VALUE),
    Flag(("ulimit",), VALUE),
    Flag(("user", "u"), VALUE),
    Flag(("workdir", "w"), VALUE),
    Flag(("entrypoint",), VALUE),
    Flag(("hostname", "h"), VALUE),
    Flag(("ipc",), VALUE),
    Flag(("volume", "v"), VALUE),
    Flag(("mount",), VALUE),
    Flag(("log-driver",), VALUE),
    Flag(("log-opt",), VALUE),
    Flag(("stop-timeout",), VALUE),
    Flag(("stop-signal",), VALUE),
    Flag(("device",), VALUE),
    Flag(("tmpfs",), VALUE),
    Flag(("cpu-shares", "c"), VALUE),
    Flag(("cpuset-cpus",), VALUE),
    Flag(("pull",), VALUE),
    Flag(("platform",), VALUE),
    Flag(("add-host",), VALUE),
    Flag(("oom-score-adj",), VALUE),
    Flag(("group-add",), VALUE),
    Flag(("expose",), VALUE),
    Flag(("sysctl",), VALUE),
    Flag(("detach", "d"), SWITCH),
    Flag(("rm",), SWITCH),
    Flag(("interactive", "i"), SWITCH),
    Flag(("tty", "t"), SWITCH),
    Flag(("init",), SWITCH),
    Flag(("read-only",), SWITCH),
    Flag(("privileged",), SWITCH),
    Flag(("publish-all", "P"), SWITCH),
    Flag(("quiet", "q"), SWITCH),
    Flag(("oom-kill-disable",), SWITCH),
    Flag(("no-healthcheck",), SWITCH),
]


def parse_gpus(value: str) -> tuple[int | None, list[str] | None]:
    """docker's --gpus: (count, device ids). count -1 = all."""
    # a CSV record: `"device=0,1"` keeps its comma
    fields: list[str] = []
    cur, quoted = "", False
    for ch in value:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            fields.append(cur)
            cur = ""
        else:
            cur += ch
    fields.append(cur)
    count: int | None = None
    devices: list[str] | None = None
    for k, f in enumerate(fields):
        key, eq, val = f.partition("=")
        if not eq:
            if k == 0 and (key == "all" or key.isdigit()):
                count = -1 if key == "all" else int(key)
                continue
            raise UsageError(
                f"invalid argument \"{value}\" for \"--gpus\" flag: unexpected key '{key}' in '{f}'"
            )
        if key == "count":
            count = -1 if val == "all" else int(val) if val.isdigit() else None
            if count is None:
                raise UsageError(
                    f'invalid argument "{value}" for "--gpus" flag: strconv.Atoi: '
                    f'parsing "{val}": invalid syntax'
                )
        elif key == "device":
            devices = [d for d in val.split(",") if d]
        elif key in ("driver", "capabilities", "options"):
            continue
        else:
            raise UsageError(
                f"invalid argument \"{value}\" for \"--gpus\" flag: unexpected key '{key}' in '{f}'"
            )
    if count is not None and devices is not None:
        raise UsageError(
            f'invalid argument "{value}" for "--gpus" flag: '
            "cannot set both Count and DeviceIDs on device request"
        )
    return count, devices


def parse_ports(specs: list[str], node: NodeState) -> list[tuple[str, str, int]]:
    out = []
    for spec in specs:
        proto = "tcp"
        body = spec
        if "/" in body:
            body, proto = body.rsplit("/", 1)
        parts = body.split(":")
        if len(parts) == 1:
            hip, hport, cport = "", "", parts[0]
        elif len(parts) == 2:
            hip, hport, cport = "", parts[0], parts[1]
        else:
            hip, hport, cport = ":".join(parts[:-2]), parts[-2], parts[-1]
        if not cport.isdigit() or (hport and not hport.isdigit()):
            raise UsageError(
                f'invalid argument "{spec}" for "-p, --publish" flag: '
                f"Invalid containerPort: {cport}"
            )
        if not hport:
            hport = str(node_next_port(node))
        out.append((f"{cport}/{proto}", hip, int(hport)))
    return out


def node_next_port(node: NodeState) -> int:
    used = {p for c in node.containers.values() for _, _, p in c.ports}
    port = 32768
    while port in used:
        port += 1
    return port
