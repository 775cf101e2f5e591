"""PyTorch adapter: determinism switches, digests, data-loader seeding, fingerprint."""

from __future__ import annotations

import os
import random
import sys
from typing import Any, cast

import numpy as np
import torch

from steady.worker.contract.determinism import INDUCTOR_DETERMINISTIC_VAR
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
        use_deterministic_algorithms()
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


def use_deterministic_algorithms() -> None:
    """What ``torch.use_deterministic_algorithms(True)`` sets, without importing TorchInductor to set it.

    Since PyTorch 2.6 the public call does ``import torch._inductor.config`` to set Inductor's
    ``deterministic`` flag; that import pulls in ``torch._dynamo`` and SymPy: about 2 s of CPU, more than a
    built-in workload's whole training on a CPU. Inductor's config reads the same flag from
    ``TORCHINDUCTOR_DETERMINISTIC`` when it is first imported (the agent sets it at ``strict``; it is set here
    too), so the process ends with the same two settings either way: the dispatcher's flag now, Inductor's
    whenever code compiles. Where Inductor is already imported, the public call sets it directly.
    ``tests/worker/test_torch_determinism_flags.py`` compares both ways in fresh interpreters."""
    os.environ[INDUCTOR_DETERMINISTIC_VAR] = "1"
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=False)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()  # digest the raw bits
    return t.numpy()


def module_digest(model: Any) -> str:
    """Digest of a module's ``state_dict()`` (or a state dict): parameters and buffers."""
    sd = model.state_dict() if hasattr(model, "state_dict") else model
    return state_digest({k: _to_numpy(v) if isinstance(v, torch.Tensor) else v for k, v in sd.items()})


class _WrittenOut:
    """What the built-in workloads' optimizers share with ``torch.optim``'s: ``param_groups``, ``state`` keyed by
    parameter, ``zero_grad`` and the global step hooks (``register_optimizer_step_pre_hook`` /
    ``..._post_hook``: the localizer's step digests and the automatic digests see these steps too).

    Why they are written out: the first call into a ``torch.optim`` optimizer imports ``torch._dynamo``, about
    1 s of CPU per run, more than a built-in workload's whole training. A user's code keeps its own optimizer;
    ``tests/worker/test_torch_optimizers.py`` checks these against ``torch.optim`` bit for bit."""

    def __init__(self, params: Any, **group: Any) -> None:
        self.params = list(params)
        self.param_groups = [{"params": self.params, **group}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        from torch.optim import optimizer as hooks  # the module alone: no torch._dynamo

        for hook in list(hooks._global_optimizer_pre_hooks.values()):
            hook(cast(Any, self), (), {})  # duck-typed: what the hooks read, an Optimizer has
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    self._update(p, p.grad, self.state.setdefault(p, {}), self.param_groups[0])
        for hook in list(hooks._global_optimizer_post_hooks.values()):
            hook(cast(Any, self), (), {})  # duck-typed: what the hooks read, an Optimizer has

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor],
                group: dict[str, Any]) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """As ``torch.optim``'s: state by parameter index, the groups with their parameters' indices."""
        index = {id(p): i for i, p in enumerate(self.params)}
        return {"state": {index[id(p)]: dict(st) for p, st in self.state.items() if st},
                "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                  "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups]}


class SGD(_WrittenOut):
    """SGD with momentum: the update ``torch.optim.SGD`` makes (its single-tensor path, the CPU default; no
    dampening, no Nesterov, no weight decay)."""

    def __init__(self, params: Any, lr: float, momentum: float = 0.0) -> None:
        super().__init__(params, lr=lr, momentum=momentum)

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor],
                group: dict[str, Any]) -> None:
        if group["momentum"]:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.detach().clone()
            else:
                buf.mul_(group["momentum"]).add_(grad)
            grad = buf
        p.add_(grad, alpha=-group["lr"])


class Adam(_WrittenOut):
    """Adam: the update ``torch.optim.Adam`` makes (its single-tensor path, the CPU default; no weight decay,
    no AMSGrad)."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps)

    def _update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor],
                group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        if not state:
            state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        state["step"] += 1
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = state["step"].item()
        bias_correction1 = 1 - beta1**step
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
        p.addcdiv_(exp_avg, denom, value=-(group["lr"] / bias_correction1))


def optimizer_digest(optimizer: Any) -> str:
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
