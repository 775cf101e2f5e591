"""PyTorch adapter: determinism switches, digests, data-loader seeding, fingerprint."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from steady.worker.contract.digests import state_digest


def apply_determinism(level: str, seed: int, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # already set (parallel work ran before); keep going
        pass
    applied: dict[str, Any] = {}
    if level in ("seeded", "strict"):
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
        applied["framework_seeded"] = True
        applied["torch_manual_seed"] = seed
    if level == "strict":
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    applied.update(
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        torch_threads=torch.get_num_threads(),
        torch_interop_threads=torch.get_num_interop_threads(),
    )
    return applied


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()  # digest the raw bits
    return t.numpy()


def module_digest(model: Any) -> str:
    """Digest of a module's ``state_dict()`` (or a state dict): parameters and buffers."""
    sd = model.state_dict() if hasattr(model, "state_dict") else model
    return state_digest({k: _to_numpy(v) if isinstance(v, torch.Tensor) else v for k, v in sd.items()})


def optimizer_digest(optimizer: torch.optim.Optimizer) -> str:
    """Digest of ``optimizer.state_dict()``: per-parameter state tensors and the param groups."""
    sd = optimizer.state_dict()
    entries: dict[str, Any] = {}
    for pid, state in sd["state"].items():
        for name, value in state.items():
            key = f"state.{pid:06d}.{name}" if isinstance(pid, int) else f"state.{pid}.{name}"
            entries[key] = _to_numpy(value) if isinstance(value, torch.Tensor) else value
    entries["param_groups"] = sd["param_groups"]
    return state_digest(entries)


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for DataLoader workers: derive NumPy and Python seeds from the
    per-worker torch seed (which comes from the loader's seeded generator)."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def data_generator(seed: int | None) -> torch.Generator:
    """A generator for shuffling/sampling: seeded, or from fresh entropy at ``none``
    (a new ``torch.Generator`` otherwise starts from a fixed default seed)."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def device(ctx_device: str) -> torch.device:
    return torch.device("cuda" if ctx_device == "cuda" and torch.cuda.is_available() else "cpu")


def fingerprint() -> dict[str, Any]:
    fp: dict[str, Any] = {
        "framework": "torch",
        "framework_version": torch.__version__,
        "torch_version": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
    try:
        fp["torch_parallel_info"] = torch.__config__.parallel_info().splitlines()[:12]
    except Exception:  # noqa: BLE001 - diagnostic only
        pass
    if torch.cuda.is_available():
        fp["cuda_version"] = torch.version.cuda
        fp["cudnn_version"] = torch.backends.cudnn.version()
        fp["gpu_count"] = torch.cuda.device_count()
        fp["gpu_model"] = torch.cuda.get_device_name(0)
        cap = torch.cuda.get_device_capability(0)
        fp["gpu_capability"] = f"{cap[0]}.{cap[1]}"
    return fp
