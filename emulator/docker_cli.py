"""The docker CLI subset an emulated node answers (Docker 26 output formats): `cmd_docker`
reads docker's own options and hands each subcommand to the module that holds it.

run, create, start/restart, stop/kill, pause/unpause, rm: emulator.docker_lifecycle;
ps, inspect, logs, port, info, version, image inspect, pull: emulator.docker_queries;
images (image ls) with --format: emulator.docker_image_list;
volume create, ls, inspect, rm: emulator.docker_volumes;
their flags: emulator.docker_flags; what they print: emulator.docker_formats.
Containers are `containers.Container`s; one with a GPU runs an emulated workload whose VRAM
follows its GPUPLATFORM_EMULATOR_PROFILE (see workload.Workload).
"""

from __future__ import annotations

from .docker_formats import DOCKER_VERSION
from .docker_image_list import cmd_image_ls
from .docker_lifecycle import cmd_pause, cmd_rm, cmd_run, cmd_start, cmd_stop
from .docker_queries import (
    cmd_image_inspect,
    cmd_info,
    cmd_inspect,
    cmd_logs,
    cmd_port,
    cmd_ps,
    cmd_pull,
    cmd_version,
)
from .docker_volumes import cmd_volume
from .shell import Invocation
from .state import NodeState

_SUBCOMMANDS = {
    "run": cmd_run,
    "ps": cmd_ps,
    "inspect": cmd_inspect,
    "stop": cmd_stop,
    "kill": lambda n, i, a: cmd_stop(n, i, a, kill=True),
    "rm": cmd_rm,
    "pause": cmd_pause,
    "unpause": lambda n, i, a: cmd_pause(n, i, a, unpause=True),
    "logs": cmd_logs,
    "start": cmd_start,
    "restart": lambda n, i, a: cmd_start(n, i, a, restart=True),
    "create": lambda n, i, a: cmd_run(n, i, a, create_only=True),
    "port": cmd_port,
    "info": cmd_info,
    "version": cmd_version,
    "images": cmd_image_ls,
    "pull": cmd_pull,
    "image inspect": cmd_image_inspect,
    "volume": cmd_volume,
}
_CONTAINER_ALIASES = {"ls": "ps", "list": "ps"}


def cmd_docker(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    while args and (args[0] in ("--debug", "-D", "--config") or args[0].startswith("--config=")):
        # a client configuration directory (a pull's own registry login): nothing to read
        args = args[2:] if args[0] == "--config" else args[1:]
    if not args or args[0] in ("--help", "-h", "help"):
        inv.out("\nUsage:  docker [OPTIONS] COMMAND\n\nA self-sufficient runtime for containers\n")
        return 0
    if args[0] in ("--version", "-v"):
        inv.out(f"Docker version {DOCKER_VERSION}, build 5650f9b\n")
        return 0
    sub, rest = args[0], args[1:]
    if sub == "container" and rest:
        sub, rest = _CONTAINER_ALIASES.get(rest[0], rest[0]), rest[1:]
    elif sub == "image" and rest:
        sub, rest = (
            {"ls": "images", "list": "images", "pull": "pull"}.get(rest[0], "image " + rest[0]),
            rest[1:],
        )
    handler = _SUBCOMMANDS.get(sub)
    if handler is None:
        inv.err(f"docker: '{sub}' is not a docker command.\nSee 'docker --help'\n")
        return 1
    return handler(node, inv, rest)
