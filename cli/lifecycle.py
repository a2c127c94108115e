"""`gpp logs`, `stop`, `resume` and `terminate`: a slice's output read with the API's
cursor (and followed with -f), and the transitions that end or restart its container."""

from __future__ import annotations

import time
from typing import Any

import click

from cli import output
from cli.client import Api, refused
from cli.common import api, json_option, slice_id, yes_option
from cli.slices import STARTED, wait_for, wait_options

FOLLOW_POLL_S = 2.0  # the API reads a running slice's output at most every 2 s
LOG_PAGE = 1000  # lines per call, the API's largest


def _print_line(line: dict[str, Any], timestamps: bool, as_json: bool) -> None:
    if as_json:
        output.emit_json_line(line)
    elif timestamps:
        output.plain(f"{output.when(line['at'])}  {line['text']}")
    else:
        output.plain(line["text"])


def read_logs(client: Api, ident: int, *, after: int, follow: bool, emit: Any) -> tuple[int, bool]:
    """Every line after the cursor, page by page; with `follow`, go on asking while the
    slice runs and stop once it has stopped and its last lines are read. Returns the
    cursor and whether the slice still runs."""
    while True:
        page = client.get(f"/slices/{ident}/logs/", after=after, limit=LOG_PAGE)
        for line in page["lines"]:
            emit(line)
        after = page["next_cursor"]
        if page["more"]:
            continue
        if not (follow and page["following"]):
            return after, bool(page["following"])
        time.sleep(FOLLOW_POLL_S)


@click.command()
@click.argument("slice_ref", metavar="SLICE")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines while it runs.")
@click.option("--after", type=click.IntRange(0), default=0, help="Start after this line number.")
@click.option("--timestamps", "-t", is_flag=True, help="Prefix each line with when it came.")
@json_option
def logs(slice_ref: str, follow: bool, after: int, timestamps: bool, as_json: bool) -> None:
    """What the slice's container printed (stdout and stderr in time order). With --json,
    one JSON object per line ({"seq", "at", "text"}), so -f can stream them."""
    ident = slice_id(slice_ref)
    client = api()
    cursor, running = read_logs(
        client, ident, after=after, follow=follow,
        emit=lambda line: _print_line(line, timestamps, as_json),
    )  # fmt: skip
    if not as_json and not follow:
        hint = f" (still running: gpp logs -f {ident} --after {cursor})" if running else ""
        output.note(f"-- up to line {cursor}{hint}")


@click.command()
@click.argument("slice_ref", metavar="SLICE")
@click.option("--reason", default="", help="Why (kept with the slice's history).")
@click.option("--wait", is_flag=True, help="Wait until it has stopped.")
@wait_options
@yes_option
@json_option
def stop(slice_ref: str, reason: str, wait: bool, timeout: float, yes: bool, as_json: bool) -> None:
    """Stop the slice: its container is removed, metering ends, volumes are kept, and it
    can be resumed. Asks first unless --yes."""
    ident = slice_id(slice_ref)
    output.confirm(f"Stop slice {ident}? Its processes end now.", yes=yes)
    client = api()
    # stopping a stopped slice changes nothing, so a lost answer may be asked again
    shown = client.post(f"/slices/{ident}/stop/", {"reason": reason}, repeatable=True)
    if wait:
        ended = ("stopped", "completed", "failed")
        shown = wait_for(client, ident, until=ended, timeout=timeout, quiet=as_json)
    if as_json:
        output.emit_json(shown)
    else:
        output.plain(f"Slice {ident} is {shown['state']}.")


def _purchase_for_resume(client: Api, shown: dict[str, Any]) -> int:
    """The slice's own purchase when it has minutes left, else another of its tier that
    no slice uses. A slice that is not stopped keeps its own: the API says why it cannot
    be resumed, in its words."""
    if shown["state"] != "stopped":
        return int(shown["purchase"])
    own = client.get(f"/purchases/{shown['purchase']}/")
    if own["minutes_left"] > 0 and not own["live_slices"]:
        return int(own["id"])
    rows = client.all("/purchases/", tier=own["tier"], has_minutes_left="true")
    free = [p for p in rows if not p.get("live_slices")]
    if not free:
        raise refused(
            "no_free_purchase",
            f"No purchase of {own['tier_name']} with minutes left and no slice on it: "
            f"buy one with `gpp buy {own['vram_mb'] // 1024} --hours N`.",
        )
    return int(max(free, key=lambda p: (p["created_at"], p["id"]))["id"])


@click.command()
@click.argument("slice_ref", metavar="SLICE")
@click.option("--purchase", type=int, help="The purchase that pays (default: one of its tier).")
@click.option("--wait", is_flag=True, help="Follow it until it runs or fails.")
@wait_options
@json_option
def resume(slice_ref: str, purchase: int | None, wait: bool, timeout: float, as_json: bool) -> None:
    """Start a stopped slice again: the same image, command, environment, volumes and tier
    in a new container, after the same VRAM check."""
    ident = slice_id(slice_ref)
    client = api()
    if purchase is None:
        purchase = _purchase_for_resume(client, client.get(f"/slices/{ident}/"))
    shown = client.post(f"/slices/{ident}/resume/", {"purchase": purchase})
    if wait:
        # a short job may be done before it is seen running
        shown = wait_for(client, ident, until=STARTED, timeout=timeout, quiet=as_json)
    if as_json:
        output.emit_json(shown)
    else:
        output.plain(f"Slice {ident} is {shown['state']} (paid by purchase {purchase}).")


@click.command()
@click.argument("slice_ref", metavar="SLICE")
@click.option("--delete-volumes", is_flag=True, help="Also delete the volumes only it used.")
@yes_option
@json_option
def terminate(slice_ref: str, delete_volumes: bool, yes: bool, as_json: bool) -> None:
    """End the slice for good (stopped first if it runs): it cannot be resumed. Asks
    first unless --yes."""
    ident = slice_id(slice_ref)
    what = " and delete the volumes only it used" if delete_volumes else ""
    output.confirm(f"Terminate slice {ident}{what}? It cannot be resumed.", yes=yes)
    shown = api().post(
        f"/slices/{ident}/terminate/", {"delete_volumes": delete_volumes}, repeatable=True
    )
    if as_json:
        output.emit_json(shown)
    else:
        output.plain(f"Slice {ident} is terminated ({shown['state']}).")
