"""A small PyTorch CNN on the 8x8 digits. Params: epochs=3, batch_size=64, lr=2e-3, channels=8."""

from __future__ import annotations

from torch import nn

from steady.worker.inrun import sdk
from steady.worker.inrun.workloads._torch_common import train_classifier
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("torch",)


def run(ctx: sdk.RunContext) -> dict:
    split = digits_split(ctx.param("split_seed", 0))
    sdk.emit({"e": "info", "value": {"data_split": split.info}})
    c = ctx.param("channels", 8)
    model = nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(2 * c * 4 * 4, 10),
    )
    return train_classifier(
        ctx, model, split,
        epochs=ctx.param("epochs", 3), batch_size=ctx.param("batch_size", 64), lr=ctx.param("lr", 2e-3),
    )
