"""A job that writes, into its own progress.jsonl, records no SDK would: steps past 64 bits
and past JSON's doubles, negative steps, a total that is infinite, a line nested past the
parser's depth; then one honest report, and exit 0. The plane must take the honest one and
the exit, and go on with every other job."""

from __future__ import annotations

import os
import pathlib
import time

from sluice import sdk

sdk.report(1, loss=1.0)
with open(pathlib.Path(os.environ["SLUICE_RUN_DIR"]) / "progress.jsonl", "a") as f:
    now = time.time()
    f.write(f'{{"t": {now}, "step": {2**70}, "loss": 1.0, "metrics": {{}}}}\n')
    f.write(f'{{"t": {now}, "step": 1e400, "loss": 0.5, "metrics": {{}}}}\n')
    f.write(f'{{"t": {now}, "step": -3, "metrics": {{}}}}\n')
    f.write(f'{{"t": {now}, "step": 2, "metrics": {{"total_steps": 1e400}}}}\n')
    f.write("[" * 100_000 + "\n")
sdk.report(3, loss=0.25)
time.sleep(1.5)
