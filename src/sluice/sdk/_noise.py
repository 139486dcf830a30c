"""The gradient noise scale of a data-parallel job, from gradients DDP already computes.

Why: how much a job gains from more replicas depends on its gradient noise. McCandlish et
al. ("An Empirical Model of Large-Batch Training", 2018) call the ratio of the per-sample
gradient variance to the squared true gradient, B_noise = tr(Σ) / |G|², the batch size
beyond which larger batches stop paying; Pollux (OSDI '21) uses the same two statistics to
predict the statistical efficiency of a job at another batch size, and so its goodput at
another number of replicas. A policy can only weigh a resize well if the job tells it these.

The estimator (McCandlish et al., appendix A.1): a gradient averaged over a batch of B
samples has E|G_B|² = |G|² + tr(Σ)/B. Two batch sizes b < B, measured at the same step,
give unbiased estimates of both terms:

    |G|²  ≈ (B·|G_B|² − b·|G_b|²) / (B − b)
    tr(Σ) ≈ (|G_b|² − |G_B|²) / (1/b − 1/B)

In a DDP job the small batch is each replica's own (b samples; |G_b|² averaged over the
replicas) and the big one the all-reduced gradient (B = the global batch): the replicas'
local gradients pass through a DDP communication hook on their way to the all-reduce, so
measuring them costs one pass over the gradient buckets and one all-reduce of a scalar.
With a single replica there is no second batch at the same step; the previous step's
gradient stands in (b = the batch, B = two batches: consecutive micro-batches), which is
biased by how much the parameters moved in one step — small for small learning rates —
and costs a copy of the gradient. `single="off"` reports nothing instead.

Both estimates are noisy (the |G|² one can even be negative); each is smoothed with an
exponential moving average (bias-corrected, as Adam does) and the ratio is taken of the
smoothed values, as McCandlish et al. and Pollux do. The statistics are those of the plain
gradient: for Adam-like optimisers Pollux preconditions the gradients first, which this
does not do.

torch is imported only when a model is attached: importing the SDK stays cheap. (No
`from __future__ import annotations` here: DDP checks its hook's annotations at run time and
takes only the real GradBucket and Future[Tensor] objects, not their names.)
"""

import math
from dataclasses import dataclass
from typing import Any

SINGLE_MODES = ("consecutive", "off")


@dataclass(frozen=True, slots=True)
class NoiseScale:
    """One smoothed estimate; `metrics()` is what `sdk.report` sends to the control plane."""

    grad_sqr: float
    """|G|²: the squared norm of the true (full-data) gradient."""
    grad_var: float
    """tr(Σ): the trace of the per-sample gradient covariance."""
    measured_at: int
    """The (big) batch of the measurements, samples."""

    @property
    def noise_scale(self) -> float | None:
        """B_noise = tr(Σ)/|G|², in samples; None while |G|² is not positive."""
        return self.grad_var / self.grad_sqr if self.grad_sqr > 0 else None

    def metrics(self) -> dict[str, float]:
        out = {"grad_sqr": self.grad_sqr, "grad_var": self.grad_var, "gns_batch": float(self.measured_at)}
        if (b := self.noise_scale) is not None:
            out["grad_noise_scale"] = b
        return out


class NoiseScaleEstimator:
    """The framework-free part: turns (|G_b|², |G_B|², b, B) measurements into smoothed
    estimates of |G|², tr(Σ) and their ratio. `beta` is the EMA's weight of the past."""

    def __init__(self, beta: float = 0.95) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta={beta} must be in [0, 1)")
        self.beta = beta
        self._sqr = 0.0
        self._var = 0.0
        self._weight = 0.0  # 1 - beta**n: the EMA's bias correction
        self._batch = 0
        self.samples = 0
        """Measurements taken so far."""

    def update(self, small_sqr: float, big_sqr: float, small_batch: float, big_batch: float) -> NoiseScale | None:
        """One measurement: the mean squared norm of gradients over `small_batch` samples and
        the squared norm of their average over `big_batch` samples, at the same parameters."""
        if not (0 < small_batch < big_batch):
            raise ValueError(f"need 0 < small batch ({small_batch}) < big batch ({big_batch})")
        if not (math.isfinite(small_sqr) and math.isfinite(big_sqr)):
            return self.value()  # a diverged step says nothing about the noise
        sqr = (big_batch * big_sqr - small_batch * small_sqr) / (big_batch - small_batch)
        var = (small_sqr - big_sqr) / (1.0 / small_batch - 1.0 / big_batch)
        b = self.beta
        self._sqr = b * self._sqr + (1 - b) * sqr
        self._var = b * self._var + (1 - b) * var
        self._weight = b * self._weight + (1 - b)
        self._batch = int(big_batch)
        self.samples += 1
        return self.value()

    def value(self) -> NoiseScale | None:
        if self._weight <= 0:
            return None
        return NoiseScale(self._sqr / self._weight, self._var / self._weight, self._batch)


