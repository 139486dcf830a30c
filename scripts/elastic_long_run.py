"""Does a long one-replica ddp.py job run slower than its short measuring run? (not a product command)

    .venv/bin/python scripts/elastic_long_run.py 50000 [fixed|sluice|pollux]
    .venv/bin/python scripts/elastic_long_run.py --stats FILE.json [FILE.json ...]

The first form runs one ddp.py job through a plane set up as `sluice bench elastic` sets it up
(2 virtual nodes, 0.1 s rounds; `fixed` holds it at one replica with the bench's `Sizer`, a
policy name lets that policy size it within 1..2) and prints the plane process's CPU seconds
over the job and the job's rates. The second form prints the rates of stats files that
`examples/ddp.py --stats` wrote, e.g. by hand:

    cd examples && taskset -c 0 ../.venv/bin/python ddp.py --steps 50000 --width 256 --batch 128 --stats /tmp/a.json

Rates: `steady` is the bench's own `steady_steps_s` (the run's second half); `tenths` are the
steps/s over each tenth of the run, which show whether the rate falls as the run goes on.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

from sluice.bench.elastic import Sizer, embedded_plane, steady_steps_s, submit_ddp, wait_job
from sluice.policy.registry import make_policy


def rates(path: Path) -> str:
    s = json.loads(path.read_text())
    marks = s["marks"]
    n = len(marks)
    tenths = []
    for i in range(10):
        (s0, t0), (s1, t1) = marks[i * (n - 1) // 10], marks[(i + 1) * (n - 1) // 10]
        tenths.append(round((s1 - s0) / max(1e-9, t1 - t0)))
    steps = s["last"] - s["start"] + 1
    steady = steady_steps_s(marks)
    return f"{path.name}: world {s['world']}, {steps} steps, steady {steady:.1f} steps/s, tenths {tenths}"


def through_plane(steps: int, how: str) -> None:
    with tempfile.TemporaryDirectory(prefix="sluice-long-run-") as tmp:
        os.environ.setdefault("SLUICE_CACHE_MEMORY_DIR", str(Path(tmp) / "memory-tier"))
        opts = {"virtual_nodes": 2, "reconcile_interval_s": 0.1, "stop_grace_s": 20.0}
        with embedded_plane(Path(tmp) / "home", "kube", **opts) as plane:
            with plane.controller.lock:
                plane.controller.policy = Sizer(1, 0.5) if how == "fixed" else make_policy(how)
            me = psutil.Process()
            c0, t0 = me.cpu_times(), time.time()
            job_id = submit_ddp(plane, Path(tmp), steps, 256, 128, 0.5, 2)
            job = wait_job(plane, job_id, lambda j: j.phase.terminal, 3600, "the end")
            c1, t1 = me.cpu_times(), time.time()
            plane_cpu = (c1.user + c1.system) - (c0.user + c0.system)
            print(f"{how}: {job.phase}, {job.attempt} attempt(s); plane CPU {plane_cpu:.1f} s over {t1 - t0:.1f} s")
            print(rates(Path(tmp) / f"a{job.attempt}-r0.json"))


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--stats":
        for p in argv[1:]:
            print(rates(Path(p)))
        return
    through_plane(int(argv[0]), argv[1] if len(argv) > 1 else "fixed")


if __name__ == "__main__":
    main(sys.argv[1:])
