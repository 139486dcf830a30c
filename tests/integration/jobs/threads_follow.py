"""A torch job for the thread-pool test: small matrix products, reporting each step the
intra-op thread count torch uses (the SDK resizes it with the job's CPU budget).

argv: --steps N (default 1_000_000), --sleep S between steps (default 0.02).
"""

from __future__ import annotations

import argparse
import time

import torch

from sluice import sdk

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1_000_000)
p.add_argument("--sleep", type=float, default=0.02)
args = p.parse_args()

a = torch.randn(128, 128)
for step in range(args.steps):
    a = torch.tanh(a @ a)
    time.sleep(args.sleep)
    sdk.report(step, threads=torch.get_num_threads(), total_steps=args.steps)
    if sdk.should_stop():
        break
