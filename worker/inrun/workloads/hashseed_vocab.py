"""A bag-of-words classifier whose vocabulary comes from iterating a Python ``set`` of strings.

Each digit becomes string tokens ``"p<pixel>=<intensity>"``; the vocabulary is
``list(set(all tokens))`` so the embedding row each token gets depends on string hashing,
i.e. on ``PYTHONHASHSEED``. Everything else — model initialisation and batch order — is
seeded from the run seed *at every level* (its own generators), so the only thing that
varies at ``none`` is the hash seed: the runs differ across processes at ``none`` and are
identical at ``seeded``. The vocabulary is part of the initial/final weight digests
(the model is token -> vector). Params: epochs=3, batch_size=64, lr=5e-3, dim=16.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from steady.worker.inrun import sdk
from steady.worker.inrun.frameworks.torch import Adam, optimizer_digest
from steady.worker.contract.digests import state_digest
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("torch",)


def _tokens(x: np.ndarray) -> list[list[str]]:
    raw = np.rint(x * 16).astype(int)
    return [[f"p{p}={v}" for p, v in enumerate(row)] for row in raw]


def run(ctx: sdk.RunContext) -> dict:
    split = digits_split(ctx.param("split_seed", 0))
    train_tokens, val_tokens = _tokens(split.x_train), _tokens(split.x_val)
    vocab = list({tok for doc in train_tokens + val_tokens for tok in doc})  # hash order
    index = {tok: i for i, tok in enumerate(vocab)}
    sdk.emit({"e": "info", "value": {"data_split": split.info, "vocab_size": len(vocab),
                                      "vocab_order_sha256": state_digest({"vocab": vocab})}})
    x_train = torch.tensor([[index[t] for t in doc] for doc in train_tokens])
    x_val = torch.tensor([[index[t] for t in doc] for doc in val_tokens])
    y_train, y_val = torch.from_numpy(split.y_train), torch.from_numpy(split.y_val)

    init = torch.Generator().manual_seed(ctx.seed)  # fixed at every level, on purpose
    dim = ctx.param("dim", 16)
    embedding = torch.nn.Parameter(torch.randn(len(vocab), dim, generator=init))
    head_w = torch.nn.Parameter(torch.randn(10, dim, generator=init) / dim**0.5)
    head_b = torch.nn.Parameter(torch.zeros(10))
    params = {"embedding": embedding, "head.weight": head_w, "head.bias": head_b}

    def digest() -> str:
        entries: dict[str, object] = {k: v.detach().numpy() for k, v in params.items()}
        entries["vocab"] = vocab
        return state_digest(entries)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.embedding(x, embedding).mean(1) @ head_w.T + head_b

    sdk.set_digest("initial_weights", digest())
    optimizer = Adam(params.values(), lr=ctx.param("lr", 5e-3))
    order_gen = torch.Generator().manual_seed(ctx.seed + 1)
    batch_size, step = ctx.param("batch_size", 64), 0
    for epoch in range(ctx.param("epochs", 3)):
        order = torch.randperm(len(x_train), generator=order_gen)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(forward(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            sdk.log(step, loss=loss.item(), step_time=time.perf_counter() - t0)
            step += 1
        sdk.log_data_order(order.numpy(), epoch=epoch)
        with torch.no_grad():
            logits = forward(x_val)
            sdk.log(step - 1, val_loss=F.cross_entropy(logits, y_val).item(),
                    val_acc=(logits.argmax(1) == y_val).float().mean().item())
    sdk.set_digest("final_weights", digest())
    sdk.set_digest("optimizer_state", optimizer_digest(optimizer))
    return {"train_steps": float(step)}
