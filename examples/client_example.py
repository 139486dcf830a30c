"""Drive sluice from Python, as a notebook would: submit a job, watch its progress and log,
wait for it, ask why it went where it went, and handle errors by kind.

    sluice up --detach                  # a server for $SLUICE_HOME (prints its URL)
    python examples/client_example.py   # the job below; or: python examples/client_example.py examples/mlp.yaml

The client finds the server and token as the CLI does ($SLUICE_URL / $SLUICE_TOKEN, else the
files `sluice up` wrote in $SLUICE_HOME); pass `Client(url=..., token=...)` to choose.
"""

from __future__ import annotations

import sys

from sluice.client import BadRequestError, Client, NotFoundError, SluiceError

# A tiny job that needs nothing but the sluice SDK: 40 steps, a falling loss, 0.1 s a step.
TINY_JOB = {
    "name": "client-example",
    "command": [
        "python",
        "-c",
        "import time\nfrom sluice import sdk\n"
        "for step in range(1, 41):\n"
        "    time.sleep(0.1)\n"
        "    sdk.report(step, loss=2.0 / step, total_steps=40)\n"
        "    print(f'step {step}', flush=True)\n",
    ],
    "resources": {"cpu": {"min": 0.5, "max": 1}},
}


def main(spec: object = TINY_JOB) -> int:
    with Client() as c:
        try:
            job = c.submit(spec)  # a dict, a YAML path or a JobSpec; checked here before it is sent
        except BadRequestError as err:
            for p in err.problems:  # each bad field, named as the server names it
                print(f"  {p.field}: {p.problem}", file=sys.stderr)
            return 2
        print(f"submitted {job.id} ({job.name}): {job.phase} — {job.reason}")

        for p in c.follow_progress(job.id, poll_s=0.5):  # one record per new report, until it ends
            loss = "-" if p.loss is None else f"{p.loss:.4g}"
            print(f"  step {p.step}/{p.total_steps or '?'}  loss {loss}  {p.throughput:.2g} steps/s")

        done = c.wait(job.id, timeout_s=600)
        print(f"{done.id}: {done.phase} (exit code {done.exit_code})")
        print("last log lines:", *c.logs(done.id, tail=3).splitlines(), sep="\n  ")
        for e in c.why(done.id):
            print(f"  {e.kind:>8}  {e.message}")

        try:
            c.job("j-does-not-exist")
        except NotFoundError as err:
            print(f"as expected: {err} (HTTP {err.status})")
        return 0 if done.phase == "Succeeded" else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else TINY_JOB))
    except SluiceError as err:  # unreachable server, bad token, ...: one line, not a traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
