"""Data-parallel MLP on scikit-learn's digits: PyTorch DDP, one process per replica — over
NCCL on the replica's GPU when the spec asks for `resources.gpus`, else over gloo on the CPU.

The engine (local or Ray, gang-launched) gives each replica MASTER_ADDR/MASTER_PORT, RANK,
WORLD_SIZE and torchrun's other variables (so `torchrun --nproc-per-node 2 ddp.py` runs it
too); each replica draws its own batches (seeded by step and rank) and DDP all-reduces the
gradients every step, so the step time is compute + one all-reduce of the model's
gradients (~4.4 MB at the default width) — what the network lab (`sluice net bench`)
times across each datapath. GLOO_SOCKET_IFNAME, when sluice's `net_interface` setting is
set, pins that traffic to the chosen interface.

Rank 0 reports progress and saves checkpoints; every rank resumes from the same checkpoint.
`--stats FILE` writes this rank's step times as JSON (the lab reads rank 0's), with the step
it started from, its world size, batch, lr, first loss, the loop's wall-clock span, the wall
clock every ~1/200 of the run (`marks`, for a steady-state rate without the warm-up) and a
checksum of its parameters at the end (equal on every rank: that is what DDP promises); a
`{rank}` in FILE gives each rank a file of its own, an `{attempt}` each attempt.

Elastic: a policy may restart the job at another number of replicas (within the spec's
`resources.replicas` range); it resumes from the checkpoint at the new world size.
`sdk.elastic()` gives this replica's batch and learning-rate scale for it: `--batch` is the
global batch at the spec's `min` replicas (the spec's `resources.replicas.global_batch`
wins), kept or scaled with the replicas as the spec's `resources.replicas.batch` says.

What a policy needs to size the job comes with every report: `sdk.ThroughputMeter` adds the
measured samples/s and steps/s with the world size and global batch they were measured at,
and `sdk.GradientNoiseScale` the gradient noise scale (grad_noise_scale, grad_sqr, grad_var),
measured every `--gns-every` steps from each replica's own gradient on its way into DDP's
all-reduce (one replica: from consecutive batches). The `--stats` file holds the last report's
metrics too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn

from sluice import sdk


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--width", type=int, default=1024, help="hidden width: sets the gradient size per step")
    p.add_argument("--batch", type=int, default=128, help="global batch at min replicas (64 a replica at 2)")
    p.add_argument("--stats", default=None)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to idle after each step (stretches tests)")
    p.add_argument("--gns-every", type=int, default=10, help="measure the gradient noise scale one step in N")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("EXAMPLE_THREADS", "1")))
    # A replica given a GPU (`resources.gpus`) sees only its own, as cuda:0, and talks NCCL;
    # without one it trains on the CPU over gloo.
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ:  # MASTER_ADDR/PORT, RANK, WORLD_SIZE from the engine (or the lab)
        dist.init_process_group(backend)
    else:  # one process (by hand, or a job of one replica): a group of one needs no rendezvous
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    el = sdk.elastic(global_batch=a.batch)  # this replica's batch and lr scale at this world size
    digits = load_digits()
    x_all = torch.tensor(digits.data / 16.0, dtype=torch.float32, device=device)
    y_all = torch.tensor(digits.target, dtype=torch.long, device=device)
    torch.manual_seed(0)  # identical initial weights on every rank
    net = nn.Sequential(
        nn.Linear(64, a.width), nn.ReLU(), nn.Linear(a.width, a.width), nn.ReLU(), nn.Linear(a.width, 10)
    )
    net.to(device)
    model = nn.parallel.DistributedDataParallel(net, device_ids=[0] if device.type == "cuda" else None)
    gns = sdk.GradientNoiseScale(model, batch=el.batch, global_batch=el.global_batch, every=a.gns_every)
    meter = sdk.ThroughputMeter(global_batch=el.global_batch, world_size=world)
    lr = 0.05 * el.lr_scale
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    start = 0
    state = sdk.checkpoint.load()
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        for group in opt.param_groups:  # the checkpoint's lr was for its world size
            group["lr"] = lr
        start = int(state["step"]) + 1
    if rank == 0:
        print(
            f"[ddp] world {world} on {device} ({backend}), batch {el.batch}/replica ({el.global_batch} global), "
            f"lr {lr:g}, from step {start}"
        )
    metrics: dict[str, float] = {}
    first_loss: float | None = None  # where this attempt starts: near ln 10 only on a fresh start
    t_first = t_end = time.time()  # first step's start, last step's end: `sluice bench elastic`'s time lost
    gen = torch.Generator()
    step_s: list[float] = []
    marks: list[tuple[int, float]] = []  # (step, wall clock at its end) every `every` steps
    every = max(10, (a.steps - start) // 200)
    step = start - 1
    for step in range(start, a.steps):
        gen.manual_seed(1_000_003 * step + 7919 * rank)
        idx = torch.randint(0, len(x_all), (el.batch,), generator=gen).to(device)
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x_all[idx]), y_all[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients here
        gns.update()  # before the gradients are cleared: one step in --gns-every measures
        opt.step()
        step_s.append(time.perf_counter() - t0)
        meter.step()
        t_end = time.time()
        if (step - start) % every == 0:
            marks.append((step, t_end))
        if step == start:
            t_first = t_end - step_s[-1]
        if first_loss is None:
            first_loss = loss.item()
        if a.step_sleep:
            time.sleep(a.step_sleep)
        stop = torch.tensor([1.0 if sdk.should_stop() else 0.0], device=device)
        dist.all_reduce(stop)  # every rank stops at the same step
        if rank == 0 and (step % 20 == 0 or step + 1 == a.steps):
            metrics = {"total_steps": a.steps, "step_s": step_s[-1], **meter.metrics(), **gns.metrics()}
            sdk.report(step, loss=loss.item(), **metrics)
        if stop.item() > 0 or (rank == 0 and sdk.checkpoint.due()):
            if rank == 0:
                sdk.checkpoint.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step}, step)
            if stop.item() > 0:
                break
    if a.stats:
        digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in net.parameters())).hexdigest()
        stats = {"rank": rank, "world": world, "start": start, "last": step, "params_sha256": digest}
        stats |= {"batch": el.batch, "lr": lr, "first_loss": first_loss, "t_first": t_first, "t_end": t_end}
        stats["marks"] = [*marks, (step, t_end)]
        stats["metrics"] = metrics
        path = a.stats.replace("{rank}", str(rank)).replace("{attempt}", str(sdk.context().attempt))
        with open(path, "w") as f:
            json.dump({**stats, "step_s": step_s[min(5, len(step_s) - 1) :]}, f)
    # Both ranks leave together: a rank that tears its gloo group down while the other still
    # talks to it aborts ("terminate called without an active exception", seen in net bench).
    dist.barrier()
    dist.destroy_process_group()
    return 0


def leave(code: int) -> None:
    """Exit without Python's finalisation. DDP keeps the gloo group alive past
    destroy_process_group, and its worker thread may free the last collective (which holds
    Python tensors) only after the interpreter has begun to shut down: taking the GIL then
    ends the thread mid-destructor and the process aborts with SIGABRT, about one run in four
    on two cores (gdb: pt_gloo_runloop in ~AsyncBarrierWork, main thread in Py_FinalizeEx).
    Everything this script writes is closed by now, so skipping finalisation loses nothing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
