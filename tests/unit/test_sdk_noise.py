"""The SDK's gradient noise scale and throughput meter (issue 12) against cases whose answer
is known: gradients drawn with a chosen true gradient G and per-sample covariance σ²·I, so
B_noise = d·σ²/|G|² exactly; and a quadratic loss whose per-sample gradients are w − x_i."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest

from sluice import sdk

torch = pytest.importorskip("torch")


def known_case(d: int = 64, sigma: float = 0.5, g_norm: float = 0.4) -> tuple[torch.Tensor, float, float]:
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(d, generator=gen)
    g = g * (g_norm / g.norm())
    return g, d * sigma**2, g_norm**2  # G, tr(Σ), |G|²


def test_estimator_recovers_the_noise_scale_of_synthetic_gradients() -> None:
    g, trace, sqr = known_case()
    d, sigma = g.numel(), math.sqrt(trace / g.numel())
    world, b = 4, 8
    est = sdk.NoiseScaleEstimator(beta=0.99)
    gen = torch.Generator().manual_seed(2)
    naive = []
    for _ in range(2000):  # each replica's gradient: the mean of b per-sample gradients G + N(0, σ²I)
        local = g + torch.randn(world, d, generator=gen) * (sigma / math.sqrt(b))
        small = float(local.pow(2).sum(dim=1).mean())
        big = float(local.mean(dim=0).pow(2).sum())
        naive.append(big)
        v = est.update(small, big, b, world * b)
    assert v is not None and v.noise_scale is not None
    assert v.grad_var == pytest.approx(trace, rel=0.1)
    assert v.grad_sqr == pytest.approx(sqr, rel=0.15)
    assert v.noise_scale == pytest.approx(trace / sqr, rel=0.2)  # 100 samples
    # what the estimator corrects: the big batch's |G_B|² alone is |G|² + tr(Σ)/B, far off here
    assert sum(naive) / len(naive) > 2 * sqr
    assert set(v.metrics()) == {"grad_noise_scale", "grad_sqr", "grad_var", "gns_batch"}
    assert v.metrics()["gns_batch"] == world * b


def test_estimator_is_bias_corrected_from_the_first_measurement_and_rejects_bad_batches() -> None:
    est = sdk.NoiseScaleEstimator(beta=0.9)
    assert est.value() is None
    v = est.update(small_sqr=3.0, big_sqr=1.5, small_batch=1, big_batch=2)  # sqr 0, var 3
    assert v is not None and v.grad_var == pytest.approx(3.0) and v.grad_sqr == pytest.approx(0.0)
    assert v.noise_scale is None and "grad_noise_scale" not in v.metrics()  # |G|² not positive: no ratio
    assert est.update(float("nan"), 1.0, 1, 2) == v  # a diverged step is skipped
    with pytest.raises(ValueError, match="small batch"):
        est.update(1.0, 1.0, 4, 4)
    with pytest.raises(ValueError, match="beta"):
        sdk.NoiseScaleEstimator(beta=1.0)


class Quadratic(torch.nn.Module):
    """loss = mean_i ½|w − x_i|²: per-sample gradient w − x_i, so with x ~ N(μ, σ²I) the true
    gradient is w − μ and tr(Σ) = d·σ²."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.w - x).pow(2).sum(dim=1).mean()


def test_one_replica_measures_from_consecutive_batches() -> None:
    g, trace, sqr = known_case(g_norm=0.8)
    d, sigma, b = g.numel(), math.sqrt(trace / g.numel()), 16
    model = Quadratic(g)  # μ = 0: the true gradient is w = g
    gns = sdk.GradientNoiseScale(model, batch=b, beta=0.99)
    assert gns.world == 1 and gns.available and gns.metrics() == {}
    gen = torch.Generator().manual_seed(3)
    for _ in range(1000):  # parameters held still (no optimizer step): consecutive batches are unbiased
        model.zero_grad()
        model(torch.randn(b, d, generator=gen) * sigma).backward()
        gns.update()
    v = gns.value()
    assert v is not None and v.noise_scale == pytest.approx(trace / sqr, rel=0.2)
    assert gns.metrics()["gns_batch"] == 2 * b
    off = sdk.GradientNoiseScale(Quadratic(g), batch=b, single="off")
    assert not off.available and off.update() is None and off.metrics() == {}


