"""Planted controls: one reference training, and copies of it that differ in exactly one source.

The reference is a bag-of-pixel-tokens classifier on digits (as in
``torch_nondeterministic_kernels``) in which every random draw comes from its own generator
seeded from the run seed *at every determinism level*: initial weights, the shuffle, the
dropout masks. So repeats of one seed are bitwise identical at ``none``, ``seeded`` and
``strict`` alike, on one stack, and a planted source is the only thing that can make them
differ. ``plant`` chooses it:

``none``
    the reference. Several plants joined by ``+`` (``data_order+kernels``) overlap.
``init``
    initial weights from a generator seeded from fresh entropy (data order, dropout and
    kernels fixed). Expected source: ``seeding``.
``data_order``
    the same initial weights, but the order the samples are fed in varies; ``order`` says how:
    ``shuffle`` (default) — a shuffle whose generator is seeded from fresh entropy;
    ``hashseed`` — the epoch walks a Python ``set`` of string sample ids, so its order
    follows ``PYTHONHASHSEED`` (plants only at level ``none``; ``seeded`` fixes it);
    ``workers`` — a sharded ``IterableDataset`` read by two DataLoader workers, each shuffling
    its shard with its worker seed, which derives from an unseeded loader generator.
    Expected source: ``data_order``.
``kernels``
    the per-sample pooling accumulates with ``index_put_(accumulate=True)`` on CPU and
    ``index_add_``/``scatter_add_`` on CUDA, whose accumulation order varies run to run with
    2+ threads / on a GPU; ``strict`` switches them to deterministic kernels. Expected
    source: ``numerics`` at ``seeded``; identical at ``strict``.
``dropout``
    dropout masks from a generator seeded from fresh entropy (weights and order fixed).
    The initial-weights digest covers the state of every generator the training draws from
    (here the dropout generator) next to the weights — the run's whole initial state — so
    an unseeded dropout generator is reported as ``seeding``: it is fixed by seeding it.

The stack controls run the reference itself on two stacks: the same spec at two thread
counts (the L2 penalty's float32 sum over the embedding is split per thread, so its rounding
follows the thread count) or under two NumPy releases (the input scale is a float32
``numpy.sum`` over the log-compressed training set, whose summation changed between
releases). Expected source: ``stack``.

Logs ``loss`` and ``param_sum`` (float64 sum of every weight, so a one-ULP change shows at
once) every step and ``val_loss``/``val_acc`` at the end of each epoch.
Params: plant=none, order=shuffle, steps=24, batch_size=256, dim=64, lr=0.5, dropout=0.2,
weight_decay=1e-4.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from steady.worker.inrun import sdk
from steady.worker.contract.digests import state_digest
from steady.worker.inrun.frameworks.torch import SGD, device, optimizer_digest
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("torch",)
PLANTS = ("none", "init", "data_order", "kernels", "dropout")
ORDERS = ("shuffle", "hashseed", "workers")
LEVELS = 17  # raw digits intensities are 0..16
TOKENS = 64


def _generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    if seed is None:
        g.seed()  # fresh entropy: the planted source
    else:
        g.manual_seed(seed)
    return g


def features(x: np.ndarray) -> np.ndarray:
    """Log-compressed intensities divided by their mean over the whole array; the mean is a
    float32 ``numpy.sum``, so its last bit follows NumPy's summation code."""
    z = np.log1p(x * np.float32(3.7))
    return (z / (np.sum(z) / np.float32(z.size))).astype(np.float32)


class _Interleave:
    """A fixed permutation (not the run's RNG) of the flattened (sample, token) rows, so that
    the threads of the CPU accumulation write into the same destinations."""

    def __init__(self) -> None:
        self.perms: dict[int, torch.Tensor] = {}

    def __call__(self, n: int) -> torch.Tensor:
        if n not in self.perms:
            self.perms[n] = torch.randperm(n, generator=torch.Generator().manual_seed(20240229))
        return self.perms[n]


