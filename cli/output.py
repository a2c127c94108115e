"""How `gpp` writes: results on stdout (a Rich table for people, JSON with --json),
progress and errors on stderr, and the yes/no question of a destructive command."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click
from rich.cells import cell_len, set_cell_size
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


def compact_table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], *, flexible: Sequence[str] = ()
) -> None:
    """A listing of one line per row that fits the terminal (80 columns when stdout is not
    one): the columns are as wide as their widest cell, except the `flexible` ones, which
    share what is left and cut a longer cell with "…"."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    need = [max([cell_len(name)] + [cell_len(row[i]) for row in cells]) for i, name in
            enumerate(columns)]  # fmt: skip
    flex = [columns.index(name) for name in flexible]
    room = out.width - 2 * (len(columns) - 1)
    room -= sum(n for i, n in enumerate(need) if i not in flex)
    widths = list(need)
    # a fair share each; what a short one leaves goes to the others
    waiting = list(flex)
    while waiting:
        share = room // len(waiting)
        short = [i for i in waiting if need[i] <= share]
        for i in short or waiting:
            widths[i] = max(cell_len(columns[i]), need[i] if short else share)
            room -= widths[i]
        waiting = [i for i in waiting if i not in short] if short else []
    out.print(_row_line(columns, widths), style="bold", markup=False, highlight=False)
    for row in cells:
        plain(_row_line(row, widths))


def _row_line(row: Sequence[str], widths: Sequence[int]) -> str:
    fitted = []
    for text, width in zip(row, widths, strict=True):
        if cell_len(text) > width:
            text = set_cell_size(text, width - 1) + "…"
        fitted.append(set_cell_size(text, width))
    return "  ".join(fitted).rstrip()


def clip(text: str, width: int) -> str:
    """`text` cut to `width` characters, the last one "…" when it was longer."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def short_when(value: str | None) -> str:
    """An API timestamp as `12-07 06:47` (UTC, to the minute) for a narrow column."""
    full = when(value)
    return full[5:16] if full.endswith(" UTC") else full


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
    for hint in error.hints:
        err.print(f"  {hint}", markup=False)


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
