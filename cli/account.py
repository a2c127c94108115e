"""`gpp login`, `logout` and `whoami`: the platform's URL and an API token, checked
against /api/v1/me/ before they are stored."""

from __future__ import annotations

import os
import sys

import click

from cli import config, output
from cli.client import Api
from cli.common import json_option


def _read_token(url: str, token: str, from_stdin: bool) -> str:
    if token:
        return token.strip()
    if from_stdin or not sys.stdin.isatty():
        return sys.stdin.readline().strip()
    output.note(f"Make a token on {url}/account/ (API tokens); it is shown once.")
    return click.prompt("API token", hide_input=True, err=True).strip()


@click.command()
@click.option("--url", help="The platform's address, e.g. https://gpu.example.com.")
@click.option("--token", default="", help="The API token (else asked, or read from stdin).")
@click.option("--token-stdin", is_flag=True, help="Read the token from stdin.")
@json_option
def login(url: str | None, token: str, token_stdin: bool, as_json: bool) -> None:
    """Check an API token against the platform and store it (file mode 0600)."""
    current = config.load()
    chosen = config.normalise_url(url) if url else current.url
    value = _read_token(chosen, token, token_stdin)
    if not value:
        raise click.UsageError("no token given")
    me = Api(chosen, value, on_retry=output.note).get("/me/")
    path = config.save(chosen, value)
    tenant = me.get("tenant") or {}
    if as_json:
        output.emit_json({"url": chosen, "config": str(path), "me": me})
        return
    output.plain(
        f"Logged in to {chosen} as {me['email']}"
        + (f" ({tenant.get('name')}, {me.get('role')})" if tenant else "")
        + "."
    )
    output.plain(f"Token stored in {path} (readable by you only).")
    if os.environ.get("GPP_TOKEN"):
        output.note("Note: GPP_TOKEN is set in this shell and overrides the stored token.")


@click.command()
@json_option
def logout(as_json: bool) -> None:
    """Forget the stored token (the URL is kept)."""
    had = config.forget()
    if as_json:
        output.emit_json({"forgotten": had, "config": str(config.config_path())})
    else:
        output.plain("Token forgotten." if had else "No token was stored.")


@click.command()
@json_option
def whoami(as_json: bool) -> None:
    """Who the token belongs to, in which tenant, and where gpp reads its settings."""
    settings = config.load()
    me = Api(settings.url, settings.token, on_retry=output.note).get("/me/")
    if as_json:
        output.emit_json(
            {"url": settings.url, "url_from": settings.url_from,
             "token_from": settings.token_from, "me": me}
        )  # fmt: skip
        return
    tenant = me.get("tenant") or {}
    output.fields(
        [
            ("url", f"{settings.url} (from {settings.url_from})"),
            ("token", f"from {settings.token_from}"),
            ("user", me.get("email")),
            ("tenant", tenant.get("name")),
            ("role", me.get("role")),
            ("balance", f"{tenant['credit_balance']} credits" if tenant else None),
            ("staff", "yes" if me.get("is_staff") else None),
        ]
    )
