"""PyTorch MLP fed by a DataLoader with ``num_workers=2`` that augments with NumPy noise.

The order comes from the loader's generator (seeded at seeded/strict) and the noise from the
workers' global NumPy RNG, seeded by ``worker_init_fn`` from that generator — the recipe for
reproducible multi-process data loading. Params: epochs=3, batch_size=64, lr=1e-3,
hidden=64, num_workers=2, noise=0.05.
"""

from __future__ import annotations

from steady.worker.inrun import sdk
from steady.worker.inrun.workloads.torch_mlp import train_mlp

FRAMEWORKS = ("torch",)


def run(ctx: sdk.RunContext) -> dict:
    return train_mlp(ctx, epochs=3, num_workers=ctx.param("num_workers", 2), noise=ctx.param("noise", 0.05))
