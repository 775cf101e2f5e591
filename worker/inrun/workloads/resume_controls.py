"""A training script with a resume path, and planted omissions in it: the resume check's controls.

``python -m steady.worker.inrun.workloads.resume_controls --checkpoint-dir DIR --seed N [--omit PIECE]``
trains a small MLP (dropout, Adam, a StepLR schedule) on a synthetic task for ``--steps`` updates,
``--batches`` per epoch, from a DataLoader with ``--workers`` worker processes (default 2) whose
dataset adds noise from the worker's torch RNG, and with noise from Python's ``random`` and NumPy's
global RNG in the training loop. After every update it saves a checkpoint with everything a
faithful resume needs: weights, optimizer, scheduler, step, the Python, NumPy and torch RNG states,
and the loader generator's state at the start of the current epoch (from which the epoch's shuffle
and its workers' seeds are drawn again; the batches already used are skipped). When the folder holds
a checkpoint it resumes from it.

With ``--accumulate A`` each update sums the gradients of ``A`` loader batches (micro-batches), and a
checkpoint after each micro-batch also holds the partial ``.grad`` and the micro-batch count, so a stop in
the middle of an accumulation step resumes there.

``--omit PIECE`` forgets one piece when resuming (:data:`OMISSIONS`); the resume check must name it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

# the piece --omit forgets -> the component the resume check must name (steady.worker.contract.resume)
OMISSIONS = {
    "weights": "parameters",
    "optimizer": "optimizer_state",
    "scheduler": "lr_scheduler",
    "step": "step_counter",
    "python_rng": "python_rng",
    "numpy_rng": "numpy_rng",
    "torch_rng": "torch_rng",
    "loader_cursor": "data",
    "loader_generator": "loader_worker_seeds",
    "grad_scaler": "grad_scaler",  # with --grad-scaler
    "accumulated_grads": "accumulated_gradients",  # with --accumulate: the partial .grad is not saved back
    "micro_batch": "micro_batch_counter",  # with --accumulate: the accumulation step restarts at its first micro-batch
}


class NoisyTask(Dataset):
    """Inputs and targets of a fixed linear task; each item gets noise from the loader worker's torch RNG."""

    def __init__(self, n: int = 96, dim: int = 8) -> None:
        g = torch.Generator().manual_seed(12345)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x @ torch.randn(dim, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.05 * torch.randn(self.x.shape[1]), self.y[i]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batches", type=int, default=4, help="batches per epoch")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--omit", choices=sorted(OMISSIONS), default=None)
    p.add_argument("--exit-on-term", action="store_true", help="a SIGTERM handler that exits with status 0")
    p.add_argument("--grad-scaler", action="store_true",
                   help="scale the loss with a torch.amp.GradScaler (growing every 2 updates), saved with the rest")
    p.add_argument("--accumulate", type=int, default=1,
                   help="micro-batches (loader batches) per update; a checkpoint after each, with the partial .grad")
    p.add_argument("--update-checkpoints-only", action="store_true",
                   help="with --accumulate: no checkpoint between micro-batches (a resume redoes the accumulation step)")
    args = p.parse_args(argv)
    if args.exit_on_term:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    data = NoisyTask()
    batch = len(data) // args.batches
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2, enabled=args.grad_scaler)
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, num_workers=args.workers,
                        generator=generator)
    path = os.path.join(args.checkpoint_dir, "last.pt")
    step, micro, cursor, epoch_state = 0, 0, 0, generator.get_state()
    keep = False  # a partial gradient restored: the first micro-batch after the resume adds to it
    if os.path.exists(path):
        ckpt = torch.load(path, weights_only=False)
        omit = args.omit
        if omit != "weights":
            model.load_state_dict(ckpt["model"])
        if omit != "optimizer":
            optimizer.load_state_dict(ckpt["optimizer"])
        if omit != "scheduler":
            scheduler.load_state_dict(ckpt["scheduler"])
        if omit != "step":
            step = ckpt["step"]
        if omit != "python_rng":
            random.setstate(ckpt["python_rng"])
        if omit != "numpy_rng":
            np.random.set_state(ckpt["numpy_rng"])
        if omit != "torch_rng":
            torch.set_rng_state(ckpt["torch_rng"])
        if omit != "loader_generator":
            epoch_state = ckpt["epoch_generator"]
        if omit != "grad_scaler" and "scaler" in ckpt:
            scaler.load_state_dict(ckpt["scaler"])
        if args.accumulate > 1:
            if omit != "micro_batch":
                micro = ckpt["micro"]
            if omit != "accumulated_grads" and ckpt["micro"]:
                for param, grad in zip(model.parameters(), ckpt["grads"]):
                    param.grad = grad
                keep = True
        cursor = 0 if omit == "loader_cursor" else (step * args.accumulate + ckpt.get("micro", 0)) % args.batches
    generator.set_state(epoch_state)
    while step < args.steps:
        epoch_state = generator.get_state()  # the epoch's shuffle and worker seeds are drawn from here
        for x, y in itertools.islice(loader, cursor, None):
            scale = 1.0 + 0.1 * random.random()
            x = x + torch.from_numpy(np.random.normal(0.0, 0.01, size=tuple(x.shape))).float()
            loss = ((model(x * scale) - y) ** 2).mean()
            if micro == 0 and not keep:
                optimizer.zero_grad()
            keep = False
            # a power of two: the unscaled gradients are the same bits
            scaler.scale(loss if args.accumulate == 1 else loss / args.accumulate).backward()
            micro += 1
            if micro < args.accumulate:  # mid-accumulation: the partial gradient and the count are state too
                if args.update_checkpoints_only:
                    continue
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "step": step,
                            "micro": micro, "grads": [q.grad for q in model.parameters()],
                            "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
                            "torch_rng": torch.get_rng_state(), "epoch_generator": epoch_state}, path + ".tmp")
                os.replace(path + ".tmp", path)
                continue
            micro = 0
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            print(f"step {step} loss {loss.item():.6f}", flush=True)
            # at the end of an epoch a resume starts the next one, whose shuffle is drawn from the state now
            resume_epoch = generator.get_state() if step * args.accumulate % args.batches == 0 else epoch_state
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "step": step,
                        "micro": 0, "python_rng": random.getstate(),
                        "numpy_rng": np.random.get_state(), "torch_rng": torch.get_rng_state(),
                        "epoch_generator": resume_epoch}, path + ".tmp")
            os.replace(path + ".tmp", path)
            if step >= args.steps:
                break
        cursor = 0


if __name__ == "__main__":
    main()
