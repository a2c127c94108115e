"""How `gpp` writes: results on stdout (a Rich table for people, JSON with --json),
progress and errors on stderr, and the yes/no question of a destructive command."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cli.client import EXIT_USAGE, CliError

# No emoji codes or markup read out of what the API says (":x:" in a log line stays ":x:").
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def emit_json(data: Any) -> None:
    """JSON exactly as the API gave it (plus what gpp adds), one document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def emit_json_line(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def plain(text: str) -> None:
    """A line as it is (log lines, commands): written straight to stdout, so a follow of
    many lines costs no rendering."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def note(text: str) -> None:
    err.print(text, markup=False, highlight=False)


def table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None
) -> None:
    grid = Table(title=title, show_edge=False, header_style="bold", pad_edge=False)
    for name in columns:
        grid.add_column(name, overflow="fold")
    for row in rows:
        grid.add_row(*("" if v is None else str(v) for v in row))
    out.print(grid)


def fields(pairs: Iterable[tuple[str, Any]]) -> None:
    """`name: value` lines, the empty ones left out."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for name, value in pairs:
        if value not in (None, "", [], {}):
            grid.add_row(name, str(value))
    out.print(grid)


def emit_error_json(body: dict[str, Any]) -> None:
    """An error for a script: {"error": {"code", "message", ...}} on stderr."""
    sys.stderr.write(json.dumps({"error": body}, default=str) + "\n")
    sys.stderr.flush()


def report_error(error: CliError, as_json: bool) -> None:
    if as_json:
        emit_error_json(error.as_json())
        return
    err.print(f"[bold red]error[/] [bold]{error.code}[/]: ", end="")
    err.print(error.message, markup=False)
    for name, problems in (error.fields or {}).items():
        for problem in problems if isinstance(problems, list) else [problems]:
            text = problem.get("message", problem) if isinstance(problem, dict) else problem
            code = problem.get("code", "") if isinstance(problem, dict) else ""
            if error.message == f"{name}: {text}":
                continue  # the API's message already names this field's problem
            err.print(f"  {name}: {text}" + (f" ({code})" if code else ""), markup=False)


def confirm(question: str, *, yes: bool) -> None:
    """Ask before doing something that cannot be undone; --yes answers for scripts. Without
    a terminal to ask on and without --yes, refuse (a usage error, exit 2)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.UsageError(f"{question} Pass --yes to confirm without a terminal.")
    if not click.confirm(question, default=False, err=True):
        raise click.exceptions.Exit(EXIT_USAGE)


def when(value: str | None) -> str:
    """An API timestamp as `2025-05-01 20:33:47 UTC` (the pages write moments alike)."""
    if not value:
        return ""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def gib(mib: float | int | None) -> str:
    if mib is None:
        return ""
    return f"{mib / 1024:.1f} GB" if mib % 1024 else f"{int(mib) // 1024} GB"


def join(values: Iterable[Any], render: Callable[[Any], str] = str) -> str:
    return ", ".join(render(v) for v in values)
