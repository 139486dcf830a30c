"""Node health state machine on a fake clock (plain numbers for time)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.health.state import HealthRules, NodeHealthMachine
from sluice.model import NodeHealth

RULES = HealthRules(cordon_alarms=3, cordon_window_s=10, clear_s=5, readmit_s=20)


def test_alarm_suspects_then_repeated_alarms_cordon_then_sustained_quiet_readmits() -> None:
    m = NodeHealthMachine("n1", RULES)
    t = m.observe(0, True, "score 9 > 3; top KPIs: cpu_busy_pct 80%")
    assert t is not None and t.new == NodeHealth.SUSPECT and "cpu_busy_pct" in t.reason
    assert m.observe(1, True, "x") is None
    t = m.observe(2, True, "score 12 > 3; top KPIs: disk_write_mbps 70%")
    assert t is not None and t.new == NodeHealth.CORDONED
    assert "3 anomalies in 10s" in t.reason and "disk_write_mbps" in t.reason
    assert m.cordoned_by == "detector"
    # Quiet, but not long enough.
    assert all(m.observe(x, False) is None for x in range(3, 22))
    t = m.observe(22, False)
    assert t is not None and t.new == NodeHealth.HEALTHY and "re-admitted" in t.reason


def test_suspect_clears_after_quiet_period() -> None:
    m = NodeHealthMachine("n1", RULES)
    m.observe(0, True, "x")
    assert m.observe(4, False) is None
    t = m.observe(5, False)
    assert t is not None and t.new == NodeHealth.HEALTHY


def test_alarms_spread_out_do_not_cordon() -> None:
    m = NodeHealthMachine("n1", HealthRules(cordon_alarms=3, cordon_window_s=10, clear_s=100, readmit_s=20))
    for x in (0, 11, 22, 33):
        m.observe(x, True, "x")
    assert m.state == NodeHealth.SUSPECT


def test_operator_cordon_is_never_lifted_by_the_detector() -> None:
    m = NodeHealthMachine("n1", RULES)
    m.cordon(0, "disk replacement", by="operator")
    assert all(m.observe(x, False) is None for x in range(1, 200))
    assert m.state == NodeHealth.CORDONED and m.reason == "disk replacement"
    t = m.uncordon(200, "done")
    assert t is not None and t.new == NodeHealth.HEALTHY


@given(st.lists(st.tuples(st.floats(0, 5), st.booleans()), max_size=200))
def test_every_transition_is_an_allowed_edge(steps: list[tuple[float, bool]]) -> None:
    allowed = {
        (NodeHealth.HEALTHY, NodeHealth.SUSPECT),
        (NodeHealth.SUSPECT, NodeHealth.CORDONED),
        (NodeHealth.SUSPECT, NodeHealth.HEALTHY),
        (NodeHealth.CORDONED, NodeHealth.HEALTHY),
    }
    m = NodeHealthMachine("n", RULES)
    now = 0.0
    for dt, alarm in steps:
        now += dt
        t = m.observe(now, alarm, "why")
        if t is not None:
            assert (t.old, t.new) in allowed
            assert t.reason


def test_cordon_withheld_keeps_node_suspect() -> None:
    m = NodeHealthMachine("n1", RULES)
    for x in range(5):
        m.observe(x, True, "x", may_cordon=False)
    assert m.state == NodeHealth.SUSPECT
    t = m.observe(5, True, "x", may_cordon=True)
    assert t is not None and t.new == NodeHealth.CORDONED


def test_a_detector_cordon_restored_after_a_restart_waits_its_quiet_time() -> None:
    """After a plane restart the state comes from the store with no alarm time: the node was
    re-admitted at its first healthy sample, its reason 'healthy scores for infs' (ops walk s31)."""
    m = NodeHealthMachine("n1", RULES)
    m.state, m.reason, m.cordoned_by = NodeHealth.CORDONED, "5 anomalies in 30s", "detector"
    assert all(m.observe(x, False) is None for x in range(100, 120))
    t = m.observe(120, False)
    assert t is not None and t.new == NodeHealth.HEALTHY
    assert t.reason == "re-admitted: healthy scores for 20s"


def test_a_suspect_restored_after_a_restart_waits_its_quiet_time() -> None:
    m = NodeHealthMachine("n1", RULES)
    m.state, m.reason = NodeHealth.SUSPECT, "anomaly: x"
    assert m.observe(50, False) is None
    t = m.observe(55, False)
    assert t is not None and t.new == NodeHealth.HEALTHY and t.reason == "no anomaly for 5s"
