"""A small, steady training-like job for integration tests.

Counts STEPS steps of STEP_S seconds (busy-looping with BURN=1), reports a falling loss (flat with
LOSS_MODE=flat), checkpoints every CKPT_EVERY
steps and when asked to stop, and appends "<pid> <attempt> <start step>" to PID_FILE so a
test can tell which processes ran and where each attempt resumed. With CRASH_AT set it
exits with code 3 on reaching that step (after checkpointing), on every attempt.
"""

import os
import sys
import time

from sluice import sdk

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
