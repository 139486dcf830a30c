"""The CLI's HTTP client: where the server is, who we are, and errors a user can act on.

Server URL: $SLUICE_URL, else the running server's `$SLUICE_HOME/server.json`, else the
settings' default. Token: $SLUICE_TOKEN, else `$SLUICE_HOME/token` (or `admin.token` for
admin commands), both written by the server on its first start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from sluice.settings import Settings, load_settings

EXIT_FAILURE = 1
EXIT_USAGE = 2
"""Bad input (spec, arguments): the same code typer uses for bad arguments."""


PAGE_SIZE = 500
"""Items asked per page when the CLI walks a list (the API allows up to 1000)."""


class CliError(Exception):
    """A failure to report in one or more lines and exit with `code`."""

    def __init__(self, message: str, code: int = EXIT_FAILURE, problems: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.problems = problems or []


def _settings() -> Settings:
    return load_settings()


def server_url(settings: Settings) -> str:
    env = os.environ.get("SLUICE_URL")
    if env:
        return env.rstrip("/")
    try:
        info = json.loads((settings.home / "server.json").read_text())
        return str(info["url"]).rstrip("/")
    except (OSError, ValueError, KeyError, TypeError):
        return settings.api_url


def token_for(settings: Settings, admin: bool = False) -> str | None:
    env = os.environ.get("SLUICE_TOKEN")
    if env:
        return env.strip()
    names = ("admin.token", "token") if admin else ("token", "admin.token")
    for name in names:
        path: Path = settings.home / name
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None


def _explain(resp: httpx.Response) -> CliError:
    try:
        body: Any = resp.json()
    except ValueError:
        body = {"detail": resp.text.strip() or resp.reason_phrase}
    detail = str(body.get("detail", "")) if isinstance(body, dict) else str(body)
    problems = body.get("problems") if isinstance(body, dict) else None
    status = resp.status_code
    if status == 422 and problems:
        return CliError(str(body.get("error", "invalid request")), EXIT_USAGE, list(problems))
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


class Client:
    """Thin httpx wrapper: every method returns decoded JSON or raises CliError."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout_s)

    @classmethod
    def from_env(cls, admin: bool = False) -> Client:
        settings = _settings()
        return cls(server_url(settings), token_for(settings, admin=admin))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _unreachable(self, err: Exception) -> CliError:
        return CliError(
            f"cannot reach the sluice server at {self.url} ({err}); is it running? start it with `sluice up`"
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as err:
            raise self._unreachable(err) from None
        if resp.status_code >= 400:
            raise _explain(resp)
        if resp.status_code == 204 or not resp.content:
            return None
        ctype = resp.headers.get("content-type", "")
        return resp.json() if ctype.startswith("application/json") else resp.text

    def pages(self, path: str, params: dict[str, Any] | list[tuple[str, Any]] | None = None) -> list[Any]:
        """Every item of a paginated list endpoint, following `next_cursor` to the last page."""
        base = list(params.items()) if isinstance(params, dict) else list(params or [])
        items: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            query = base + [("limit", PAGE_SIZE)] + ([("cursor", cursor)] if cursor else [])
            page = self.call("GET", path, params=query)
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise CliError(f"the server at {self.url} answered {path} with something that is not a list page")
            items.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                return items
            if cursor in seen:  # a server bug must not spin the CLI forever
                raise CliError(f"the server at {self.url} repeated a page cursor for {path}")
            seen.add(cursor)

    def stream(self, path: str, params: dict[str, Any] | None = None) -> Iterator[str]:
        """Text chunks of a streamed response, as they arrive (no read timeout)."""
        try:
            with self._http.stream("GET", path, params=params, timeout=httpx.Timeout(30.0, read=None)) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise _explain(resp)
                yield from resp.iter_text()
        except httpx.TransportError as err:
            raise self._unreachable(err) from None
