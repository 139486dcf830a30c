"""The job `sluice bench threads` runs: a small MLP trained on random data with torch,
reporting every step (and the intra-op thread count torch is using) through the SDK.

Run as `python -m sluice.bench.threads_job --steps N`; it stops early when asked to.
"""

from __future__ import annotations

import argparse


def main() -> None:
    import torch

    from sluice import sdk

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(
        torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(args.batch, w), torch.randint(0, 10, (args.batch,))
    for step in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sdk.report(step, loss=float(loss), threads=torch.get_num_threads())
        if sdk.should_stop():
            break


if __name__ == "__main__":
    main()
