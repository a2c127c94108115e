"""`docker volume` on an emulated node (Docker 26's answers): create with labels and the
local driver's options (a bind of a node directory: type=none, o=bind, device=...), ls,
inspect (JSON or a Go template of .Name/.Mountpoint/.Driver/.Options), rm (refused while a
container uses it), and `du` of a volume's directory (docker's, or the directory it binds),
whose size tests set (`EmulatedNode.set_volume_bytes`).
"""

from __future__ import annotations

import json
from typing import Any

from .gotemplate import render
from .node_disks import disks_of
from .shell import Invocation
from .state import NodeState

VOLUMES_ROOT = "/var/lib/docker/volumes"


def mountpoint(name: str) -> str:
    return f"{VOLUMES_ROOT}/{name}/_data"


def _doc(node: NodeState, name: str) -> dict[str, Any]:
    return {
        "CreatedAt": "2026-01-01T00:00:00Z",
        "Driver": "local",
        "Labels": node.volumes[name],
        "Mountpoint": mountpoint(name),
        "Name": name,
        "Options": disks_of(node).volume_options.get(name) or None,
        "Scope": "local",
    }


def _in_use(node: NodeState, name: str) -> list[str]:
    return [c.id for c in node.containers.values() if name in c.host_config.get("_Volumes", [])]


def cmd_volume(node: NodeState, inv: Invocation, args: list[str]) -> int:
    if not args:
        inv.err("\nUsage:  docker volume COMMAND\n\nManage volumes\n")
        return 1
    sub, rest = args[0], args[1:]
    if sub == "create":
        return _create(node, inv, rest)
    if sub in ("ls", "list"):
        inv.out("DRIVER    VOLUME NAME\n")
        for name in sorted(node.volumes):
            inv.out(f"local     {name}\n")
        return 0
    if sub == "inspect":
        return _inspect(node, inv, rest)
    if sub == "rm":
        return _rm(node, inv, rest)
    inv.err(f"docker: 'volume {sub}' is not a docker command.\n")
    return 1


def _create(node: NodeState, inv: Invocation, rest: list[str]) -> int:
    labels: dict[str, str] = {}
    options: dict[str, str] = {}
    names = []
    while rest:
        item = rest.pop(0)
        if item in ("--label", "-l") and rest:
            key, _, value = rest.pop(0).partition("=")
            labels[key] = value
        elif item in ("--opt", "-o") and rest:
            key, _, value = rest.pop(0).partition("=")
            options[key] = value
        elif item in ("--driver", "-d") and rest:
            driver = rest.pop(0)
            if driver != "local":
                inv.err(f'Error response from daemon: plugin "{driver}" not found\n')
                return 1
        elif item.startswith("-"):
            inv.err(f"unknown flag: {item}\nSee 'docker volume create --help'.\n")
            return 125
        else:
            names.append(item)
    if len(names) != 1:
        inv.err('"docker volume create" requires at most 1 argument.\n')
        return 1
    if options and options.get("type") == "none" and not options.get("device"):
        inv.err("Error response from daemon: missing device in volume options\n")
        return 1
    node.volumes.setdefault(names[0], labels)
    disks_of(node).volume_options.setdefault(names[0], options)
    node.volume_bytes.setdefault(names[0], 0)
    inv.out(names[0] + "\n")
    return 0


def _inspect(node: NodeState, inv: Invocation, rest: list[str]) -> int:
    template = None
    if len(rest) >= 2 and rest[0] in ("--format", "-f"):
        template, rest = rest[1], rest[2:]
    missing = [n for n in rest if n not in node.volumes]
    if missing or not rest:
        inv.err(f"Error response from daemon: get {(missing or ['?'])[0]}: no such volume\n")
        return 1
    docs = [_doc(node, n) for n in rest]
    if template is None:
        inv.out(json.dumps(docs, indent=4) + "\n")
    else:
        for doc in docs:
            inv.out(render(template, doc) + "\n")
    return 0


def _rm(node: NodeState, inv: Invocation, rest: list[str]) -> int:
    """Removes each named volume; one that is missing or in use is refused, not the rest."""
    code = 0
    for name in [a for a in rest if not a.startswith("-")]:
        if name not in node.volumes:
            inv.err(f"Error response from daemon: get {name}: no such volume\n")
            code = 1
            continue
        users = _in_use(node, name)
        if users:
            inv.err(f"Error response from daemon: remove {name}: volume is in use - [{users[0]}]\n")
            code = 1
            continue
        del node.volumes[name]
        disks_of(node).volume_options.pop(name, None)
        node.volume_bytes.pop(name, None)
        inv.out(name + "\n")
    return code


def cmd_du(node: NodeState, inv: Invocation) -> int:
    """GNU du --summarize --block-size=1 of a volume's directory (others: 4096, empty)."""
    paths = [a for a in inv.argv[1:] if not a.startswith("-")]
    devices = {
        o.get("device"): n for n, o in disks_of(node).volume_options.items() if o.get("device")
    }
    for path in paths:
        name = devices.get(path) or path.removeprefix(VOLUMES_ROOT + "/").removesuffix("/_data")
        if path.startswith(VOLUMES_ROOT) and name not in node.volumes:
            inv.err(f"du: cannot access '{path}': No such file or directory\n")
            return 1
        inv.out(f"{4096 + node.volume_bytes.get(name, 0)}\t{path}\n")
    return 0
