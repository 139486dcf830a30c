"""Ray's errors reach server.log and a warm's report as one plain line (Ray walk s30)."""

from __future__ import annotations

from sluice.engine.ray_errors import BRIEF_MAX_CHARS, brief

# The shape of a RayActorError / RayTaskError's text: colour codes around the task, then the
# remote traceback, then the exception.
RAY_TEXT = (
    "\x1b[36mray::NodeAgent.poll()\x1b[39m (pid=4242, ip=127.0.0.1, actor_id=abc)\n"
    "Traceback (most recent call last):\n"
    '  File "/x/agent.py", line 10, in poll\n'
    "    raise OSError('disk gone')\n"
    "OSError: disk gone\n"
)


def test_a_remote_traceback_becomes_its_first_line_and_its_exception() -> None:
    got = brief(RuntimeError(RAY_TEXT))
    assert got == "ray::NodeAgent.poll() (pid=4242, ip=127.0.0.1, actor_id=abc) ... OSError: disk gone"
    assert "\x1b" not in got and "\n" not in got


def test_an_error_without_a_traceback_keeps_its_first_line_only() -> None:
    text = "The actor died unexpectedly before finishing this task.\n\tclass_name: NodeAgent\n\tpid: 12"
    assert brief(RuntimeError(text)) == "The actor died unexpectedly before finishing this task."


def test_control_characters_are_blanked_and_the_line_is_bounded() -> None:
    assert brief("a\x07b\x1b]0;title\x07c") != "" and "\x07" not in brief("a\x07b")
    long = brief("x" * 5000)
    assert len(long) == BRIEF_MAX_CHARS and long.endswith("…")
    assert brief(TimeoutError()) == "TimeoutError"
