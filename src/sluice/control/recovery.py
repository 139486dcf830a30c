"""Crash recovery: rebuild the controller's state from the store and what is still running.

After a `kill -9` of the control plane every job must be accounted for:
- running jobs whose process (of the same attempt) is still alive are adopted;
- jobs whose process ended while nobody watched get their real exit code from the engine's
  first poll (the agent keeps exit codes on disk) and go through the normal exit path;
- active jobs with no process at all are requeued and resume from their checkpoint;
- queued and pending jobs stay where they were;
- a live process of an attempt the store does not know as current is killed, so no job
  ever runs twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.control.controller import Controller
from sluice.model import TERMINAL, Phase


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
        live_phases = [p for p in Phase if p not in TERMINAL]
        ctl.load(ctl.store.list_jobs(phases=live_phases))
        # Exits that happened while we were down arrive in the first poll.
        events = ctl.engine.poll()
        for e in events:
            ctl._apply(e, now)
        alive = ctl.engine.alive()
        for jid in sorted(ctl.active_ids):
            job = ctl.jobs[jid]
            if job.phase.terminal:
                report.finished.append(jid)
            elif job.phase.active:
                if alive.get(jid) == job.attempt:
                    if job.phase == Phase.STARTING:
                        ctl._move(job, Phase.RUNNING, "adopted after control-plane restart")
                    ctl._event(job, "recovery", f"adopted running attempt {job.attempt} after control-plane restart")
                    report.adopted.append(jid)
                else:
                    ctl._requeue(
                        job, "process gone while the control plane was down; resuming from checkpoint", now, count=False
                    )
                    report.requeued.append(jid)
            else:
                report.queued.append(jid)
        for jid, attempt in alive.items():
            cur = ctl.jobs.get(jid)
            if cur is None or not cur.phase.active or cur.attempt != attempt:
                ctl.engine.stop(jid, attempt, checkpoint=False)
                report.killed_strays.append(jid)
        for e in events:
            done = ctl.jobs.get(getattr(e, "job_id", ""))
            if done is not None and done.phase.terminal and done.id not in report.finished:
                report.finished.append(done.id)
        ctl.active_ids = {j for j in ctl.active_ids if not ctl.jobs[j].phase.terminal}
        ctl._flush(now)
        ctl.store.append_event(now, "recovery", report.summary())
    return report
