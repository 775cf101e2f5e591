"""Per-rank state digests of a multi-process torch run, recorded without user code.

Installed in every rank's process (``WORLD_SIZE`` of 2 or more in its environment) by the harness or the
command shim, before the code runs (:func:`install`). At exit each rank writes one ``rank_state`` digest
event to its own event file (:mod:`steady.worker.contract.distributed` gathers them):

* ``steps``: per optimizer step, ``[local, reduced]``: the digest of the gradients this rank computed
  (each parameter's gradient as its backward accumulated it, before any all-reduce: a hook per parameter,
  ``Tensor.register_post_accumulate_grad_hook``, registered when an optimizer takes the parameter) and of
  the gradients the optimizer stepped with (after DDP's or the code's own reduction; a global
  ``register_optimizer_step_pre_hook``). Two repeats whose ranks computed the same gradients and stepped
  with different ones differ by the reduction (its order, its bucket layout), not by the kernels. A step
  whose gradients no backward pass accumulated (set by hand, ``torch.autograd.grad``) records no local
  digest (``""``): the report then claims nothing about the reduction.
* ``named_state`` / ``named_final``: the state dict of the module a ``DistributedDataParallel`` wraps, by
  name, at the first step and at the end; ``model``: its parameter names in registration order. The ranks
  of one run must agree on them: DDP synchronises by position, so a rank that registers its parameters
  in another order (a per-rank ``PYTHONHASHSEED`` iterating a set) holds other values under a name.

Digests are 16 hex digits of BLAKE2b over the tensors' bytes: a test of equality, not a checksum kept.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from steady.worker.inrun import sdk
from steady.worker.contract.distributed import BACKEND_ENV, MAX_STEPS

MAX_NAMES = 64  # parameter names kept in registration order


def world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE") or 0)
    except ValueError:
        return 0


def _digest(parts: list[bytes]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


class _RankHooks:
    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.local: dict[int, bytes] = {}  # id(param) -> its gradient's bytes as backward left it
        self.hooked: set[int] = set()
        self.steps: list[list[str]] = []
        self.module: Any = None  # the module the last DistributedDataParallel wraps
        self.named_state: str | None = None
        self.model: list[str] | None = None
        self.handles: list[Any] = []

    def _bytes(self, t: Any) -> bytes:
        from steady.worker.inrun.frameworks.torch import _to_numpy

        return _to_numpy(t.detach()).tobytes()

    def watch(self, params: Any) -> None:
        for p in params:
            if id(p) in self.hooked or not getattr(p, "requires_grad", False):
                continue
            self.hooked.add(id(p))
            try:
                self.handles.append(p.register_post_accumulate_grad_hook(self._accumulated))
            except (AttributeError, RuntimeError):
                return

    def _accumulated(self, p: Any) -> None:
        if p.grad is not None:
            self.local[id(p)] = self._bytes(p.grad)

    def pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if self.named_state is None and self.module is not None:
            self.named_state, self.model = self._named(self.module)
        if len(self.steps) >= MAX_STEPS:
            return
        local = [self.local.get(id(p), b"") for p in params]
        reduced = [self._bytes(p.grad) if p.grad is not None else b"" for p in params]
        # no gradient accumulated by backward this step (set by hand, torch.autograd.grad): nothing to compare
        self.steps.append(["" if not any(local) else _digest(local), _digest(reduced)])
        self.local = {}

    def _named(self, module: Any) -> tuple[str, list[str]]:
        state = module.state_dict()
        parts = []
        for name in sorted(state):
            value = state[name]
            parts += [name.encode(), self._bytes(value) if hasattr(value, "detach") else repr(value).encode()]
        return _digest(parts), [n for n, _ in module.named_parameters()][:MAX_NAMES]

    def finish(self) -> None:
        for h in self.handles:
            try:
                h.remove()
            except (AttributeError, RuntimeError):
                pass
        named_final = self._named(self.module)[0] if self.module is not None else None
        sdk.emit({"e": "digest", "kind": "rank_state", "value": {
            "rank": int(os.environ.get("RANK") or 0), "world_size": world_size(),
            "backend": os.environ.get(BACKEND_ENV), "steps": self.steps, "named_state": self.named_state,
            "named_final": named_final, "model": self.model}})


def _patch(owner: Any, name: str, make: Any, undo: list[Any]) -> None:
    """Replace ``owner.name`` by ``make(original)``; ``undo`` gets what puts it back."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    undo.append(lambda: setattr(owner, name, original))


def _install_torch() -> Any:
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    hooks = _RankHooks()
    undo: list[Any] = []

    def add_param_group(original: Any) -> Any:
        def wrapped(self: Any, param_group: Any) -> Any:
            out = original(self, param_group)
            try:
                hooks.watch(self.param_groups[-1]["params"])
            except Exception:  # noqa: BLE001 - no hook, no local digest; never break the user's optimizer
                pass
            return out

        return wrapped

    def ddp_init(original: Any) -> Any:
        def wrapped(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            original(self, module, *args, **kwargs)
            hooks.module = module

        return wrapped

    _patch(torch.optim.Optimizer, "add_param_group", add_param_group, undo)
    try:
        from torch.nn.parallel import DistributedDataParallel

        _patch(DistributedDataParallel, "__init__", ddp_init, undo)
    except ImportError:
        pass
    hooks.handles.append(register_optimizer_step_pre_hook(hooks.pre_step))

    def finish() -> None:
        for restore in reversed(undo):
            restore()
        hooks.finish()

    return finish


def install(framework: str) -> Any:
    """For a torch rank of a multi-process run (``WORLD_SIZE`` >= 2): install the hooks and return the
    function that writes the record at exit; otherwise nothing. Never raises."""
    if framework != "torch" or world_size() < 2:
        return lambda: None
    try:
        finish = _install_torch()
    except Exception:  # noqa: BLE001 - an old torch without the hooks: no per-rank record
        return lambda: None

    def safe_finish() -> None:
        try:
            finish()
        except Exception:  # noqa: BLE001
            pass

    return safe_finish
