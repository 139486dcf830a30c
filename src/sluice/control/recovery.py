"""Crash recovery: rebuild the controller's state from the store and what is still running.

After a `kill -9` of the control plane every job must be accounted for:
- running jobs whose process (of the same attempt) is still alive are adopted; one that was
  being stopped (preempt, migrate, resize, suspend, cancel) is asked to stop again: the
  crash may have come after the Stopping record was written and before the stop reached
  the job, and nothing else would ever ask it (the agents' stop is idempotent: a job
  already told keeps its first deadline);
- jobs whose process ended while nobody watched get their real exit code from the engine's
  first poll (the agent keeps exit codes on disk) and go through the normal exit path;
- active jobs with no process and no exit code are requeued and resume from their
  checkpoint — except a job that was being stopped for a cancel, which ends Cancelled
  (a cancelled job never runs again);
- queued and pending jobs stay where they were;
- a live process of an attempt the store does not know as current is killed, so no job
  ever runs twice;
- a job the first poll's exits already relaunched (a resize or migration that had
  stopped while the plane was down goes on to its target at once) is left to its new
  attempt, not mistaken for a survivor of the crash.

It works only through the controller's public methods: the job book stays the only writer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sluice.control.controller import Controller
from sluice.model import Phase

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    adopted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    killed_strays: list[str] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"adopted {len(self.adopted)}, requeued {len(self.requeued)}, finished while down "
            f"{len(self.finished)}, still queued {len(self.queued)}, stray processes killed {len(self.killed_strays)}"
        )


def recover(ctl: Controller) -> RecoveryReport:
    report = RecoveryReport()
    with ctl.lock:
        now = ctl.engine.clock()
        before = {j.id: j.attempt for j in ctl.load_live()}
        # Exits that happened while we were down arrive in the first poll.
        ctl.apply_events(ctl.engine.poll(), now)
        alive = ctl.engine.alive()
        for jid in sorted(before):
            job = ctl.book.get(jid)
            assert job is not None
            if job.phase.terminal:
                report.finished.append(jid)
            elif job.attempt != before[jid]:  # relaunched by an exit in the first poll
                report.requeued.append(jid)
            elif job.phase.active:
                if alive.get(jid) == job.attempt:
                    ctl.adopt_running(jid)
                    report.adopted.append(jid)
                    if job.phase == Phase.STOPPING:
                        _stop_again(ctl, jid, job.attempt)
                else:
                    ctl.resume_lost(jid)
                    after = ctl.book.get(jid)
                    (report.finished if after is not None and after.phase.terminal else report.requeued).append(jid)
            elif job.phase in (Phase.PENDING, Phase.QUEUED):
                report.queued.append(jid)
        for jid, attempt in alive.items():
            cur = ctl.book.get(jid)
            if cur is None or not cur.phase.active or cur.attempt != attempt:
                ctl.engine.stop(jid, attempt, checkpoint=False)
                report.killed_strays.append(jid)
        ctl.book.flush(force=True)
        ctl.store.append_event(now, "recovery", report.summary())
    return report


def _stop_again(ctl: Controller, job_id: str, attempt: int) -> None:
    """Repeat a stop the crash may have cut off. An engine that cannot reach the job now
    reports its exit or its node's loss through poll(), as for any stop."""
    try:
        ctl.engine.stop(job_id, attempt, checkpoint=True)
    except Exception as err:
        log.warning("recovery: stopping %s attempt %d again failed: %s", job_id, attempt, err)
