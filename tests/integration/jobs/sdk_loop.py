"""A tiny job for agent tests: counts steps through the SDK, resumes, checkpoints on stop.

argv: --steps N (default 1_000_000), --sleep S between steps (default 0.02), --exit-code C at
the end (default 0), --busy (spin the CPU instead of sleeping, for usage/limit tests).
"""

from __future__ import annotations

import argparse
import sys
import time

from sluice import sdk

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1_000_000)
p.add_argument("--sleep", type=float, default=0.02)
p.add_argument("--exit-code", type=int, default=0)
p.add_argument("--busy", action="store_true")
args = p.parse_args()

state = sdk.checkpoint.load()
start = int(state["step"]) + 1 if state else 0
print(f"resumed at step {start}" if state else "fresh start", flush=True)
for step in range(start, args.steps):
    if args.busy:
        end = time.monotonic() + args.sleep
        while time.monotonic() < end:
            pass
    else:
        time.sleep(args.sleep)
    sdk.report(step, loss=1.0 / (step + 1), total_steps=args.steps)
    if sdk.should_stop():
        sdk.checkpoint.save({"step": step}, step)
        print(f"stopping at step {step}", flush=True)
        sys.exit(0)
sys.exit(args.exit_code)
