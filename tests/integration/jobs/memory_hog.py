"""Allocates and touches memory in 4 MiB chunks until it holds HOG_MB (or is OOM-killed), for
memory-limit tests. Appends "<pid> <attempt>" to PID_FILE first, so a test counts attempts.

Each chunk is filled with non-zero bytes: untouched (zero-filled) pages would cost nothing.
"""

import os
import time

CHUNK = 4 * 1024 * 1024
target_mb = int(os.environ.get("HOG_MB", "1024"))
with open(os.environ["PID_FILE"], "a") as f:
    f.write(f"{os.getpid()} {os.environ.get('SLUICE_ATTEMPT', '1')}\n")

held = []
while len(held) * CHUNK < target_mb * 1024 * 1024:
    held.append(bytearray(b"\x01") * CHUNK)
    print(f"holding {len(held) * CHUNK >> 20} MiB", flush=True)
    time.sleep(0.005)
print("done without being killed", flush=True)
