"""A small, steady training-like job for integration tests.

Counts STEPS steps of STEP_S seconds (busy-looping with BURN=1), reports a falling loss (flat with
LOSS_MODE=flat), checkpoints every CKPT_EVERY
steps and when asked to stop, and appends "<pid> <attempt> <start step>" to PID_FILE so a
test can tell which processes ran and where each attempt resumed. With CRASH_AT set it
exits with code 3 on reaching that step (after checkpointing), on every attempt. With
LOCK_FILE set it first takes an exclusive lock on that file, and where another process of
the job still holds it (two attempts at once) appends "DOUBLE <pid>" to PID_FILE and exits 4.
With PER_RANK=1 (a gang) each replica uses PID_FILE and LOCK_FILE with ".r<RANK>" appended.
"""

import fcntl
import os
import sys
import time

from sluice import sdk

if os.environ.get("PER_RANK") == "1":
    for var in ("PID_FILE", "LOCK_FILE"):
        if os.environ.get(var):
            os.environ[var] += f".r{os.environ.get('RANK', '0')}"

if os.environ.get("LOCK_FILE"):
    held = open(os.environ["LOCK_FILE"], "a")  # noqa: SIM115 (held until the process ends)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with open(os.environ["PID_FILE"], "a") as f:
            f.write(f"DOUBLE {os.getpid()}\n")
        sys.exit(4)

steps = int(os.environ.get("STEPS", "40"))
step_s = float(os.environ.get("STEP_S", "0.25"))
every = int(os.environ.get("CKPT_EVERY", "5"))
crash_at = int(os.environ.get("CRASH_AT", "0"))
burn = os.environ.get("BURN", "0") == "1"
flat = os.environ.get("LOSS_MODE", "") == "flat"  # a job that has stopped learning

state = sdk.checkpoint.load(weights_only=False) or {"step": 0}
start = int(state["step"])
with open(os.environ["PID_FILE"], "a") as f:
    f.write(f"{os.getpid()} {os.environ.get('SLUICE_ATTEMPT', '1')} {start}\n")

for step in range(start, steps):
    t_end = time.monotonic() + step_s
    if burn:
        while time.monotonic() < t_end:
            pass
    else:
        time.sleep(step_s)
    done = step + 1
    sdk.report(done, loss=0.5 + 0.0001 * (done % 2) if flat else 1.0 / done, total_steps=steps)
    if done % every == 0 or sdk.should_stop():
        sdk.checkpoint.save({"step": done}, done)
    if crash_at and done >= crash_at:
        sys.exit(3)
    if sdk.should_stop():
        sys.exit(0)
