"""`gpp volumes`: your tenant's volumes (storage on one GPU node that outlives a slice):
list, show, create, and delete with the volume's name as the API's confirmation."""

from __future__ import annotations

import time
from typing import Any

import click

from cli import output
from cli.client import Api, refused
from cli.common import api, find_by_name_or_id, json_option, yes_option

KEPT = ("creating", "ready", "deleting", "failed")
WAIT_S = 120


def _rows(rows: list[dict[str, Any]]) -> None:
    output.table(
        ["ID", "NAME", "SIZE", "USED", "STATE", "CREATED", "REASON"],
        ([v["id"], v["name"], f"{v['size_gb']} GB",
          "" if v.get("used_gb") is None else f"{v['used_gb']} GB", v["state"],
          output.when(v.get("created_at")), v.get("state_reason") or ""] for v in rows),
    )  # fmt: skip


def _find(client: Api, text: str) -> dict[str, Any]:
    return find_by_name_or_id(
        [v for v in client.all("/volumes/") if v["state"] != "deleted"], text, kind="volume"
    )


@click.group(invoke_without_command=True)
@click.option("--all", "show_all", is_flag=True, help="Also the deleted ones.")
@json_option
@click.pass_context
def volumes(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """Your volumes: list (the default), show, create, delete."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_volumes, show_all=show_all, as_json=as_json)


@volumes.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also the deleted ones.")
@json_option
def list_volumes(show_all: bool = False, as_json: bool = False) -> None:
    """Your volumes (not the deleted ones unless --all)."""
    rows = [v for v in api().all("/volumes/") if show_all or v["state"] in KEPT]
    if as_json:
        output.emit_json(rows)
    elif rows:
        _rows(rows)
    else:
        output.note("No volumes (gpp volumes create NAME --size GB).")


@volumes.command("show")
@click.argument("volume")
@json_option
def show_volume(volume: str, as_json: bool) -> None:
    """One volume, by name or id."""
    found = _find(api(), volume)
    if as_json:
        output.emit_json(found)
    else:
        _rows([found])


@volumes.command("create")
@click.argument("name")
@click.option("--size", "size_gb", type=click.IntRange(1), required=True, help="Whole GB.")
@click.option("--wait", is_flag=True, help="Wait until its node has made it.")
@json_option
def create_volume(name: str, size_gb: int, wait: bool, as_json: bool) -> None:
    """Create a volume NAME of SIZE GB (billed per GB-hour); mount it at launch with
    --volume NAME:/data."""
    client = api()
    made = client.post("/volumes/", {"name": name, "size_gb": size_gb})
    if wait:
        deadline = time.monotonic() + WAIT_S
        while made["state"] == "creating" and time.monotonic() < deadline:
            time.sleep(1)
            made = client.get(f"/volumes/{made['id']}/")
        if made["state"] == "creating":
            raise refused(
                "wait_timeout", f"Volume {name} is still being made after {WAIT_S} s.", body=made
            )
        if made["state"] != "ready":
            raise refused(
                f"volume_{made['state']}",
                f"Volume {name} is {made['state']}: {made.get('state_reason') or 'not ready'}",
                body=made,
            )
    if as_json:
        output.emit_json(made)
    else:
        output.plain(f"Volume {made['name']} (id {made['id']}) is {made['state']}.")


@volumes.command("delete")
@click.argument("volume")
@yes_option
@json_option
def delete_volume(volume: str, yes: bool, as_json: bool) -> None:
    """Delete a volume and its files for good (refused while a live slice mounts it).
    Asks first unless --yes."""
    client = api()
    found = _find(client, volume)
    output.confirm(
        f"Delete volume {found['name']} ({found['size_gb']} GB) and all its files?", yes=yes
    )
    # the API's confirmation is the name; deleting twice is refused, never doubled
    gone = client.post(f"/volumes/{found['id']}/delete/", {"confirm": found["name"]})
    if as_json:
        output.emit_json(gone)
    else:
        output.plain(f"Volume {gone['name']} is {gone['state']}.")
