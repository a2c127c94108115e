"""The `gpp` program: its commands, and one place that turns every failure into the
documented exit codes (0 ok, 1 refused by the API, 2 usage, 3 network or auth; see
docs/cli.md)."""

from __future__ import annotations

import os
import sys

import click

from cli import __version__, account, billing, connect, estimate, lifecycle, output, slices
from cli import volumes as volume_commands
from cli.client import EXIT_UNREACHABLE, EXIT_USAGE, CliError
from cli.common import STATE

INTERRUPTED = 130


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpp")
def gpp() -> None:
    """Rent VRAM-tiered GPU slices from the command line.

    Start with `gpp login --url https://your-platform`, then `gpp tiers`, `gpp buy`,
    `gpp launch --wait`. Every command takes --json; exit codes: 0 ok, 1 refused by the
    API (its code and message are printed), 2 usage error, 3 network or auth failure.
    GPP_URL and GPP_TOKEN override the stored login."""


for command in (
    account.login,
    account.logout,
    account.whoami,
    billing.tiers,
    billing.buy,
    billing.usage,
    estimate.estimate,
    slices.launch,
    slices.ps,
    slices.show,
    slices.images,
    lifecycle.logs,
    lifecycle.stop,
    lifecycle.resume,
    lifecycle.terminate,
    connect.ssh,
    connect.forward,
    volume_commands.volumes,
):
    gpp.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Run one command and exit with its code; nothing below raises past here."""
    STATE.as_json = False
    STATE.api_client = None
    try:
        code = gpp.main(args=argv, prog_name="gpp", standalone_mode=False)
    except CliError as error:
        output.report_error(error, STATE.as_json)
        sys.exit(error.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as problem:
        if STATE.as_json:
            body = {"code": "usage_error", "message": problem.format_message(),
                    "exit_code": EXIT_USAGE}  # fmt: skip
            output.emit_error_json(body)
        else:
            problem.show()
        sys.exit(EXIT_USAGE)
    except click.Abort:
        output.note("Aborted.")
        sys.exit(INTERRUPTED)
    except KeyboardInterrupt:
        output.note("Interrupted.")
        sys.exit(INTERRUPTED)
    except BrokenPipeError:
        # `gpp logs ... | head`: the reader left, which is no failure of ours; stdout is
        # pointed at /dev/null so that the interpreter's last flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except OSError as exc:  # a local file or socket problem the client did not wrap
        output.report_error(CliError("os_error", str(exc), EXIT_UNREACHABLE), STATE.as_json)
        sys.exit(EXIT_UNREACHABLE)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
