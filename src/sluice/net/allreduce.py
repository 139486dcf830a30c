"""One rank of the all-reduce measurement: torch.distributed with gloo, run in a namespace.

`python -m sluice.net.allreduce --rank R --world W --addr A --port P --sizes 1024,... --out F`
with GLOO_SOCKET_IFNAME naming the datapath's interface. For each message size every rank
fills a float32 tensor with values whose sum is exact in float32 (`arange % 1024 + rank`),
all-reduces it, and checks every element against the known sum before timing the next
round; a wrong element fails the run (exit 3). Rank 0 writes the per-round times as JSON.
Rounds per size are bounded by count and by a time budget, so 256 MB does not run for ever.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

PATTERN = 1024


def expected_sum(n_elems: int, world: int) -> object:
    import torch

    base = torch.arange(n_elems, dtype=torch.float32).remainder_(PATTERN)
    return base * world + world * (world - 1) / 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sluice.net.allreduce")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--addr", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds per size (at most)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=20.0, help="time per size before fewer rounds are run")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{a.addr}:{a.port}",
        rank=a.rank,
        world_size=a.world,
        timeout=timedelta(seconds=a.timeout_s),
    )
    results = []
    ok = True
    for size in (int(s) for s in a.sizes.split(",")):
        n = max(1, size // 4)
        want = expected_sum(n, a.world)
        base = torch.arange(n, dtype=torch.float32).remainder_(PATTERN)
        times: list[float] = []
        wrong = 0
        start = time.monotonic()
        for i in range(a.warmup + a.rounds):
            t = base + a.rank
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            dt = time.perf_counter() - t0
            wrong = int((t != want).sum().item())
            if wrong:
                ok = False
                break
            if i >= a.warmup:
                times.append(dt)
            # every rank must run the same number of rounds: decide on rank 0's clock
            flag = torch.tensor([1.0 if time.monotonic() - start > a.budget_s and len(times) >= 1 else 0.0])
            dist.broadcast(flag, 0)
            if flag.item() > 0:
                break
        # a few reduced values, so a caller can check the sum against its own arithmetic
        sample = {str(i): float(t[i]) for i in sorted({0, 1, min(PATTERN - 1, n - 1), n - 1})}
        results.append({"bytes": n * 4, "times_s": times, "wrong_elements": wrong, "sample": sample})
        if not ok:
            break
    dist.barrier()
    dist.destroy_process_group()
    if a.rank == 0 and a.out:
        with open(a.out, "w") as f:
            json.dump({"world": a.world, "results": results, "exact": ok}, f)
    return 0 if ok else 3


if __name__ == "__main__":
    code = main()
    # Skip Python's finalisation: gloo's worker thread may free the last collective's Python
    # tensors after shutdown has begun, and taking the GIL then aborts the process (SIGABRT;
    # see examples/ddp.py's leave()). The results file is closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
