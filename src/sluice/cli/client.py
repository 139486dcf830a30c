"""The CLI's side of `sluice.client`: connect as the CLI user, and turn the client's errors
into the messages and exit codes the CLI promises. The HTTP itself is sluice.client's."""

from __future__ import annotations

import os

import httpx

from sluice.client import BadRequestError, Client, SluiceError, UnreachableError, token_for
from sluice.client.config import token_file
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


def connect_for_job() -> Client:
    """A client for commands that name a job: with the caller's own token, and on the plane's
    machine — admin.token readable, SLUICE_TOKEN not set — a job that token does not see (a
    404) is asked again with the admin token. The operator's CLI holds the default tenant's
    token, so `sluice job cancel ID` of another tenant's job said "not found", while `tenant
    delete` told the operator to do exactly that (ops walk s31). A job of one's own is read as
    one's own (an admin's view hides its env)."""
    settings = load_settings()
    own = token_for(settings)
    if os.environ.get("SLUICE_TOKEN"):
        return Client(token=own)
    admin = token_file(settings)
    if admin is None or admin == own:
        return Client(token=own)
    return Client(token=own, transport=AdminOnNotFound(httpx.HTTPTransport(), admin))


class AdminOnNotFound(httpx.BaseTransport):
    """Sends a request under /v1/jobs/ again with the admin token when it was a 404."""

    def __init__(self, inner: httpx.BaseTransport, admin_token: str) -> None:
        self._inner = inner
        self._admin = f"Bearer {admin_token}"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        if response.status_code != 404 or not request.url.path.startswith("/v1/jobs/"):
            return response
        response.close()
        request.headers["Authorization"] = self._admin
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


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
