"""The names the plane itself gives to what is in a job's run folder (`runs/<job>/`).

The node agent makes them (node_agent.py) and the control plane keeps a job's relative
`checkpoint.location` off them (control/confine.py): the checkpoint folder is handed to the
job's uid, so a location that is, or starts with, one of these names would hand the job a
folder the plane reads back and trusts (an attempt's `state.json`, `child.json`), or make the
plane create a folder inside one the job can change.
"""

from __future__ import annotations

JOB_LOG = "job.log"
"""The job's log, appended by the plane across attempts (a file)."""
JOB_LOG_INDEX = "job.log.attempts"
"""Where each attempt's output starts in the log beside it: lines `<attempt> <byte offset>`,
appended by the agent before the attempt writes. A job moved back to a node it ran on has
attempts 1 and 3 in that node's log and 2 in another's; this is how a read puts them in order."""
WORK_DIR = "work"
"""The job's default working folder and HOME: its uid's, so the plane makes nothing in it."""
TMP_DIR = "tmp"
"""The job's TMPDIR: its uid's, as WORK_DIR, so what `tempfile` writes lies in its run folder,
where its disk bound counts it and retention removes it (not in the host's shared /tmp)."""
ATTEMPT_PREFIX = "attempt-"
"""`attempt-<n>/`: one attempt's plane files; the agent adopts every `*/attempt-*/state.json`."""
CHECKPOINTS_DIR = "checkpoints"
"""The default checkpoint folder (no `checkpoint.location`)."""


def attempt_name(attempt: int) -> str:
    return f"{ATTEMPT_PREFIX}{attempt}"


def plane_name(name: str) -> str | None:
    """What the plane keeps under `name` in a job's run folder, or None if it is free for a
    job's checkpoints (the default `checkpoints` is the job's own)."""
    if name == JOB_LOG:
        return "the job's log, written by the plane"
    if name == JOB_LOG_INDEX:
        return "the plane's index of the job's log (where each attempt starts)"
    if name == WORK_DIR:
        return "the job's working folder (the plane makes nothing inside it)"
    if name == TMP_DIR:
        return "the job's temporary folder (its TMPDIR)"
    if name.startswith(ATTEMPT_PREFIX):
        return "an attempt folder of the plane's (attempt-<n> holds the files it reads back)"
    return None
