"""Command lines of the emulator: `python -m emulator [serve options]` runs a fleet,
`python -m emulator ctl ...` drives a running one (this module imports no Django)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from .control import DEFAULT_CONTROL_PORT, ControlClient, ControlError
from .fleet import EmulatedFleet

DEFAULT_STATE_DIR = "var/emulator"


# --- serve


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=4, help="number of nodes (default 4)")
    parser.add_argument(
        "--base-port",
        type=int,
        default=2201,
        help="node i listens on base+i (0: OS picks; default 2201)",
    )
    parser.add_argument(
        "--gpus-per-node", type=int, default=None, help="G GPUs of one model per node"
    )
    parser.add_argument(
        "--control-port",
        type=int,
        default=int(os.environ.get("GPUPLATFORM_EMULATOR_CONTROL_PORT", DEFAULT_CONTROL_PORT)),
        help=f"control API port on 127.0.0.1 (default {DEFAULT_CONTROL_PORT}; 0: any; -1: off)",
    )
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="host keys and fleet.json")
    parser.add_argument(
        "--authorized-key-file",
        action="append",
        default=[],
        help="authorized_keys file (OpenSSH lines; re-read when it changes). Repeatable. "
        "Default: <state-dir>/authorized_keys",
    )
    parser.add_argument("--authorized-key", action="append", default=[], help="one public key line")
    parser.add_argument("--speed", type=float, default=1.0, help="emulated time speed factor")
    parser.add_argument("--name-prefix", default="emu", help="node names: <prefix>-01 ...")
    parser.add_argument(
        "--user", action="append", default=None, help="allowed SSH user (default any)"
    )
    parser.add_argument("--json", action="store_true", help="print the fleet as one JSON document")


def serve(
    options: dict[str, Any], out: TextIO = sys.stdout, stop: threading.Event | None = None
) -> int:
    state_dir = Path(options.get("state_dir") or DEFAULT_STATE_DIR)
    state_dir.mkdir(parents=True, exist_ok=True)
    key_files = [Path(p) for p in options.get("authorized_key_file") or []]
    key_lines = list(options.get("authorized_key") or [])
    env_file = os.environ.get("GPUPLATFORM_EMULATOR_AUTHORIZED_KEYS")
    if env_file:
        key_files.append(Path(env_file))
    if not key_files and not key_lines:
        default = state_dir / "authorized_keys"
        default.touch(exist_ok=True)
        key_files.append(default)
    control_port = options.get("control_port")
    # This process only serves SSH: hand the GIL over quickly between the transport and exec
    # threads (the default 5 ms interval shows up as latency on every exec round trip).
    sys.setswitchinterval(float(os.environ.get("GPUPLATFORM_EMULATOR_SWITCH_INTERVAL", "0.001")))
    fleet = EmulatedFleet.start(
        count=int(options.get("count") or 4),
        gpus_per_node=options.get("gpus_per_node"),
        base_port=int(options.get("base_port") or 0),
        authorized_keys=key_lines,
        authorized_key_files=key_files,
        state_dir=state_dir,
        speed=float(options.get("speed") or 1.0),
        control_port=None if control_port is None or control_port < 0 else control_port,
        name_prefix=options.get("name_prefix") or "emu",
        users=set(options["user"]) if options.get("user") else None,
        control_port_fallback=True,
    )
    try:
        _announce(fleet, options, out, state_dir, key_files)
        _wait(stop or threading.Event())
    finally:
        fleet.stop()
    return 0


def _announce(
    fleet: EmulatedFleet,
    options: dict[str, Any],
    out: TextIO,
    state_dir: Path,
    key_files: list[Path],
) -> None:
    """The fleet as one JSON document (--json), or a header and a line per node."""
    if options.get("json"):
        out.write(json.dumps(fleet.describe(), indent=2) + "\n")
    else:
        ctl = f"http://127.0.0.1:{fleet.control_port}" if fleet.control_port else "off"
        out.write(
            f"# gpuplatform node emulator: {len(fleet.nodes)} nodes, control {ctl}, "
            f"state {state_dir}/fleet.json, authorized keys from "
            f"{', '.join(map(str, key_files)) or 'command line'}\n"
            "# name\taddress\tport\thost-key line\n"
        )
        for n in fleet.nodes:
            out.write(f"{n.name}\t{n.address}\t{n.port}\t{n.host_key_line()}\n")
        if not fleet.authorized:
            out.write(
                "# warning: no authorized keys yet; every login is refused until one is added\n"
            )
    out.flush()


def _wait(stop: threading.Event) -> None:
    """Until ``stop`` is set, SIGTERM or SIGINT arrives (main thread), or Ctrl-C."""
    if threading.current_thread() is threading.main_thread():
        # SIGINT too: a background job inherits it ignored, and supervisors send it
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.2):
            pass
    except KeyboardInterrupt:
        pass


# --- ctl


def add_ctl_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--control-url", default=None, help="e.g. http://127.0.0.1:8790")
    parser.add_argument("--control-port", type=int, default=None)
    parser.add_argument(
        "--state-dir", default=DEFAULT_STATE_DIR, help="finds the port in fleet.json"
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def node_cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("node")
        return p

    sub.add_parser("fleet", help="list nodes, ports, host keys")
    node_cmd("show", "one node with its containers")
    p = node_cmd("audit", "commands executed on a node")
    p.add_argument("--since", type=int, default=0)
    p = node_cmd("xid", "inject an Xid error")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--code", type=int, default=79)
    p.add_argument("--pid", type=int, default=None)
    p.add_argument("--message", default=None)
    p = node_cmd("ecc", "inject ECC / row-remapping trouble")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--uncorrected", type=int, default=1)
    p.add_argument("--remapped-pending", action="store_true", default=None)
    p.add_argument("--remapped-failure", action="store_true", default=None)
    p.add_argument("--retired-pending", action="store_true", default=None)
    p.add_argument("--xid", type=int, default=None, help="also log this Xid (e.g. 48, 63, 64)")
    p = node_cmd("clear-ecc", "reset ECC state")
    p.add_argument("--gpu", type=int, default=0)
    p = node_cmd("down", "make a node unreachable")
    p.add_argument("--mode", choices=["refuse", "hang"], default="refuse")
    node_cmd("up", "bring a node back")
    p = node_cmd("delay", "delay every command")
    p.add_argument("seconds", type=float)
    node_cmd("rotate-host-key", "new host key (drops connections)")
    p = node_cmd("nvml", "NVML available (on) or not (off: the sampler exits 3)")
    p.add_argument("state", choices=["on", "off"])
    p.add_argument("--error", default=None)
    p = node_cmd("driver", "NVIDIA driver loaded (on) or not (off: nvidia-smi fails too)")
    p.add_argument("state", choices=["on", "off"])
    p = node_cmd("kill", "kill a container")
    p.add_argument("container")
    p.add_argument("--exit-code", type=int, default=137)
    p.add_argument("--oom-killed", action="store_true")
    p = sub.add_parser("advance", help="move emulated time forward")
    p.add_argument("seconds", type=float)
    p = sub.add_parser("speed", help="set the emulated time speed factor")
    p.add_argument("factor", type=float)


def _control_url(options: dict[str, Any]) -> str:
    if options.get("control_url"):
        return str(options["control_url"])
    port = options.get("control_port")
    if port is None:
        fleet_file = Path(options.get("state_dir") or DEFAULT_STATE_DIR) / "fleet.json"
        try:
            port = json.loads(fleet_file.read_text()).get("control_port")
        except (OSError, ValueError):
            port = None
    if port is None:
        port = int(os.environ.get("GPUPLATFORM_EMULATOR_CONTROL_PORT", DEFAULT_CONTROL_PORT))
    return f"http://127.0.0.1:{port}"


def ctl(options: dict[str, Any], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    client = ControlClient(_control_url(options))
    action = options["action"]
    call = _ctl_call(action, options)
    if call is None:
        err.write(f"unknown action {action}\n")
        return 2
    path, body = call
    try:
        result = client.get(path) if body is None else client.post(path, **body)
    except ControlError as e:
        err.write(f"emulator: {e} (HTTP {e.status})\n")
        return 1
    except OSError as e:
        err.write(f"emulator control API unreachable at {client.url}: {e}\n")
        return 1
    out.write(json.dumps(result, indent=2) + "\n")
    return 0


def _ctl_call(action: str, options: dict[str, Any]) -> tuple[str, dict[str, Any] | None] | None:
    """The control API call of one action: its path and, for a POST, its body (None: a
    GET); None for an action there is none of."""
    node = options.get("node")
    gets = {
        "fleet": "/fleet",
        "show": f"/nodes/{node}",
        "audit": f"/nodes/{node}/audit?since={options.get('since') or 0}",
    }
    if action in gets:
        return gets[action], None
    if action in ("advance", "speed"):
        key, value = ("advance", "seconds") if action == "advance" else ("speed", "factor")
        return "/clock", {key: options[value]}
    body = _node_post_body(action, options)
    return None if body is None else (f"/nodes/{node}/{action}", body)


def _node_post_body(action: str, options: dict[str, Any]) -> dict[str, Any] | None:
    if action == "xid":
        return {
            "gpu": options["gpu"],
            "code": options["code"],
            "pid": options.get("pid"),
            "message": options.get("message"),
        }
    if action == "ecc":
        return {
            "gpu": options["gpu"],
            "uncorrected": options["uncorrected"],
            "remapped_rows_pending": options.get("remapped_pending"),
            "remapped_rows_failure": options.get("remapped_failure"),
            "retired_pages_pending": options.get("retired_pending"),
            "xid": options.get("xid"),
        }
    if action == "clear-ecc":
        return {"gpu": options["gpu"]}
    if action == "down":
        return {"mode": options["mode"]}
    if action in ("up", "rotate-host-key"):
        return {}
    if action == "delay":
        return {"seconds": options["seconds"]}
    if action == "nvml":
        return {"available": options["state"] == "on", "error": options.get("error")}
    if action == "driver":
        return {"loaded": options["state"] == "on"}
    if action == "kill":
        return {
            "container": options["container"],
            "exit_code": options["exit_code"],
            "oom_killed": options["oom_killed"],
        }
    return None


def main(argv: list[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """`python -m emulator [serve options]` or `python -m emulator ctl ...`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["ctl"]:
        parser = argparse.ArgumentParser(prog="python -m emulator ctl")
        add_ctl_arguments(parser)
        return ctl(vars(parser.parse_args(argv[1:])), out=out, err=err)
    parser = argparse.ArgumentParser(prog="python -m emulator", description="GPU node emulator")
    add_serve_arguments(parser)
    return serve(vars(parser.parse_args(argv)), out=out)
