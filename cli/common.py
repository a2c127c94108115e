"""What every `gpp` command shares: the API client made from the stored settings, the
--json flag, and turning what a person types (a tier, a slice, an image, a volume) into
the API's ids."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from cli import config, output
from cli.client import Api, refused

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class State:
    """One invocation's: whether errors are written as JSON, and its API client."""

    as_json: bool = False
    api_client: Api | None = None

    def api(self) -> Api:
        if self.api_client is None:
            settings = config.load()
            self.api_client = Api(settings.url, settings.token, on_retry=output.note)
        return self.api_client


STATE = State()


def api() -> Api:
    return STATE.api()


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        STATE.as_json = True
    return value


def json_option(command: F) -> F:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        callback=_remember_json,
        expose_value=True,
        is_eager=True,
        help="Print the result as JSON (errors as JSON on stderr).",
    )(command)


def yes_option(command: F) -> F:
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(command)


def idempotency_option(command: F) -> F:
    return click.option(
        "--idempotency-key",
        default="",
        metavar="KEY",
        help="Send this key instead of a fresh one: running the command again with the "
        "same key answers with the first result and charges nothing again.",
    )(command)


# --- ids from what a person types -----------------------------------------------------------


def slice_id(text: str) -> int:
    """`7`, `slice-7` or `#7`."""
    match = re.fullmatch(r"(?:slice-|#)?(\d+)", text.strip())
    if not match:
        raise click.BadParameter(f"{text!r} is not a slice id (e.g. 7 or slice-7)")
    return int(match.group(1))


def _vram_gb(text: str) -> int | None:
    match = re.fullmatch(r"(\d+)\s*(?:g|gb|gib)?", text.strip().lower())
    return int(match.group(1)) if match else None


def find_tier(tiers: list[dict[str, Any]], text: str) -> dict[str, Any]:
    """A tier by its VRAM in GB (`8`, `8GB`), its name, or its id (`id:3`)."""
    wanted = text.strip()
    if wanted.lower().startswith("id:") and wanted[3:].isascii() and wanted[3:].isdigit():
        found = [t for t in tiers if t["id"] == int(wanted[3:])]
    elif (gb := _vram_gb(wanted)) is not None:
        found = [t for t in tiers if t["vram_mb"] == gb * 1024]
    else:
        found = [t for t in tiers if t["name"].lower() == wanted.lower()]
    if not found:
        sizes = ", ".join(f"{t['vram_mb'] // 1024}GB" for t in tiers if t.get("is_active", True))
        raise refused("unknown_tier", f"No tier {text!r}; the tiers are {sizes}.")
    return found[0]


def find_by_name_or_id(
    rows: list[dict[str, Any]], text: str, *, kind: str, name_key: str = "name"
) -> dict[str, Any]:
    wanted = str(text).strip()
    if wanted.isascii() and wanted.isdigit():
        for row in rows:
            if row["id"] == int(wanted):
                return row
    named = [r for r in rows if str(r.get(name_key, "")).lower() == wanted.lower()]
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        ids = ", ".join(str(r["id"]) for r in named)
        raise refused(f"ambiguous_{kind}", f"Several {kind}s are called {text!r}: ids {ids}.")
    raise refused(f"unknown_{kind}", f"No {kind} {text!r} of yours.")


def key_value(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r}: expected NAME=VALUE", param_hint=what)
        out[name] = value
    return out
