"""The phase table, and the job book that enforces it: every move through one method that
raises on an illegal one, and a terminal job never moves again."""

from hypothesis import given
from hypothesis import strategies as st

from sluice.control.book import JobBook
from sluice.model import TERMINAL, TRANSITIONS, IllegalTransition, Phase, can_transition
from sluice.spec import parse_job_spec
from sluice.store import MemoryStore


def test_terminal_phases_have_no_way_out() -> None:
    for p in TERMINAL:
        assert TRANSITIONS[p] == frozenset()


def test_queued_cannot_jump_to_running() -> None:
    assert not can_transition(Phase.QUEUED, Phase.RUNNING)


@given(st.lists(st.sampled_from(list(Phase)), max_size=30))
def test_the_book_raises_on_illegal_moves_and_never_leaves_a_terminal_phase(moves: list[Phase]) -> None:
    store = MemoryStore()
    book = JobBook(store, lambda: 1.0)
    job = book.create("t", parse_job_spec({"command": ["x"]}), job_id="j")
    for dst in moves:
        before = book.get("j")
        assert before is not None
        legal = dst == before.phase or can_transition(before.phase, dst)
        try:
            book.transition("j", dst, "r")
            moved = True
        except (IllegalTransition, KeyError):
            moved = False
        after = book.get("j")
        assert after is not None
        assert moved == (legal and not before.phase.terminal)
        if before.phase.terminal:
            assert after == before, "a finished job never changes"
        assert store.get_job("j") == after, "memory and store agree after every move"
    assert job.phase == Phase.PENDING  # records handed out are snapshots, never edited
