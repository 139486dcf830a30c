"""Where the server is and who we are, resolved the same way for the CLI and for Python.

Server URL: $SLUICE_URL, else the running server's `$SLUICE_HOME/server.json`, else the
settings' default. Token: $SLUICE_TOKEN, else `$SLUICE_HOME/token` (or `admin.token` first
for admin calls), both written by the server on its first start.
"""

from __future__ import annotations

import json
import os

from sluice.settings import Settings, load_settings


def server_url(settings: Settings | None = None) -> str:
    env = os.environ.get("SLUICE_URL")
    if env:
        return env.rstrip("/")
    settings = settings or load_settings()
    try:
        info = json.loads((settings.home / "server.json").read_text())
        return str(info["url"]).rstrip("/")
    except (OSError, ValueError, KeyError, TypeError):
        return settings.api_url


def token_for(settings: Settings | None = None, admin: bool = False) -> str | None:
    env = os.environ.get("SLUICE_TOKEN")
    if env:
        return env.strip()
    settings = settings or load_settings()
    names = ("admin.token", "token") if admin else ("token", "admin.token")
    for name in names:
        text = token_file(settings, name)
        if text:
            return text
    return None


def token_file(settings: Settings, name: str = "admin.token") -> str | None:
    """The token `$SLUICE_HOME/<name>` holds, whatever SLUICE_TOKEN says; None when it cannot
    be read or is empty (not the plane's machine, or not its operator)."""
    try:
        return (settings.home / name).read_text().strip() or None
    except OSError:
        return None
