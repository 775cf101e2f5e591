"""A two-layer PyTorch MLP on digits. Params: epochs=5, batch_size=64, lr=1e-3, hidden=64."""

from __future__ import annotations

from typing import Any

from torch import nn

from steady.worker.inrun import sdk
from steady.worker.inrun.workloads._torch_common import train_classifier
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("torch",)


def train_mlp(ctx: sdk.RunContext, *, epochs: int, **loader: Any) -> dict:
    """The MLP on the recorded digits split; ``loader`` options go to ``train_classifier``."""
    split = digits_split(ctx.param("split_seed", 0))
    sdk.emit({"e": "info", "value": {"data_split": split.info}})
    hidden = ctx.param("hidden", 64)
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    return train_classifier(
        ctx, model, split,
        epochs=ctx.param("epochs", epochs), batch_size=ctx.param("batch_size", 64), lr=ctx.param("lr", 1e-3),
        **loader,
    )


def run(ctx: sdk.RunContext) -> dict:
    return train_mlp(ctx, epochs=5)
