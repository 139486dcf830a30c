"""The training loop the examples share: resume, report, checkpoint, stop politely.

What a sluice-friendly script does, in one place:
- resume from the newest checkpoint (`sdk.checkpoint.load()`), so a preempted or migrated
  job continues where it was instead of starting over;
- `sdk.report(step, loss=..., total_steps=...)` every few steps, so the control plane sees
  how fast it still learns and can predict when it will finish;
- save when `sdk.checkpoint.due()` and when `sdk.should_stop()` (SIGTERM), then exit 0;
- train on the GPU sluice placed the job on (`resources.gpus`), else on the CPU.

Batches are drawn from a generator seeded by the step, so a resumed run sees the same data
stream it would have seen without the interruption.

Length: `--steps N`, or SLUICE_EXAMPLE_SCALE=0.05 to run 5 % of the default (tests); in a job
spec, `env: {EXAMPLE_SCALE: "0.05"}` (a spec may not set SLUICE_* variables).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from sluice import sdk

Batch = tuple[torch.Tensor, torch.Tensor]


def steps_from_cli(default: int) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None, help=f"training steps (default {default})")
    args = parser.parse_args()
    if args.steps is not None:
        return max(1, args.steps)
    # EXAMPLE_SCALE may be set per job in its spec; SLUICE_EXAMPLE_SCALE comes from the environment.
    scale = float(os.environ.get("EXAMPLE_SCALE") or os.environ.get("SLUICE_EXAMPLE_SCALE", "1"))
    return max(1, math.ceil(default * scale))


def pick_device() -> torch.device:
    """The job's GPU when sluice gave it one, else the CPU. CUDA_VISIBLE_DEVICES shows a job
    only the GPUs placed for it (none: an empty value), so the first visible one is `cuda:0`."""
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} thread(s))"


def train(
    name: str,
    model: nn.Module,
    batch: Callable[[torch.Generator], Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    default_steps: int,
    lr: float = 1e-3,
    report_every: int | None = None,
) -> int:
    total = steps_from_cli(default_steps)
    # About 400 reports per run: enough for progress curves, few enough to stay cheap to tail.
    report_every = report_every or max(10, total // 400)
    # One intra-op thread unless asked: models this small gain nothing from more, and on a node
    # shared by several jobs extra threads spin at barriers waiting for descheduled peers
    # (measured: an LSTM 200x slower with 2 threads per job, six jobs on two cores).
    torch.set_num_threads(int(os.environ.get("EXAMPLE_THREADS", "1")))
    torch.manual_seed(0)
    device = pick_device()
    print(f"{name}: training on {device_name(device)}", flush=True)
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    start = 0
    state = sdk.checkpoint.load()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"]) + 1
        # The step the checkpoint was saved at, as `sluice job why` names it; training goes on
        # with the next one (it printed `start`, one more than `job why` said).
        print(f"{name}: resumed from checkpoint at step {start - 1}, continuing with step {start}", flush=True)
    else:
        print(f"{name}: fresh start, {total} steps", flush=True)

    def save(step: int) -> None:
        sdk.checkpoint.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, step)

    gen = torch.Generator()
    window: list[float] = []
    t0, samples = time.monotonic(), 0
    step = start - 1
    for step in range(start, total):
        gen.manual_seed(1_000_003 * step + 17)
        x, y = batch(gen)
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        window.append(loss.item())
        samples += len(x)
        if (step + 1) % report_every == 0 or step + 1 == total:
            mean = sum(window) / len(window)
            rate = samples / max(time.monotonic() - t0, 1e-9)
            sdk.report(step, loss=mean, total_steps=total, samples_per_s=rate)
            if (step + 1) % (report_every * 25) == 0:
                print(f"{name}: step {step + 1}/{total} loss {mean:.4f} ({rate:.0f} samples/s)", flush=True)
            window, t0, samples = [], time.monotonic(), 0
        if sdk.should_stop():
            save(step)
            print(f"{name}: asked to stop; checkpointed at step {step}", flush=True)
            return 0
        if sdk.checkpoint.due():
            save(step)
    if step >= start:
        save(step)
    print(f"{name}: done, {total} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit("this module is the examples' shared loop; run mlp.py, cnn.py, lstm.py or autoencoder.py")
