"""A job that reads every item of the dataset named in DATASET through the node cache and
reports how many bytes it saw (as the metric `bytes`), then exits 0."""

import os

from sluice import sdk
from sluice.sdk.dataset import dataset

ds = dataset(os.environ["DATASET"])
expected = int(os.environ.get("EXPECT_BYTES", "0"))
total = sum(len(ds[i]) for i in range(len(ds)))
if expected and total != expected:
    raise SystemExit(f"read {total} bytes, expected {expected}")
sdk.report(1, loss=0.0, bytes=float(total), items=float(len(ds)), total_steps=1)
