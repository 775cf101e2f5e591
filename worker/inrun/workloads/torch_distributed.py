"""Distributed controls: data-parallel training on 2 to 8 local processes (gloo on CPU), and copies of it that
differ in exactly one setting of the distributed layer.

Run with ``distributed: {nproc: N}`` (the worker starts the ranks: :mod:`steady.worker.inrun.distributed`).
Each step's global batch of ``batch`` digits is split over the ranks by a ``DistributedSampler`` (``drop_last``),
so the samples one step sees are the same at any world size that divides ``batch`` (96: 2, 3, 4, 6, 8 ranks),
and every rank computes the mean loss of its share; the gradients are averaged over the ranks. The model is an
MLP whose hidden layers are registered in the iteration order of a Python ``set`` of their names (code that
iterates a set to build a model is common and harmless as long as every rank iterates it the same way), and
whose forward pass uses them in a fixed order. Its initial weights come from the run seed on rank 0 and are
broadcast to the other ranks by position (DDP does this; the manual mode too). Rank 0 logs ``loss`` (the global
batch's mean, all-reduced) every update and ``val_loss`` at the end.

``reduce``: ``ddp`` (default) — ``DistributedDataParallel`` with ``bucket_cap_mb`` (default 25: one bucket);
``manual`` — every rank all-gathers the flat float32 gradients and sums them in one order, rank 0 first.

``plant`` (each the one difference from the reference):

``none``
    the reference: repeats of one seed are bitwise identical at any world size.
``reduction_order``
    ``reduce=manual`` with the summation order drawn afresh at every update from fresh entropy on rank 0 (and
    broadcast, so all ranks agree): the same gradients, added in another order. Expected: ``distributed``
    (reduction). At 2 ranks it plants nothing (a + b == b + a bitwise).
``bucket``
    DDP's ``bucket_cap_mb`` is 0.004 on even repeats and 0.006 on odd ones, so the gradients are all-reduced in
    differently cut buckets (pytorch#30509). Expected: ``distributed`` (reduction), from 3 ranks on.
``hashseed``
    every rank but rank 0 restarts itself with a ``PYTHONHASHSEED`` of its own (from fresh entropy) before
    building the model, so it registers the hidden layers in another order and DDP's broadcast by position
    hands it rank 0's tensors under other names (huggingface/transformers #48162). Expected: ``distributed``
    (per-rank state).
``sampler``
    the ``DistributedSampler``'s seed is drawn from fresh entropy on rank 0 (and broadcast). Expected:
    ``data_order``.

Params: plant=none, reduce=ddp, bucket_cap_mb=25, steps=12, batch=96, dim=32, lr=0.1.
"""

from __future__ import annotations

import datetime
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from steady.worker.contract.distributed import BACKEND_ENV
from steady.worker.inrun import sdk
from steady.worker.inrun.frameworks.torch import module_digest
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("torch",)
PLANTS = ("none", "reduction_order", "bucket", "hashseed", "sampler")
HIDDEN = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")
BUCKETS_MB = (0.004, 0.006)
_RESTARTED = "STEADY_CONTROL_RANK_RESTARTED"


class Net(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(64, dim)
        for name in set(HIDDEN):  # registration order: the set's iteration order, i.e. PYTHONHASHSEED's
            self.add_module(name, torch.nn.Linear(dim, dim))
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        for name in HIDDEN:  # the computation itself uses a fixed order
            h = torch.tanh(getattr(self, name)(h))
        return self.head(h)


def _fresh_entropy() -> int:
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def _restart_with_own_hashseed() -> None:
    """The ``hashseed`` plant on ranks > 0: exec this process again with a PYTHONHASHSEED of its own."""
    env = dict(os.environ, PYTHONHASHSEED=str(_fresh_entropy() % 4294967295 + 1), **{_RESTARTED: "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def _from_rank0(value: int) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(t, 0)
    return int(t.item())


def _manual_all_reduce(params: list[torch.nn.Parameter], world: int, order: list[int]) -> None:
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    total = gathered[order[0]].clone()
    for r in order[1:]:
        total += gathered[r]
    total /= world
    offset = 0
    for g in grads:
        g.copy_(total[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def run(ctx: sdk.RunContext) -> dict:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        raise ValueError("torch_distributed runs on 2 or more processes: give the workload distributed: {nproc: N}")
    p = ctx.params
    plant = str(p.get("plant", "none"))
    if plant not in PLANTS:
        raise ValueError(f"unknown plant {plant!r}; known: {', '.join(PLANTS)}")
    if plant == "hashseed" and rank > 0 and os.environ.get(_RESTARTED) is None:
        _restart_with_own_hashseed()
    reduce = "manual" if plant == "reduction_order" else str(p.get("reduce", "ddp"))
    steps, batch, dim, lr = int(p.get("steps", 12)), int(p.get("batch", 96)), int(p.get("dim", 32)), float(p.get("lr", 0.1))
    if batch % world:
        raise ValueError(f"the global batch {batch} does not split over {world} ranks")
    dist.init_process_group(backend=os.environ.get(BACKEND_ENV) or "gloo", timeout=datetime.timedelta(seconds=120))
    try:
        return _train(ctx, rank, world, plant, reduce, steps, batch, dim, lr)
    finally:
        dist.destroy_process_group()


def _train(ctx: sdk.RunContext, rank: int, world: int, plant: str, reduce: str, steps: int, batch: int,
           dim: int, lr: float) -> dict:
    split = digits_split(0)
    torch.manual_seed(ctx.seed)
    model = Net(dim)
    if reduce == "ddp":
        cap = BUCKETS_MB[ctx.repeat % 2] if plant == "bucket" else float(ctx.params.get("bucket_cap_mb", 25))
        net: torch.nn.Module = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
    else:
        with torch.no_grad():
            for t in model.parameters():  # as DDP does: rank 0's weights, by position
                dist.broadcast(t, 0)
        net = model
    sdk.set_digest("initial_weights", module_digest(model))
    sampler_seed = _from_rank0(_fresh_entropy()) if plant == "sampler" else ctx.seed
    data = TensorDataset(torch.from_numpy(split.x_train), torch.from_numpy(split.y_train),
                         torch.arange(len(split.x_train)))
    sampler: DistributedSampler[int] = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True,
                                                          seed=sampler_seed, drop_last=True)
    loader = DataLoader(data, batch_size=batch // world, sampler=sampler, drop_last=True)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    fed = []
    step = 0
    for xb, yb, ib in loader:
        if step >= steps:
            break
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        if reduce == "manual":
            order = list(range(world))
            if plant == "reduction_order":
                perm = torch.from_numpy(np.random.default_rng(_fresh_entropy()).permutation(world))
                dist.broadcast(perm, 0)
                order = [int(i) for i in perm]
            _manual_all_reduce(params, world, order)
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            sdk.log(step, loss=float(total.item() / world))
        fed.append(ib.numpy())
        step += 1
    if rank == 0:
        sdk.log_data_order(np.concatenate(fed), epoch=0)
        with torch.no_grad():
            val = F.cross_entropy(model(torch.from_numpy(split.x_val)), torch.from_numpy(split.y_val)).item()
        sdk.log(step - 1, val_loss=val)
    sdk.set_digest("final_weights", module_digest(model))
    return {"train_steps": float(step)}
