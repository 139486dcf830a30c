"""The victim: tenant B's job holding a secret in its environment, its log and its checkpoint.
Runs until sluice stops it."""

import os
import time

from sluice import sdk

secret = os.environ["VICTIM_SECRET"]
print(f"victim: my secret is {secret}", flush=True)
sdk.report(1, loss=1.0)
sdk.checkpoint.save({"secret": secret}, step=1)
print("victim: ready", flush=True)
while not sdk.should_stop():
    time.sleep(0.2)