def test_every_k_measures_one_step_in_k() -> None:
    g, _, _ = known_case(d=4)
    model = Quadratic(g)
    gns = sdk.GradientNoiseScale(model, batch=2, every=5)
    gen = torch.Generator().manual_seed(4)
    for _ in range(50):
        model.zero_grad()
        model(torch.randn(2, 4, generator=gen)).backward()
        gns.update()
    assert gns.estimator.samples == 10


STEPS = 200
"""Enough at B_noise = 25 (|G| = 0.8): within 10 % over 30 seeds of the same draw without DDP."""


def _ddp_rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    g, trace, sqr = known_case(g_norm=0.8)
    d, sigma, b = g.numel(), math.sqrt(trace / g.numel()), 8
    net = Quadratic(g)
    model = torch.nn.parallel.DistributedDataParallel(net)
    gns = sdk.GradientNoiseScale(model, batch=b, global_batch=2 * b, beta=1 - 2 / STEPS)
    gen = torch.Generator().manual_seed(10 + rank)  # each replica its own samples
    for _ in range(STEPS):
        model.zero_grad()
        x = torch.randn(b, d, generator=gen) * sigma
        model(x).backward()
        gns.update()
    local = (net.w - x.mean(dim=0)).detach()  # this replica's gradient of the last step
    both = [torch.zeros(d), torch.zeros(d)]
    dist.all_gather(both, local)
    v = gns.value()
    assert v is not None
    Path(out.format(rank=rank)).write_text(
        f"{v.noise_scale} {trace / sqr} {float((net.w.grad - (both[0] + both[1]) / 2).abs().max())}"
    )
    dist.destroy_process_group()


def test_two_ddp_replicas_measure_from_their_local_gradients(tmp_path: Path) -> None:
    """Real DDP over gloo in two processes: the hook reads each replica's own gradient and
    leaves DDP's all-reduce intact (the gradient is still the replicas' average)."""
    mp = pytest.importorskip("torch.multiprocessing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "rank{rank}.txt")
    import torch._dynamo  # noqa: F401  DDP's constructor imports it (seconds): once here, not in each child

    # fork: the children start with torch already imported (no process group exists yet)
    mp.start_processes(_ddp_rank, args=(port, out), nprocs=2, join=True, start_method="fork")
    for rank in (0, 1):
        est, truth, drift = map(float, Path(out.format(rank=rank)).read_text().split())
        assert est == pytest.approx(truth, rel=0.2)
        assert drift < 1e-5  # .grad is the average of the two local gradients


def test_throughput_meter_reports_rates_per_window_with_world_size_and_batch() -> None:
    now = [100.0]
    meter = sdk.ThroughputMeter(global_batch=64, world_size=2, clock=lambda: now[0])
    assert meter.metrics() == {"world_size": 2.0, "global_batch": 64.0}  # nothing timed yet
    meter.step()  # the first step opens the window (start-up is not counted)
    for _ in range(10):
        now[0] += 0.5
        meter.step()
    m = meter.metrics()
    # the names the plane reads (docs/architecture.md): a rename here must be made there too
    assert set(m) == {"world_size", "global_batch", "samples_per_s", "steps_per_s"}
    assert m["steps_per_s"] == pytest.approx(2.0) and m["samples_per_s"] == pytest.approx(128.0)
    now[0] += 1.0  # a new window: a slower step
    meter.step(samples=32)
    assert meter.metrics()["samples_per_s"] == pytest.approx(32.0)
    with pytest.raises(ValueError, match="global_batch"):
        sdk.ThroughputMeter(global_batch=0)
