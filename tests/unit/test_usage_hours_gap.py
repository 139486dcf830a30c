"""Held time is charged to the hours it was held in, even when two of the controller's
rounds are more than an hour apart (a store outage, a paused plane): the interval between
them was split only at the first hour's turn, so every hour after it went to the first."""

from __future__ import annotations

import pytest

from sluice.model import JobStarted

from .test_api import GOOD, Env, env, submit

__all__ = ["env"]


def test_a_round_gap_of_hours_charges_each_hour_it_spans(env: Env) -> None:
    hour = 3600.0
    env.engine.now = 10 * hour + 1000.0
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": {"min": 1, "max": 1}}})
    env.plane.step()
    env.engine.pending.append(JobStarted(job["id"], 1, "n0", env.engine.now, pid=1))
    env.plane.step()
    start = env.engine.now
    env.engine.now = 12 * hour + 2800.0  # the next round comes 2 h 30 min later
    env.plane.step()
    env.plane.controller.flush_held_time(force=True)
    whole = env.client.get("/v1/usage", headers=env.alice).json()[0]
    assert whole["run_hours"] == pytest.approx((env.engine.now - start) / hour)
    window = env.client.get("/v1/usage", params={"since": 11 * hour}, headers=env.alice).json()[0]
    assert window["run_hours"] == pytest.approx((env.engine.now - 11 * hour) / hour)
    assert window["core_hours"] == pytest.approx((env.engine.now - 11 * hour) / hour)
    last = env.client.get("/v1/usage", params={"since": 12 * hour}, headers=env.alice).json()[0]
    assert last["run_hours"] == pytest.approx(2800.0 / hour)
