"""The shared PyTorch classification loop of the torch_* workloads."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from steady.worker.inrun import sdk
from steady.worker.inrun.frameworks.torch import (Adam, data_generator, device, module_digest, optimizer_digest,
                                                 seed_worker)
from steady.worker.inrun.sdk import RunContext
from steady.worker.inrun.workloads.data import Split


class IndexedDigits(Dataset):
    """Yields (x, y, index); with ``noise`` > 0 adds Gaussian noise drawn from the global
    NumPy RNG, which is what ``worker_init_fn`` must seed in DataLoader workers."""

    def __init__(self, x: np.ndarray, y: np.ndarray, noise: float = 0.0) -> None:
        self.x, self.y, self.noise = x, y, noise

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        x = self.x[i]
        if self.noise:
            x = (x + np.random.normal(0.0, self.noise, size=x.shape)).astype(np.float32)
        return torch.from_numpy(np.asarray(x)), int(self.y[i]), i


def train_classifier(
    ctx: RunContext,
    model: torch.nn.Module,
    split: Split,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    num_workers: int = 0,
    noise: float = 0.0,
) -> dict[str, Any]:
    dev = device(ctx.device)
    model.to(dev)
    sdk.set_digest("initial_weights", module_digest(model))
    generator = data_generator(ctx.data_seed)
    loader = DataLoader(
        IndexedDigits(split.x_train, split.y_train, noise),
        batch_size=batch_size,
        shuffle=True,
        generator=generator,
        num_workers=num_workers,
        worker_init_fn=seed_worker if num_workers else None,
        persistent_workers=num_workers > 0,
    )
    x_val = torch.from_numpy(split.x_val).to(dev)
    y_val = torch.from_numpy(split.y_val).to(dev)
    optimizer = Adam(model.parameters(), lr=lr)
    step = 0
    for epoch in range(epochs):
        model.train()
        fed: list[np.ndarray] = []
        for xb, yb, ib in loader:
            t0 = time.perf_counter()
            xb, yb = xb.to(dev), yb.to(dev)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            value = loss.item()  # synchronises on CUDA, so the step time is real
            sdk.log(step, loss=value, step_time=time.perf_counter() - t0)
            fed.append(ib.numpy())
            step += 1
        sdk.log_data_order(np.concatenate(fed), epoch=epoch)
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = F.cross_entropy(logits, y_val).item()
            val_acc = (logits.argmax(1) == y_val).float().mean().item()
        sdk.log(step - 1, val_loss=val_loss, val_acc=val_acc)
    sdk.set_digest("final_weights", module_digest(model))
    sdk.set_digest("optimizer_state", optimizer_digest(optimizer))
    return {"train_steps": float(step)}
