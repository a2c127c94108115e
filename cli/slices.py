"""`gpp launch`, `ps`, `show` and `images`: starting a slice (with live progress until it
runs or fails), listing and reading slices, and the images a launch may use."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from cli import launchspec, output
from cli.client import Api, CliError, new_idempotency_key, refused
from cli.common import api, idempotency_option, json_option, key_value, slice_id
from cli.estimate import job_options

LIVE = ("requested", "queued", "provisioning", "running", "stopping")
# What a launch or resume waits for: running, or already done well (a short job)
STARTED = ("running", "completed")
POLL_S = 1.0
POLL_MAX_S = 3.0
WAIT_DEFAULT_S = 600
SUGGESTIONS_SHOWN = 5  # of a refused launch's, on stderr (all of them with --json)
PS_IMAGE_WIDTH = 24  # `gpp ps` cuts a longer image name or reference with "…"


def _transition_line(t: dict[str, Any]) -> str:
    reason = f"  {t['reason']}" if t.get("reason") else ""
    moved = f"{t['from_state']} -> {t['to_state']}" if t.get("from_state") else t["to_state"]
    return f"{output.when(t.get('at'))}  {moved}{reason}"


def wait_for(
    client: Api, ident: int, *, until: tuple[str, ...], timeout: float, quiet: bool
) -> dict[str, Any]:
    """Follow the slice until its state is one of `until`: each transition as it happens
    on stderr (a spinner with the state and queue position on a terminal). Another final
    state, or the timeout, is a refusal (exit 1) naming it."""
    seen = 0
    deadline = time.monotonic() + timeout
    delay = POLL_S
    spinner = None
    if not quiet and output.err.is_terminal:
        spinner = output.err.status(f"slice {ident}: waiting")
        spinner.start()
    try:
        while True:
            shown = client.get(f"/slices/{ident}/")
            transitions = shown.get("transitions") or []
            if not quiet:
                for t in transitions[seen:]:
                    output.note(f"slice {ident}: {_transition_line(t)}")
            seen = len(transitions)
            state = shown["state"]
            if spinner is not None:
                where = f", number {shown['queue_position']} in the queue" if shown.get(
                    "queue_position") else ""  # fmt: skip
                spinner.update(f"slice {ident}: {state}{where}")
            if state in until:
                return shown
            if state not in LIVE:
                raise refused(
                    f"slice_{state}",
                    f"Slice {ident} is {state}: {shown.get('state_reason') or 'no reason given'}",
                    body=shown,
                )
            if time.monotonic() + delay > deadline:
                raise refused(
                    "wait_timeout",
                    f"Slice {ident} is still {state} after {timeout:.0f} s "
                    f"(it goes on; gpp show {ident}).",
                    body=shown,
                )
            time.sleep(delay)
            delay = min(delay * 1.5, POLL_MAX_S)
    finally:
        if spinner is not None:
            spinner.stop()


def wait_options(command: Any) -> Any:
    return click.option(
        "--timeout",
        type=click.FloatRange(1),
        default=WAIT_DEFAULT_S,
        show_default=True,
        help="Seconds --wait waits at most.",
    )(command)


def _refusal_hint(exc: CliError) -> CliError:
    """A launch refused by the pre-launch check (the API's 422 carries the estimate): say
    which tier would do and list the estimate's suggestions, each with what it comes to
    and whether it fits, on stderr; with --json they are the error's `suggestions`."""
    estimate = exc.body.get("estimate") if isinstance(exc.body, dict) else None
    if exc.code != "estimate_exceeds_tier" or not isinstance(estimate, dict):
        return exc
    smallest = estimate.get("smallest_fitting_tier_mib")
    if smallest:
        exc.hints.append(
            f"the smallest tier that fits is {output.gib(smallest)}: "
            f"gpp buy {int(smallest) // 1024} --hours N"
        )
    suggestions = [s for s in estimate.get("suggestions") or [] if isinstance(s, dict)]
    for hint in suggestions[:SUGGESTIONS_SHOWN]:
        total = hint.get("total_mib")
        size = f"{total:,.0f} MiB" if isinstance(total, int | float) else "?"
        verdict = "fits this tier" if hint.get("fits") else "still too big for this tier"
        exc.hints.append(f"try: {hint.get('label', '')} ({size}, {verdict})")
    exc.extra = {"suggestions": suggestions, "smallest_fitting_tier_mib": smallest}
    return exc


@click.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--purchase", type=int, help="The purchase that pays (gpp usage lists them).")
@click.option("--tier", help="Or: a tier (e.g. 8); a free purchase of it pays.")
@click.option(
    "--image",
    help="The image's name or id (gpp images), or a reference of your own "
    "(ghcr.io/acme/train:2) where ops allow its registry.",
)
@click.option("--model", help="A catalog model for the VRAM check (gpp estimate --models).")
@job_options
@click.option("--command", "command_line", help="The command, split as a shell would.")
@click.option("--env", multiple=True, metavar="NAME=VALUE", help="An environment variable.")
@click.option("--ssh-key", help="A public key (or its .pub file) for the image's sshd.")
@click.option("--volume", "volumes", multiple=True, metavar="VOLUME:PATH", help="Mount a volume.")
@click.option("--guaranteed/--shared", default=None,
              help="Never on an overcommitted GPU (the API's default) or allow one.")  # fmt: skip
@click.option("--wait", is_flag=True, help="Follow it until it runs or fails.")
@wait_options
@idempotency_option
@json_option
def launch(
    file: Path | None,
    purchase: int | None,
    tier: str | None,
    image: str | None,
    model: str | None,
    config_json: Path | None,
    command_line: str | None,
    env: tuple[str, ...],
    ssh_key: str | None,
    volumes: tuple[str, ...],
    guaranteed: bool | None,
    wait: bool,
    timeout: float,
    idempotency_key: str,
    as_json: bool,
    **job_flags: Any,
) -> None:
    """Launch a slice, from flags or a launch FILE (YAML or TOML; flags win). The job is
    checked against the tier's VRAM first: a job that does not fit is refused (exit 1)."""
    client = api()
    spec = launchspec.read_file(file) if file else {}
    body = launchspec.build(
        client, spec, model=model, config_json=config_json, purchase=purchase, tier=tier,
        image=image, command=command_line, env=key_value(env, "--env"), ssh_key=ssh_key,
        volumes=volumes, guaranteed=guaranteed, job_flags=job_flags,
    )  # fmt: skip
    key = idempotency_key or new_idempotency_key()
    try:
        shown = client.post("/slices/", body, idempotency_key=key)
    except CliError as exc:
        raise _refusal_hint(exc) from None
    again = client.last_status == 200
    if not as_json:
        prefix = "Already launched with this key" if again else "Launched"
        output.plain(f"{prefix}: slice {shown['id']} ({shown['state']}) on {shown['tier_name']}.")
    if wait:
        shown = wait_for(client, shown["id"], until=STARTED, timeout=timeout, quiet=as_json)
    if as_json:
        output.emit_json({**shown, "idempotency_key": key, "repeated": again})
        return
    if wait and shown["state"] == "completed":
        output.plain(f"Slice {shown['id']} completed: {shown.get('state_reason') or ''}")
    elif wait:
        output.plain(f"Slice {shown['id']} is running.")
        _print_connection(shown)
    else:
        output.note(f"Follow it: gpp show {shown['id']}  (or launch with --wait)")


@click.command()
@click.option(
    "--all", "-a", "show_all", is_flag=True, help="Also stopped, completed, failed and refused."
)
@click.option("--state", help="Only slices in this state.")
@json_option
def ps(show_all: bool, state: str | None, as_json: bool) -> None:
    """Your tenant's slices: the live ones, or all with --all."""
    rows = api().all("/slices/", state=state)
    if not (show_all or state):
        rows = [r for r in rows if r["state"] in LIVE]
    if as_json:
        output.emit_json(rows)
        return
    if not rows:
        output.note("No live slices (gpp ps --all for the others).")
        return
    # One line a slice at 80 columns: the image's name before its reference, the image and
    # the reason cut with "…" to fit; every field whole is in `gpp show` and in --json.
    output.compact_table(
        ["ID", "STATE", "TIER", "IMAGE", "MIN", "PEAK", "STARTED UTC", "REASON"],
        ([r["id"], r["state"], r["tier_name"],
          output.clip(r.get("image_name") or r["image_reference"], PS_IMAGE_WIDTH),
          r["minutes_used"], output.gib(r["peak_vram_mb"]) if r["peak_vram_mb"] else "",
          output.short_when(r["started_at"]), r.get("state_reason") or ""]
         for r in rows),
        flexible=["IMAGE", "REASON"],
    )  # fmt: skip


def _print_connection(shown: dict[str, Any]) -> None:
    connection = shown.get("connection") or {}
    gateway = connection.get("gateway") or {}
    if gateway.get("jump"):
        output.plain(f"Connect: gpp ssh {shown['id']}   ({gateway['jump']})")
    for forward in gateway.get("forwards") or []:
        local = forward.get("local_port")
        on = f" (on 127.0.0.1:{local})" if local else ""
        output.plain(f"Port {forward['port']}: gpp forward {shown['id']} {forward['port']}{on}")
    if connection.get("url"):
        output.plain(f"Open: {connection['url']}")


@click.command()
@click.argument("slice_ref", metavar="SLICE")
@json_option
def show(slice_ref: str, as_json: bool) -> None:
    """One slice: state, tier, image, VRAM, minutes, how to connect, its transitions."""
    shown = api().get(f"/slices/{slice_id(slice_ref)}/")
    if as_json:
        output.emit_json(shown)
        return
    estimate = shown.get("estimate") or {}
    connection = shown.get("connection") or {}
    gateway = connection.get("gateway") or {}
    output.fields(
        [
            ("slice", shown["id"]),
            ("state", shown["state"]),
            ("reason", shown.get("state_reason")),
            ("queue position", shown.get("queue_position")),
            ("tier", f"{shown['tier_name']} (purchase {shown['purchase']})"),
            ("image", f"{shown.get('image_name') or ''} {shown['image_reference']}".strip()),
            ("VRAM quota", output.gib(shown["vram_mb"])),
            (
                "estimate",
                f"{estimate['total_mib']:,.0f} MiB" if estimate.get("total_mib") else None,
            ),
            ("peak VRAM", f"{shown['peak_vram_mb']} MiB" if shown.get("peak_vram_mb") else None),
            ("minutes used", shown["minutes_used"]),
            ("guaranteed", "yes" if shown.get("guaranteed") else "no (may share a GPU)"),
            ("exit code", shown.get("exit_code")),
            ("created", output.when(shown.get("created_at"))),
            ("started", output.when(shown.get("started_at"))),
            ("stopped", output.when(shown.get("stopped_at"))),
            ("command", " ".join(shown.get("command") or [])),
            ("gateway", f"{gateway['host']}:{gateway['port']}" if gateway else None),
            ("gateway host key", gateway.get("host_key_fingerprint")),
            ("slice host key", shown.get("ssh_host_key_fingerprint")),
            ("note", connection.get("note")),
        ]
    )
    _print_connection(shown)
    transitions = shown.get("transitions") or []
    if transitions:
        output.table(
            ["WHEN", "FROM", "TO", "REASON"],
            ([output.when(t["at"]), t.get("from_state") or "", t["to_state"], t.get("reason", "")]
             for t in transitions),
            title="Transitions",
        )  # fmt: skip
    if (shown.get("runs") or 1) > 1:
        _print_runs(shown["id"])


def _print_runs(pk: int) -> None:
    """A resumed slice's runs, each on its purchase, node and GPU, with its end and cost."""
    runs = list(api().pages(f"/slices/{pk}/runs/"))
    output.table(
        ["RUN", "PURCHASE", "GPU", "STARTED", "ENDED", "END", "MIN", "COST"],
        ([r["number"], f"{r['purchase']}{' (interruptible)' if r.get('interruptible') else ''}",
          r.get("gpu_label") or "", output.when(r.get("started_at")),
          output.when(r.get("ended_at")), r.get("end_state") or "running", r.get("minutes"),
          r.get("cost")] for r in runs),
        title="Runs",
    )  # fmt: skip


@click.command()
@json_option
def images(as_json: bool) -> None:
    """The images you may launch (the allowlist), and whether a node already holds each."""
    rows = api().all("/images/")
    if as_json:
        output.emit_json(rows)
        return
    output.table(
        ["ID", "NAME", "REFERENCE", "CONNECT", "PORTS", "ON NODES"],
        ([i["id"], i["name"], i["pinned_reference"], i["connect"], output.join(i["ports"]),
          i["on_nodes"]] for i in rows),
    )  # fmt: skip
