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
        try:
            text = (settings.home / name).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None
