"""`gpp ssh` and `gpp forward`: the system's OpenSSH client through the platform's SSH
gateway, with the host, port and slice name the API gives in `connection.gateway`.

The gateway hop is a ProxyCommand (`ssh -W`) rather than `-J` so that the key and options
given to gpp apply to both hops: OpenSSH applies command-line options to the destination
only, never to a jump host."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from typing import Any

import click

from cli import output
from cli.client import refused
from cli.common import api, json_option, slice_id

GATEWAY_USER = "gpp"  # the gateway ignores the user name; its commands say gpp@


def _ssh_binary() -> str:
    chosen = os.environ.get("GPP_SSH", "ssh")
    found = shutil.which(chosen)
    if not found:
        raise click.UsageError(f"OpenSSH's client {chosen!r} is not installed (or set GPP_SSH)")
    return chosen


def _gateway(ident: int) -> tuple[dict[str, Any], dict[str, Any]]:
    shown = api().get(f"/slices/{ident}/")
    if shown["state"] != "running":
        raise refused("slice_not_running", f"Slice {ident} is {shown['state']}, not running.")
    gateway = (shown.get("connection") or {}).get("gateway")
    if not gateway:
        raise refused(
            "no_gateway",
            f"Slice {ident} has no gateway details: its image declares no port.",
        )
    return shown, gateway


def _options(identity: str | None, options: tuple[str, ...]) -> list[str]:
    out = ["-i", identity] if identity else []
    for option in options:
        out += ["-o", option]
    return out


def _proxy(ssh: str, gateway: dict[str, Any], extra: list[str]) -> str:
    argv = [ssh, *extra, "-p", str(gateway["port"]), "-W", "%h:%p",
            f"{GATEWAY_USER}@{gateway['host']}"]  # fmt: skip
    return " ".join(shlex.quote(a) if a != "%h:%p" else a for a in argv)


def _destination_user(gateway: dict[str, Any], fallback: str) -> str:
    """The image's ssh user, as the API writes it into `jump` (`... root@slice-7`)."""
    jump = gateway.get("jump") or ""
    last = shlex.split(jump)[-1] if jump else ""
    return last.split("@", 1)[0] if "@" in last else fallback


def _run(argv: list[str], as_json: bool, shown: dict[str, Any], gateway: dict[str, Any]) -> None:
    if as_json:
        output.emit_json({"slice": shown["id"], "argv": argv, "gateway": gateway})
        return
    fingerprint = gateway.get("host_key_fingerprint")
    if fingerprint:
        output.note(f"The gateway's host key is {fingerprint}: compare it if ssh asks.")
    try:
        code = subprocess.call(argv)  # noqa: S603 - the user's own ssh with their own arguments
    except KeyboardInterrupt:
        code = 130
    raise click.exceptions.Exit(code)


def default_local_port(port: int, gateway: dict[str, Any] | None = None) -> int:
    """The local port a forward of `port` listens on: the one the platform names for it
    (`local_port` in `connection.gateway.forwards`), else the platform's rule: 10000
    above it (8000 -> 18000, clear of the platform's own 8000 and of the ports below 1024
    only root may take), or 10000 below one above 55535."""
    for forward in (gateway or {}).get("forwards") or []:
        if int(forward.get("port", 0)) == port and forward.get("local_port"):
            return int(forward["local_port"])
    return port + 10000 if port + 10000 <= 65535 else port - 10000


def _pin(gateway: dict[str, Any]) -> list[str]:
    """Options that pin the slice's own host key (the known_hosts line the API gives), so a
    resumed slice logs in with no prompt and a changed key is refused."""
    line = gateway.get("known_hosts") or ""
    if not line:
        return []
    return ["-o", f"HostKeyAlias={gateway['name']}", "-o", f"KnownHostsCommand=/bin/echo {line}"]


ssh_options = [
    click.option("-i", "--identity", help="The private key to use (both hops)."),
    click.option("-o", "--option", "options", multiple=True, metavar="OPTION",
                 help="An ssh -o option (both hops), e.g. -o StrictHostKeyChecking=yes."),
]  # fmt: skip


def with_ssh_options(command: Any) -> Any:
    for option in reversed(ssh_options):
        command = option(command)
    return command


@click.command()
@click.argument("slice_ref", metavar="SLICE")
@click.argument("command", nargs=-1)
@click.option("--user", "-l", help="Log in as this user (default: the image's ssh user).")
@with_ssh_options
@json_option
def ssh(
    slice_ref: str,
    command: tuple[str, ...],
    user: str | None,
    identity: str | None,
    options: tuple[str, ...],
    as_json: bool,
) -> None:
    """Log in to a running slice's own sshd through the platform's gateway (your key must
    be registered on your account, and given to the slice at launch). Exits with ssh's
    status. --json prints the ssh command instead of running it."""
    ident = slice_id(slice_ref)
    shown, gateway = _gateway(ident)
    if not gateway.get("jump"):
        ports = ", ".join(str(f["port"]) for f in gateway.get("forwards") or [])
        raise refused(
            "no_ssh",
            f"Slice {ident}'s image has no sshd on port 22; forward a port instead: "
            f"gpp forward {ident} PORT (ports: {ports or 'none'}).",
        )
    binary = _ssh_binary()
    if not as_json and not api().all("/ssh-keys/"):
        output.note(
            "You have no SSH key registered on your account, so the gateway will refuse "
            "you: add your public key on the account page (/account/)."
        )
    extra = _options(identity, options)
    login = user or _destination_user(gateway, "root")
    argv = [binary, *extra, *_pin(gateway), "-o", f"ProxyCommand={_proxy(binary, gateway, extra)}",
            f"{login}@{gateway['name']}", *command]  # fmt: skip
    pinned = gateway.get("slice_host_key_fingerprint")
    if pinned and not as_json:
        output.note(f"The slice's own host key is {pinned} (pinned: ssh refuses another).")
    _run(argv, as_json, shown, gateway)


@click.command()
@click.argument("slice_ref", metavar="SLICE")
@click.argument("port", type=click.IntRange(1, 65535))
@click.option(
    "--local-port",
    type=click.IntRange(0, 65535),
    help="The port on this machine, on 127.0.0.1 (default: the one the slice page shows, "
    "PORT + 10000).",
)
@with_ssh_options
@json_option
def forward(
    slice_ref: str,
    port: int,
    local_port: int | None,
    identity: str | None,
    options: tuple[str, ...],
    as_json: bool,
) -> None:
    """Forward a local port to PORT of a running slice through the gateway (ssh -N -L)
    until Ctrl-C. PORT must be one the slice's image declares."""
    ident = slice_id(slice_ref)
    shown, gateway = _gateway(ident)
    declared = [int(f["port"]) for f in gateway.get("forwards") or []]
    if port not in declared:
        raise refused(
            "port_not_declared",
            f"Slice {ident}'s image declares port(s) {', '.join(map(str, declared)) or 'none'};"
            f" the gateway opens only those.",
        )
    binary = _ssh_binary()
    local = local_port if local_port is not None else default_local_port(port, gateway)
    argv = [binary, "-N", "-o", "ExitOnForwardFailure=yes", *_options(identity, options),
            "-L", f"127.0.0.1:{local}:{gateway['name']}:{port}", "-p", str(gateway["port"]),
            f"{GATEWAY_USER}@{gateway['host']}"]  # fmt: skip
    if not as_json:
        output.note(
            f"Forwarding 127.0.0.1:{local} to slice {ident} port {port} (open "
            f"http://127.0.0.1:{local}/ for a web service); Ctrl-C ends it."
        )
    _run(argv, as_json, shown, gateway)
