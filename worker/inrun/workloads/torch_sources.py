"""A sources study's built-in model: a PyTorch MLP on digits whose every source of variance has its own seed.

Params: epochs=30, batch_size=32, lr=0.2, momentum=0.9 (SGD: at this rate training is chaotic enough that a
difference in the last bit grows to the full band, as Summers & Dinneen found for ResNets; at lr=0.1 it stays
below 1e-7; at lr=0.3, an earlier default, the final accuracies are heavy-tailed, a few runs far from the
rest, which no equivalence test can decide in a CPU budget: docs/sources.md), hidden=64, dropout=0.2,
noise=0.05 (Gaussian input augmentation), eval_every=15 (steps between evaluations of ``val_loss``/``val_acc``
on the fixed validation split, the series a one-ULP change is followed along: 90 evaluations of 1,350 steps).
Each source reads ``ctx.seed_for(source)``:

- ``init``: the generator the weights are drawn from;
- ``data``: the shuffle of each epoch;
- ``dropout``: the dropout masks and the augmentation noise;
- ``numerics``: the order of the samples inside each batch, drawn after masks and noise are attached to
  their samples, so the loss is the same sum and only the floating-point reduction order changes (on a GPU,
  kernel nondeterminism adds to it; on a CPU this is the kernel/numerics source);
- ``ulp``: the index of the one weight moved by one ULP (``nextafter`` towards +∞) before step 0.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from steady.worker.inrun import sdk
from steady.worker.inrun.frameworks.torch import data_generator as _generator
from steady.worker.inrun.frameworks.torch import module_digest
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("torch",)


class _Mlp(nn.Module):
    def __init__(self, hidden: int, g: torch.Generator) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, hidden), nn.Linear(hidden, 10)
        with torch.no_grad():
            for layer in (self.fc1, self.fc2):
                bound = 1.0 / np.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=g)
                layer.bias.uniform_(-bound, bound, generator=g)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = F.relu(self.fc1(x))
        return self.fc2(h * mask if mask is not None else h)


def perturb_one_weight(model: nn.Module, index: int) -> tuple[str, int]:
    """Move the weight at flat ``index`` (modulo the parameter count) by one ULP towards +∞; its name and index."""
    params = list(model.named_parameters())
    total = sum(p.numel() for _, p in params)
    k = index % total
    for name, p in params:
        if k < p.numel():
            with torch.no_grad():
                flat = p.view(-1)
                flat[k] = torch.nextafter(flat[k], torch.tensor(float("inf"), dtype=flat.dtype))
            return name, k
        k -= p.numel()
    raise AssertionError("unreachable")


def run(ctx: sdk.RunContext) -> dict[str, Any]:
    torch.set_num_threads(max(1, ctx.threads))
    split = digits_split(ctx.param("split_seed", 0))
    hidden, p_drop, noise = ctx.param("hidden", 64), ctx.param("dropout", 0.2), ctx.param("noise", 0.05)
    epochs, batch, lr = ctx.param("epochs", 30), ctx.param("batch_size", 32), ctx.param("lr", 0.2)
    mu = ctx.param("momentum", 0.9)
    eval_every = max(1, ctx.param("eval_every", 15))
    model = _Mlp(hidden, _generator(ctx.seed_for("init")))
    ulp = ctx.seed_for("ulp")
    if ulp is not None:
        name, k = perturb_one_weight(model, ulp)
        sdk.emit({"e": "info", "value": {"ulp_perturbed": f"{name}[{k}]"}})
    sdk.set_digest("initial_weights", module_digest(model))
    g_data, g_drop, g_num = (_generator(ctx.seed_for(s)) for s in ("data", "dropout", "numerics"))
    x_tr, y_tr = torch.from_numpy(split.x_train), torch.from_numpy(split.y_train)
    x_val, y_val = torch.from_numpy(split.x_val), torch.from_numpy(split.y_val)
    params = list(model.parameters())
    momentum = [torch.zeros_like(p) for p in params]  # SGD with momentum by hand: torch.optim imports ~1 s more
    n, step = len(x_tr), 0

    def evaluate() -> None:
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            sdk.log(step, val_loss=F.cross_entropy(logits, y_val).item(),
                    val_acc=100.0 * (logits.argmax(1) == y_val).float().mean().item())
        model.train()

    evaluate()
    for epoch in range(epochs):
        order = torch.randperm(n, generator=g_data)
        sdk.log_data_order(order.numpy(), epoch=epoch)
        for start in range(0, n, batch):
            t0 = time.perf_counter()
            idx = order[start:start + batch]
            xb, yb = x_tr[idx], y_tr[idx]
            xb = xb + noise * torch.randn(xb.shape, generator=g_drop)
            mask = (torch.rand((len(idx), hidden), generator=g_drop) >= p_drop).float() / (1.0 - p_drop)
            within = torch.randperm(len(idx), generator=g_num)
            xb, yb, mask = xb[within], yb[within], mask[within]
            loss = F.cross_entropy(model(xb, mask), yb)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, m, g in zip(params, momentum, grads):
                    m.mul_(mu).add_(g)
                    p.sub_(lr * m)
            step += 1
            sdk.log(step, loss=loss.item(), step_time=time.perf_counter() - t0)
            if step % eval_every == 0:
                evaluate()
    if step % eval_every:
        evaluate()
    sdk.set_digest("final_weights", module_digest(model))
    sdk.set_digest("optimizer_state", sdk.digest_model({f"m{i}": m.numpy() for i, m in enumerate(momentum)}))
    return {"train_steps": float(step)}
