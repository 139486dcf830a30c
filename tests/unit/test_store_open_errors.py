"""A database URL sluice cannot open is said in one line naming SLUICE_DATABASE_URL, with the
URL's password hidden: `sluice up` printed a SQLAlchemy traceback (ops walk s31)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import server
from sluice.settings import Settings
from sluice.store import StoreNotOpened, open_store


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("garbage", r"^not a database URL: use sqlite:///PATH or postgresql://"),
        ("mysql://u:hunter2@db.example/x", r"^mysql://u:\*\*\*@db.example/x: sluice cannot open this kind of database"),
        # Nothing listens on port 1: refused at once.
        ("postgresql://u:hunter2@127.0.0.1:1/x", r"^postgresql://u:\*\*\*@127.0.0.1:1/x: cannot connect: .*refused"),
    ],
)
def test_a_database_that_cannot_be_opened_is_said_in_one_line(url: str, says: str) -> None:
    with pytest.raises(StoreNotOpened, match=says) as err:
        open_store(url)
    assert "hunter2" not in str(err.value) and "\n" not in str(err.value)


def test_serve_names_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(settings: Settings) -> None:
        open_store("postgresql://u@127.0.0.1:1/x")

    monkeypatch.setattr(server, "claim_tenant_uids", refused)
    with pytest.raises(StoreNotOpened, match=r"^SLUICE_DATABASE_URL \(`database_url`\): postgresql://u@127.0.0.1:1/x"):
        server.serve(Settings(home=tmp_path / "home"))
    assert StoreNotOpened in server.START_ERRORS
