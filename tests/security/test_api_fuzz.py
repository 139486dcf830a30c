"""Property-based fuzzing of the live REST API (schemathesis over its own OpenAPI schema).

The server is the real app and ControlPlane (SQLite store, kube policy, reconcile loop
running) served by uvicorn on a loopback port; the engine is the FakeEngine of
tests/unit/fake_engine.py — a fake, on purpose: a fuzzer that gets a spec past validation
must not start a random argv on this machine. Every operation gets schema-conforming
(positive) and schema-violating (negative) requests, with an admin token, a bounded number of
each so the run stays well under a minute. What must hold for every request:

- no 5xx, ever;
- a 422 lists its problems, each naming a field;
- any other 4xx says what went wrong (`error` and `detail`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

import uvicorn  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import Phase as HPhase  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from sluice.api.app import create_app  # noqa: E402
from sluice.control.plane import ControlPlane  # noqa: E402
from sluice.policy import make_policy  # noqa: E402
from sluice.settings import Settings  # noqa: E402
from sluice.store.sql import SqlStore  # noqa: E402

from ..live_api import free_port  # noqa: E402
from ..unit.fake_engine import FakeEngine  # noqa: E402

EXAMPLES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 25}
TRACE = False
"""Print each request's status (run with -s) to see what the fuzzer reached."""
"""Examples per operation and mode: about 24 operations × 20 requests, a few seconds each."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    home: Path = tmp_path_factory.mktemp("fuzz") / "home"
    cfg = Settings(home=home, reconcile_interval_s=0.2)
    plane = ControlPlane(cfg, SqlStore(cfg.db_url), FakeEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    plane.start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(plane), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:  # readiness, not a timing assertion
        assert thread.is_alive(), "the API server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", tokens["admin"]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        plane.stop()


def check(case: Any, response: Any) -> None:
    where = f"{case.method} {case.formatted_path} query={case.query} body={str(case.body)[:300]}"
    assert response.status_code < 500, f"{where} -> {response.status_code}: {response.text[:500]}"
    if 400 <= response.status_code < 500:
        body = response.json()
        if response.status_code == 422:
            problems = body.get("problems")
            assert problems and all(p.get("field") and p.get("problem") for p in problems), f"{where}: {body}"
        else:
            assert body.get("error") and body.get("detail"), f"{where} -> {response.status_code}: {body}"


def operations(base: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=str)
def test_no_request_gets_a_5xx_and_every_4xx_names_the_problem(live: tuple[str, str], mode: GenerationMode) -> None:
    base, admin = live
    auth = {"Authorization": f"Bearer {admin}"}
    ops = operations(base)
    assert len(ops) >= 15, [f"{o.method} {o.path}" for o in ops]
    sent: dict[str, int] = {}
    for op in ops:
        # Registering a dataset lists its source; a fuzzed source could be any path on this
        # machine (confinement is tested on its own), so the fuzzer registers without probing.
        query = {"probe": "false"} if (op.method.upper(), op.path) == ("POST", "/v1/datasets") else None
        # Following a log streams until the job ends; a fuzzed job id never exists, but keep it finite.
        if op.path.endswith("/logs"):
            query = {"follow": "false"}

        @given(case=op.as_strategy(generation_mode=mode, query=query))
        @settings(
            max_examples=EXAMPLES[mode],
            deadline=None,
            database=None,
            derandomize=True,
            phases=[HPhase.explicit, HPhase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            # Every case carries the admin token, so it reaches the handlers (the 401 paths
            # are tested on their own in tests/unit/test_api.py).
            case.headers = {**(case.headers or {}), **auth}
            response = case.call(base_url=base, timeout=30)
            name = f"{case.method.upper()} {case.path}"
            sent[name] = sent.get(name, 0) + 1
            check(case, response)
            if TRACE:
                print("fuzz", name, response.status_code)

        try:
            run()
        except Unsatisfiable:  # nothing to get wrong (e.g. /healthz takes no input): no negative case
            assert mode == GenerationMode.NEGATIVE, f"{op.method} {op.path}"
    assert sum(sent.values()) >= 5 * len(ops) if mode == GenerationMode.POSITIVE else len(sent) >= 10, sent