class GradientNoiseScale:
    """Measures the gradient noise scale of a (DDP) model as it trains.

        model = DistributedDataParallel(net)
        gns = sdk.GradientNoiseScale(model, batch=el.batch, global_batch=el.global_batch)
        for step in ...:
            loss.backward()
            gns.update()                      # after backward, before zero_grad
            opt.step()
            sdk.report(step, loss=..., **gns.metrics())

    Attach it before the first backward (DDP takes a communication hook only then). A
    model that is not a DistributedDataParallel, or a group of one, is one replica: the
    previous step's gradient is the second batch (`single="consecutive"`) or nothing is
    measured (`single="off"`). `every=k` measures one step in k (a pair of steps with one
    replica), to spend even less.

    The hook it registers is DDP's default all-reduce with the measurement added, so a job
    that registers its own communication hook (compression, say) cannot use both: DDP takes
    one hook. With gradient accumulation (`no_sync`) the hook sees the accumulated gradient:
    `batch` is then the samples of all micro-batches of a step, and each micro-batch's loss
    must be divided by their number so that the sum is their mean.
    """

    def __init__(
        self,
        model: Any,
        batch: int,
        global_batch: int | None = None,
        *,
        beta: float = 0.95,
        every: int = 1,
        single: str = "consecutive",
    ) -> None:
        import torch
        import torch.distributed as dist

        if single not in SINGLE_MODES:
            raise ValueError(f"single={single!r}: expected one of {', '.join(SINGLE_MODES)}")
        if batch <= 0 or every <= 0:
            raise ValueError(f"batch ({batch}) and every ({every}) must be positive")
        self.estimator = NoiseScaleEstimator(beta)
        self.every = every
        self.single = single
        self._model = model
        self._params = [p for p in model.parameters() if p.requires_grad]
        ddp = hasattr(model, "register_comm_hook") and dist.is_available() and dist.is_initialized()
        self.world = dist.get_world_size(getattr(model, "process_group", None)) if ddp else 1
        self.batch = batch
        self.global_batch = global_batch if global_batch is not None else batch * self.world
        if self.world > 1 and self.global_batch <= batch:
            raise ValueError(f"global batch {self.global_batch} must exceed the replica's batch {batch}")
        self._calls = 0
        self._local: Any = None  # this replica's squared gradient norm, summed over DDP's buckets
        self._prev: Any = None  # one replica: the previous step's gradient, flattened
        if self.world > 1:

            def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
                return self._hook(bucket)

            model.register_comm_hook(None, hook)

    @property
    def available(self) -> bool:
        """Whether anything is measured: several replicas, or one with `single="consecutive"`."""
        return self.world > 1 or self.single == "consecutive"

    def _measuring(self) -> bool:
        return self._calls % self.every == self.every - 1

    def _hook(self, bucket: Any) -> Any:
        """DDP's all-reduce, with this replica's share of |g|² taken on the way (the bucket
        holds the local gradient until the all-reduce averages it in place)."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if self._measuring():
            sq = bucket.buffer().detach().float().pow(2).sum()
            self._local = sq if self._local is None else self._local + sq
        return allreduce_hook(self._model.process_group, bucket)

    def _grad_sqr(self) -> Any:
        import torch

        grads = [p.grad.detach().float().pow(2).sum() for p in self._params if p.grad is not None]
        return torch.stack(grads).sum() if grads else torch.zeros(())

    def update(self) -> NoiseScale | None:
        """Take this step's measurement (call it on every rank, after backward and before the
        gradients are cleared); returns the smoothed estimate so far."""
        measuring = self._measuring()
        self._calls += 1
        if self.world > 1:
            if measuring and self._local is not None:
                self._measure_replicas()
            self._local = None
        elif self.single == "consecutive":
            self._measure_consecutive()
        return self.estimator.value()

    def _measure_replicas(self) -> None:
        import torch.distributed as dist

        local = self._local.detach().clone()
        dist.all_reduce(local, group=getattr(self._model, "process_group", None))  # Σ over replicas of |g_i|²
        small = float(local.item()) / self.world
        self.estimator.update(small, float(self._grad_sqr().item()), self.batch, self.global_batch)

    def _measure_consecutive(self) -> None:
        import torch

        # Step n measures against step n−1 when n % every == every−1, so step n−1 keeps its
        # gradient (with every=1: each step measures and keeps).
        n = self._calls - 1
        measure = n % self.every == self.every - 1
        keep = (n + 1) % self.every == self.every - 1
        prev, self._prev = self._prev, None
        if not (measure or keep):
            return
        grads = [p.grad for p in self._params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.detach().float().reshape(-1) for g in grads])
        if measure and prev is not None and prev.shape == flat.shape:
            small = 0.5 * (float(flat.pow(2).sum()) + float(prev.pow(2).sum()))
            big = float((0.5 * (flat + prev)).pow(2).sum())
            self.estimator.update(small, big, self.batch, 2 * self.batch)
        if keep:
            self._prev = flat  # torch.cat made a copy: the next backward does not touch it

    def value(self) -> NoiseScale | None:
        return self.estimator.value()

    def metrics(self) -> dict[str, float]:
        """The estimate as `sdk.report` metrics (empty until the first measurement):
        grad_noise_scale, grad_sqr, grad_var, gns_batch."""
        v = self.estimator.value()
        return {} if v is None else v.metrics()
