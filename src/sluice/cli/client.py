"""The CLI's side of `sluice.client`: connect as the CLI user, and turn the client's errors
into the messages and exit codes the CLI promises. The HTTP itself is sluice.client's."""

from __future__ import annotations

import os

from sluice.client import BadRequestError, Client, SluiceError, UnreachableError
from sluice.settings import SettingsError, load_settings

EXIT_FAILURE = 1
EXIT_USAGE = 2
"""Bad input (spec, arguments): the same code typer uses for bad arguments."""


class CliError(Exception):
    """A failure to report in one or more lines and exit with `code`."""

    def __init__(self, message: str, code: int = EXIT_FAILURE, problems: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.problems = problems or []


def connect(admin: bool = False) -> Client:
    """A client for the server and token found the usual way (admin.token first for admin commands)."""
    return Client(admin=admin)


def cli_error(err: SluiceError) -> CliError:
    """The message and exit code for a failed call: bad input exits 2, anything else 1."""
    problems = [{"field": p.field, "problem": p.problem} for p in err.problems]
    status, detail = err.status, err.detail
    if isinstance(err, UnreachableError):
        return CliError(f"{err}; {_unreachable_hint()}")
    if isinstance(err, BadRequestError) and problems:
        return CliError(err.error or "invalid request", EXIT_USAGE, problems)
    if status is None:
        return CliError(str(err), EXIT_USAGE if isinstance(err, BadRequestError) else EXIT_FAILURE)
    if status == 401:
        return CliError(f"not authenticated ({detail}); set SLUICE_TOKEN or check $SLUICE_HOME/token")
    if status == 403:
        return CliError(f"not allowed: {detail}")
    if status == 404:
        return CliError(detail or "not found")
    if status == 409:
        return CliError(detail)
    if status == 413:
        return CliError(f"too large: {detail}", EXIT_USAGE)
    return CliError(f"server answered {status}: {detail}")


def _unreachable_hint() -> str:
    """What to do about a server the CLI cannot reach. Without SLUICE_URL and without the home's
    server.json (a plane removes it as it stops) the address tried is only the settings' default,
    which may not be the port the plane ran on: say that, rather than let it read as the plane's."""
    if os.environ.get("SLUICE_URL"):
        return "is it running? (the address is SLUICE_URL's)"
    try:
        home = load_settings().home
    except SettingsError:
        return "is it running? start it with `sluice up`"
    if (home / "server.json").exists():
        return "is it running? start it with `sluice up`"
    return (
        f"no sluice server of {home} is running (it has no server.json), so this is only the settings' "
        "address: start one with `sluice up`, or set SLUICE_URL to reach one elsewhere"
    )
