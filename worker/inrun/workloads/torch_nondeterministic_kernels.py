"""A bag-of-pixel-tokens classifier built on kernels whose accumulation order is not fixed.

Every digit becomes 64 tokens (pixel position x intensity, 1,088 distinct); a sample is the
sum of its tokens' embedding rows. Each step accumulates ``batch_size x 64`` rows of width
``dim`` into ``batch_size`` sums with heavily repeated destination indices:

* on CPU: ``index_put_(..., accumulate=True)`` in the forward pass and the backward of
  advanced indexing ``E[tokens]`` (repeated indices). With 2+ threads both accumulate in
  an order that varies run to run, so the logged loss varies under ``seeded``;
  ``torch.use_deterministic_algorithms(True)`` (``strict``) switches both to deterministic
  sort-based kernels. (``index_add_``, ``scatter_add_``, ``sum`` and matmul do not vary on CPU.)
* on CUDA: ``index_add_`` and ``scatter_add_`` (atomic adds) in the forward pass and the
  embedding backward; all have deterministic implementations under ``strict``.

Logs ``loss`` and ``param_sum`` (the float64 sum of all weights) every step.
Params: steps=40, batch_size=512, dim=64, lr=0.05.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from steady.worker.inrun import sdk
from steady.worker.inrun.frameworks.torch import SGD, data_generator, device, module_digest, optimizer_digest
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("torch",)
LEVELS = 17  # raw digits intensities are 0..16


_PERMS: dict[int, torch.Tensor] = {}


def _interleave(n: int) -> torch.Tensor:
    if n not in _PERMS:
        _PERMS[n] = torch.randperm(n, generator=torch.Generator().manual_seed(20240229))
    return _PERMS[n]


class TokenBag(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, classes: int = 10) -> None:
        super().__init__()
        self.embedding = torch.nn.Parameter(torch.randn(vocab, dim) * 0.5)
        self.head = torch.nn.Linear(dim + 1, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, t = tokens.shape
        flat = tokens.reshape(-1)
        sample = torch.arange(b, device=tokens.device).repeat_interleave(t)
        if tokens.is_cuda:
            rows = F.embedding(flat, self.embedding)
            pooled = torch.zeros(b, rows.shape[1], device=rows.device).index_add_(0, sample, rows)
            energy = torch.zeros(b, device=rows.device).scatter_add_(0, sample, rows.square().sum(1))
        else:
            # Interleave the samples (a fixed permutation, not the run's RNG): sorted destination
            # indices would give each thread its own rows, and only the rows that both threads
            # add into are summed in a timing-dependent order.
            perm = _interleave(flat.numel())
            flat, sample = flat[perm], sample[perm]
            rows = self.embedding[flat]  # backward: accumulate into repeated rows
            pooled = torch.zeros(b, rows.shape[1]).index_put((sample,), rows, accumulate=True)
            energy = torch.zeros(b).index_put((sample,), rows.square().sum(1), accumulate=True)
        features = torch.cat([pooled / t, (energy / t).log1p().unsqueeze(1)], dim=1)
        return self.head(features)


def run(ctx: sdk.RunContext) -> dict:
    split = digits_split(ctx.param("split_seed", 0))
    sdk.emit({"e": "info", "value": {"data_split": split.info}})
    dev = device(ctx.device)
    positions = np.arange(64) * LEVELS

    def tokens(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(positions + np.rint(x * 16).astype(np.int64)).to(dev)

    x_train, x_val = tokens(split.x_train), tokens(split.x_val)
    y_train = torch.from_numpy(split.y_train).to(dev)
    y_val = torch.from_numpy(split.y_val).to(dev)
    model = TokenBag(64 * LEVELS, ctx.param("dim", 64)).to(dev)
    sdk.set_digest("initial_weights", module_digest(model))
    optimizer = SGD(model.parameters(), lr=ctx.param("lr", 0.05), momentum=0.9)
    steps, batch_size = ctx.param("steps", 40), ctx.param("batch_size", 512)
    generator = data_generator(ctx.data_seed)
    n = len(x_train)
    steps_per_epoch = max(1, n // batch_size)
    epoch, order = 0, torch.randperm(n, generator=generator)
    fed: list[np.ndarray] = []
    for step in range(steps):
        k = step % steps_per_epoch
        if k == 0 and step:
            sdk.log_data_order(np.concatenate(fed), epoch=epoch)
            epoch, order, fed = epoch + 1, torch.randperm(n, generator=generator), []
        idx = order[k * batch_size:(k + 1) * batch_size]
        fed.append(idx.numpy())
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x_train[idx.to(dev)]), y_train[idx.to(dev)])
        loss.backward()
        optimizer.step()
        value = loss.item()
        elapsed = time.perf_counter() - t0
        # The float64 sum of every weight: a one-ULP change anywhere in the model shows here at
        # once, where the float32 loss may round it away for a few steps.
        with torch.no_grad():
            param_sum = sum(float(p.double().sum()) for p in model.parameters())
        sdk.log(step, loss=value, param_sum=param_sum, step_time=elapsed)
        if k == steps_per_epoch - 1 or step == steps - 1:
            with torch.no_grad():
                logits = model(x_val)
                sdk.log(step, val_loss=F.cross_entropy(logits, y_val).item(),
                        val_acc=(logits.argmax(1) == y_val).float().mean().item())
    sdk.log_data_order(np.concatenate(fed), epoch=epoch)
    sdk.set_digest("final_weights", module_digest(model))
    sdk.set_digest("optimizer_state", optimizer_digest(optimizer))
    return {"train_steps": float(steps)}