class _ShardedOrder(torch.utils.data.IterableDataset):
    """Sample ids split in two shards, each shuffled in its DataLoader worker with that
    worker's seed (derived by PyTorch from the loader's generator)."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        shard = self.ids[info.id::info.num_workers] if info else self.ids
        g = torch.Generator().manual_seed(info.seed % 2**63 if info else 0)
        return iter(shard[torch.randperm(len(shard), generator=g).numpy()].tolist())


def _epoch_order(n: int, *, planted: bool, variant: str, gen: torch.Generator) -> np.ndarray:
    if not planted or variant == "shuffle":
        return torch.randperm(n, generator=gen).numpy()
    if variant == "hashseed":
        base = torch.randperm(n, generator=gen).numpy()  # the reference order, then bucketed by hash
        keys = {f"sample-{i}" for i in range(n)}
        rank = {int(k.split("-")[1]): r for r, k in enumerate(keys)}
        # blocks of 64 samples in seeded order, and within each block the set's iteration order
        blocks = [sorted(base[s:s + 64], key=rank.__getitem__) for s in range(0, n, 64)]
        return np.concatenate(blocks)
    loader = torch.utils.data.DataLoader(
        _ShardedOrder(np.arange(n)), batch_size=None, num_workers=2, generator=_generator(None))
    return np.fromiter((int(i) for i in loader), dtype=np.int64, count=n)


def run(ctx: sdk.RunContext) -> dict:
    plant, variant = ctx.param("plant", "none"), ctx.param("order", "shuffle")
    plants = set(plant.split("+")) - {"none"}
    if plants - set(PLANTS):
        raise ValueError(f"unknown plant {plant!r}; expected one of {PLANTS}, or several joined by '+'")
    if variant not in ORDERS:
        raise ValueError(f"unknown order {variant!r}; expected one of {ORDERS}")
    split = digits_split(ctx.param("split_seed", 0))
    sdk.emit({"e": "info", "value": {"data_split": split.info, "plant": plant,
                                      "order": variant if "data_order" in plants else "shuffle"}})
    dev = device(ctx.device)
    positions = np.arange(TOKENS) * LEVELS

    def tokens(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(positions + np.rint(x * 16).astype(np.int64)).to(dev)

    x_train, x_val = tokens(split.x_train), tokens(split.x_val)
    scale = features(np.concatenate([split.x_train, split.x_val]))
    w_train = torch.from_numpy(scale[:len(split.x_train)]).to(dev)
    w_val = torch.from_numpy(scale[len(split.x_train):]).to(dev)
    y_train = torch.from_numpy(split.y_train).to(dev)
    y_val = torch.from_numpy(split.y_val).to(dev)

    seed = ctx.seed
    init = _generator(None if "init" in plants else seed)
    order_gen = _generator(None if "data_order" in plants and variant == "shuffle" else seed + 1)
    dropout_gen = _generator(None if "dropout" in plants else seed + 2)
    dim, p_drop = ctx.param("dim", 64), ctx.param("dropout", 0.2)
    embedding = torch.nn.Parameter((torch.randn(TOKENS * LEVELS, dim, generator=init) * 0.5).to(dev))
    head_w = torch.nn.Parameter((torch.randn(10, dim, generator=init) / dim**0.5).to(dev))
    head_b = torch.nn.Parameter(torch.zeros(10, device=dev))
    params = {"embedding": embedding, "head.weight": head_w, "head.bias": head_b}
    interleave = _Interleave()

    def pool(tok: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        b = tok.shape[0]
        if "kernels" not in plants:
            return (F.embedding(tok, embedding) * weight.unsqueeze(-1)).sum(1)
        flat = tok.reshape(-1)
        sample = torch.arange(b, device=tok.device).repeat_interleave(TOKENS)
        w = weight.reshape(-1, 1)
        if tok.is_cuda:
            rows = F.embedding(flat, embedding) * w
            return torch.zeros(b, dim, device=tok.device).index_add_(0, sample, rows)
        perm = interleave(flat.numel())
        rows = embedding[flat[perm]] * w[perm]  # backward: accumulate into repeated rows
        return torch.zeros(b, dim).index_put((sample[perm],), rows, accumulate=True)

    def forward(tok: torch.Tensor, weight: torch.Tensor, train: bool) -> torch.Tensor:
        h = pool(tok, weight) / TOKENS
        if train and p_drop > 0:
            keep = torch.rand(h.shape, generator=dropout_gen) >= p_drop
            h = h * keep.to(h.device, h.dtype) / (1 - p_drop)
        return h @ head_w.T + head_b

    def initial_digest() -> str:
        entries: dict = {k: v.detach().cpu().numpy() for k, v in params.items()}
        entries["rng.dropout"] = dropout_gen.get_state().numpy()
        return state_digest(entries)

    def weights_digest() -> str:
        return state_digest({k: v.detach().cpu().numpy() for k, v in params.items()})

    sdk.set_digest("initial_weights", initial_digest())
    optimizer = SGD(params.values(), lr=ctx.param("lr", 0.5), momentum=0.9)
    wd = ctx.param("weight_decay", 1e-4)
    steps, batch_size = ctx.param("steps", 24), ctx.param("batch_size", 256)
    n = len(x_train)
    per_epoch = max(1, n // batch_size)
    epoch = 0
    order = _epoch_order(n, planted="data_order" in plants, variant=variant, gen=order_gen)
    for step in range(steps):
        k = step % per_epoch
        if k == 0 and step:
            epoch += 1
            order = _epoch_order(n, planted="data_order" in plants, variant=variant, gen=order_gen)
        idx = torch.from_numpy(order[k * batch_size:(k + 1) * batch_size]).to(dev)
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(x_train[idx], w_train[idx], True), y_train[idx])
        # the L2 penalty: a float32 sum over the whole embedding, split per intra-op thread
        loss = loss + wd * embedding.square().sum()
        loss.backward()
        optimizer.step()
        value = loss.item()
        elapsed = time.perf_counter() - t0
        with torch.no_grad():
            param_sum = sum(float(p.double().sum()) for p in params.values())
        sdk.log(step, loss=value, param_sum=param_sum, step_time=elapsed)
        if k == per_epoch - 1 or step == steps - 1:
            sdk.log_data_order(order[:(k + 1) * batch_size], epoch=epoch)
            with torch.no_grad():
                logits = forward(x_val, w_val, False)
                sdk.log(step, val_loss=F.cross_entropy(logits, y_val).item(),
                        val_acc=(logits.argmax(1) == y_val).float().mean().item())
    sdk.set_digest("final_weights", weights_digest())
    sdk.set_digest("optimizer_state", optimizer_digest(optimizer))
    return {"train_steps": float(steps)}
