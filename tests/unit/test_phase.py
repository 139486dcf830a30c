import contextlib

from hypothesis import given
from hypothesis import strategies as st

from sluice.model import TERMINAL, TRANSITIONS, IllegalTransition, Phase, can_transition
from sluice.model.job import JobRecord
from sluice.spec import parse_job_spec


def test_terminal_phases_have_no_way_out() -> None:
    for p in TERMINAL:
        assert TRANSITIONS[p] == frozenset()


def test_queued_cannot_jump_to_running() -> None:
    assert not can_transition(Phase.QUEUED, Phase.RUNNING)


@given(st.lists(st.sampled_from(list(Phase)), max_size=30))
def test_no_sequence_of_moves_leaves_a_terminal_phase(moves: list[Phase]) -> None:
    job = JobRecord("j", "t", parse_job_spec({"command": ["x"]}))
    reached_terminal = None
    for dst in moves:
        with contextlib.suppress(IllegalTransition):
            job.move(dst, "r")
        if job.phase.terminal and reached_terminal is None:
            reached_terminal = job.phase
        if reached_terminal is not None:
            assert job.phase == reached_terminal
