"""`gpp logs`, `stop`, `resume` and `terminate`: a slice's output read with the API's
cursor (and followed with -f), and the transitions that end or restart its container."""

from __future__ import annotations

import time
from typing import Any

import click

from cli import output
from cli.client import Api, CliError, refused
from cli.common import api, json_option, slice_id, yes_option
from cli.slices import STARTED, wait_for, wait_options

FOLLOW_POLL_S = 2.0  # the API reads a running slice's output at most every 2 s
LOG_PAGE = 1000  # lines per call, the API's largest
FIRST_READ_WAIT_S = 6.0  # a first read of a running slice: how long to wait for its lines
FIRST_READ_POLL_S = 1.0


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
    printed = 0

    def emit(line: dict[str, Any]) -> None:
        nonlocal printed
        printed += 1
        _print_line(line, timestamps, as_json)

    cursor, running = read_logs(client, ident, after=after, follow=follow, emit=emit)
    # A running slice's output is read from its node by a worker that the read itself
    # asks for, so the very first read may find nothing kept yet: ask again for a few
    # seconds before saying that it printed nothing.
    deadline = time.monotonic() + FIRST_READ_WAIT_S
    while not follow and not printed and running and time.monotonic() < deadline:
        time.sleep(FIRST_READ_POLL_S)
        cursor, running = read_logs(client, ident, after=cursor, follow=False, emit=emit)
    if as_json or follow:
        return
    still = f" (still running: gpp logs -f {ident} --after {cursor})" if running else ""
    if printed:
        output.note(f"-- up to line {cursor}{still}")
    elif after:
        output.note(f"-- nothing after line {after}{still}")
    elif running:
        output.note(f"Slice {ident} has printed nothing yet (follow it: gpp logs -f {ident}).")
    else:
        output.note(f"Slice {ident} printed nothing (or its output is no longer kept).")


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


def _resume(client: Api, ident: int, purchase: int | None) -> dict[str, Any]:
    """POST the resume; without --purchase the API picks the one the resume page
    preselects (docs/cli.md), and a refusal for want of one is gpp's `no_free_purchase`."""
    body = {} if purchase is None else {"purchase": purchase}
    try:
        return client.post(f"/slices/{ident}/resume/", body)
    except CliError as exc:
        problems = exc.fields.get("purchase") if purchase is None else None
        codes = [p.get("code") for p in problems or [] if isinstance(p, dict)]
        if "required" in codes:
            raise refused("no_free_purchase", exc.message.removeprefix("purchase: ")) from None
        raise


@click.command()
@click.argument("slice_ref", metavar="SLICE")
@click.option(
    "--purchase",
    type=int,
    help="The purchase that pays (default: its own if free, else a full-price one of its "
    "tier before an interruptible one, the oldest first).",
)
@click.option("--wait", is_flag=True, help="Follow it until it runs or fails.")
@wait_options
@json_option
def resume(slice_ref: str, purchase: int | None, wait: bool, timeout: float, as_json: bool) -> None:
    """Start a stopped slice again: the same image, command, environment, volumes and tier
    in a new container, after the same VRAM check."""
    ident = slice_id(slice_ref)
    client = api()
    shown = _resume(client, ident, purchase)
    paid_by = shown.get("purchase", purchase)
    if wait:
        # a short job may be done before it is seen running
        shown = wait_for(client, ident, until=STARTED, timeout=timeout, quiet=as_json)
    if as_json:
        output.emit_json(shown)
    else:
        output.plain(f"Slice {ident} is {shown['state']} (paid by purchase {paid_by}).")


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
