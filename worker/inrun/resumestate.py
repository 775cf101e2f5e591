"""Inside one launch of the resume check: count optimizer steps, digest the state at the resume point, stop.

The driver (:mod:`steady.worker.inrun.resume`) starts the same code several times with
:data:`ROLE_ENV` set; the shim or the harness calls :func:`install` before user code runs. Steps are
counted by a global optimizer step pre-hook (the first optimizer that steps; PyTorch >= 2.0), so a
"step" is an optimizer update, whatever the code's own counter says.

* ``reference`` (uninterrupted): just before update ``k + 1`` for each ``k`` in :data:`AT_ENV`, the
  state components are digested (:func:`components`).
* ``interrupted``: after :data:`STOP_ENV` updates in this process, just before the next one (so
  everything the code does after update ``k``, its checkpoint included, has happened), the process
  kills itself with SIGKILL: no handler, no ``finally``, no flush, as a preemption or OOM kill ends it.
  With :data:`SIGNAL_ENV` ``term`` it sends itself SIGTERM first: the code's handler runs (it may save
  and exit); update ``k + 1`` never happens, and a process still alive after the grace is SIGKILLed.
* ``resumed`` (and an ``interrupted`` launch that itself resumed): just before its first update the
  state is digested again, as the state at the resume point :data:`FROM_ENV`.

Mid-accumulation (:data:`MICRO_ENV` ``j``): every backward pass is counted (``torch.autograd.backward``), the
stop falls just before backward ``j + 1`` of update ``k + 1``, and the state is digested there (with the
partial ``.grad`` as ``accumulated_gradients``), before backward 1 of that update (a resume from the last
update), and before a resumed launch's first backward; the gradient each applies and the backward passes
that made it are recorded before the update (``update_after``).

Keras (TensorFlow) runs: :mod:`steady.worker.inrun.resumestate_keras`, the same protocol with Keras' state.

Every launch writes, at exit, how many updates it made and a digest of its final parameters. The
records go to the JSON-lines file :data:`OUT_ENV`, one object a line.

The components, in the order in which one can explain another (:data:`COMPONENTS`): the parameters,
the optimizer's state (moments, per-parameter step counts, the param groups' hyperparameters),
the LR schedulers' state dicts, the enabled gradient scalers' state dicts, the Python, NumPy and torch (CPU and CUDA) global RNGs, the base
seed of a multi-worker DataLoader's live iterator (from which each loader worker seeds its RNGs),
and the gradients of the first update after the resume point, which stand for the batch it was
computed on (the data position) once everything above them matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import signal
import time
import weakref
from typing import Any
from collections.abc import Callable

from steady.worker.contract.resume import (AT_ENV, FROM_ENV, MICRO_ENV, OUT_ENV, ROLE_ENV, SIGNAL_ENV, STOP_ENV,
                                           TERM_GRACE_S)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tensor_bytes(t: Any) -> bytes:
    t = t.detach().cpu().contiguous()
    import torch

    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return str(t.dtype).encode() + str(tuple(t.shape)).encode() + t.numpy().tobytes()


def _value_bytes(value: Any) -> bytes:
    """A stable byte form of a state-dict value: tensors by their bits, the rest as canonical JSON."""
    import torch

    if isinstance(value, torch.Tensor):
        return _tensor_bytes(value)
    if isinstance(value, dict):
        return b"{" + b",".join(json.dumps(str(k)).encode() + b":" + _value_bytes(v)
                                for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + b"}"
    if isinstance(value, (list, tuple)):
        return b"[" + b",".join(_value_bytes(v) for v in value) + b"]"
    try:
        return json.dumps(value, sort_keys=True).encode()
    except (TypeError, ValueError):
        return repr(type(value)).encode()  # a function (LambdaLR's lambda): its type, not its address


class Tracker:
    def __init__(self, role: str, at: list[int], stop: int | None, resumed_from: int | None, out: str,
                 stop_signal: str = "kill") -> None:
        self.role, self.at, self.stop, self.resumed_from, self.out = role, at, stop, resumed_from, out
        self.signal = stop_signal
        self.steps = 0
        self.optimizer: Any = None
        self.schedulers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.loader_iters: weakref.WeakSet[Any] = weakref.WeakSet()
        self.scalers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.handles: list[Any] = []
        # mid-accumulation (MICRO_ENV): the stop and the digests fall before a backward pass, not an update
        self.micro: int | None = None
        self.backwards = 0  # backward passes since the last update
        self.resume_seen = False
        self.optimizers: list[weakref.ref[Any]] = []  # created, in order: the first is watched before it steps

    def write(self, record: dict[str, Any]) -> None:
        fd = os.open(self.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)

    def params(self) -> list[Any]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def final_digest(self) -> str:
        return _sha(b"".join(_tensor_bytes(p) for p in self.params()))

    def components(self, grads_key: str = "data") -> dict[str, str]:
        import numpy as np
        import torch

        opt = self.optimizer
        out: dict[str, str] = {}
        out["parameters"] = _sha(b"".join(_tensor_bytes(p) for p in self.params()))
        sd = opt.state_dict()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
        out["optimizer_state"] = _sha(_value_bytes(sd["state"]) + _value_bytes(groups))
        schedulers = [s for s in self.schedulers if getattr(s, "optimizer", None) is opt]
        if schedulers:
            states = sorted(_value_bytes(s.state_dict()) for s in schedulers)
            out["lr_scheduler"] = _sha(b"|".join(states))
        scalers = [sc for sc in self.scalers if sc.is_enabled()]
        if scalers:
            out["grad_scaler"] = _sha(b"|".join(sorted(_value_bytes(sc.state_dict()) for sc in scalers)))
        out["python_rng"] = _sha(pickle.dumps(random.getstate(), protocol=4))
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        out["numpy_rng"] = _sha(str(kind).encode() + np.asarray(keys).tobytes() + str((pos, has_gauss, cached)).encode())
        rng = torch.get_rng_state().numpy().tobytes()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng += b"".join(s.numpy().tobytes() for s in torch.cuda.get_rng_state_all())
        out["torch_rng"] = _sha(rng)
        seeds = sorted(int(it._base_seed) for it in self.loader_iters
                       if getattr(it, "_num_workers", 0) > 0 and hasattr(it, "_base_seed"))
        if seeds:
            out["loader_worker_seeds"] = _sha(json.dumps(seeds).encode())
        out[grads_key] = self.grads_digest()
        return out

    def grads_digest(self) -> str:
        return _sha(b"".join(b"-" if p.grad is None else _tensor_bytes(p.grad) for p in self.params()))

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.optimizer is None:
            self.optimizer = optimizer
        if optimizer is not self.optimizer:
            return
        if self.micro is not None:
            self._pre_update_micro()
            self.steps += 1
            self.backwards = 0
            return
        if self.steps == 0 and self.resumed_from is not None:
            self.write({"state": self.resumed_from, "components": self.components()})
        if self.role == "reference" and (self.steps in self.at or self.steps == 0):  # 0: the start, to tell a restart from scratch
            self.write({"state": self.steps, "components": self.components()})
        if self.role == "interrupted" and self.stop is not None and self.steps >= self.stop:
            self._stop({"killed_after": self.steps, "signal": self.signal})
        self.steps += 1

    def _stop(self, record: dict[str, Any]) -> None:
        self.write(record)
        if self.signal == "term":  # the code's handler runs now (in this thread): it may save and exit
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + TERM_GRACE_S
            while time.monotonic() < deadline:  # no update k + 1, whatever the handler does
                time.sleep(0.05)
            self.write({"term_ignored_s": TERM_GRACE_S})
        os.kill(os.getpid(), signal.SIGKILL)

    def _pre_update_micro(self) -> None:
        """Mid-accumulation, before an update: the gradient it applies (all its micro-batches) and how many
        backward passes made it, for update ``k + 1`` of the reference and the first update of a resume."""
        if self.steps == 0 and self.resumed_from is not None:
            self.write({"update_after": self.resumed_from, "data": self.grads_digest(), "micro_batches": self.backwards})
        if self.role == "reference" and self.steps == 0:  # the start, to tell a restart from scratch
            self.write({"state": 0, "components": self.components()})
        if self.role == "reference" and self.steps in self.at:
            self.write({"update_after": self.steps, "data": self.grads_digest(), "micro_batches": self.backwards})

    def before_backward(self) -> None:
        """Mid-accumulation, before a backward pass: the state at the resume point (the reference's before
        backward ``micro + 1`` of update ``k + 1``, and before its backward 1; a resumed launch's before its
        first), and the stop of an interrupted launch."""
        if self.optimizer is None:
            self.optimizer = next((o for o in (ref() for ref in self.optimizers) if o is not None), None)
            if self.optimizer is None:
                return
        if self.role == "reference" and self.steps in self.at:
            if self.backwards == 0:
                self.write({"boundary": self.steps, "components": self.components("accumulated_gradients")})
            if self.backwards == self.micro:
                self.write({"state": self.steps, "components": self.components("accumulated_gradients")})
        if self.resumed_from is not None and not self.resume_seen:
            self.resume_seen = True
            self.write({"state": self.resumed_from, "components": self.components("accumulated_gradients")})
        if (self.role == "interrupted" and self.stop is not None and self.steps >= self.stop
                and self.backwards == self.micro):
            self._stop({"killed_after": self.steps, "micro_batches": self.backwards, "signal": self.signal})

    def finish(self) -> None:
        record: dict[str, Any] = {"steps": self.steps}
        if self.optimizer is not None:
            record["final_parameters"] = self.final_digest()
        self.write(record)


def _install_torch(tracker: Tracker) -> None:
    import torch
    from torch.optim import lr_scheduler
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from torch.utils.data import dataloader

    tracker.handles.append(register_optimizer_step_pre_hook(tracker.pre))
    base = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
    original_init = base.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        tracker.schedulers.add(self)
        original_init(self, *args, **kwargs)

    base.__init__ = init  # type: ignore[method-assign]
    iter_cls = dataloader._BaseDataLoaderIter
    original_iter_init = iter_cls.__init__

    def iter_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_iter_init(self, *args, **kwargs)
        tracker.loader_iters.add(self)

    iter_cls.__init__ = iter_init  # type: ignore[method-assign]
    scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_cls is not None:  # torch.cuda.amp.GradScaler is a subclass
        original_scaler_init = scaler_cls.__init__

        def scaler_init(self: Any, *args: Any, **kwargs: Any) -> None:
            original_scaler_init(self, *args, **kwargs)
            tracker.scalers.add(self)

        scaler_cls.__init__ = scaler_init
    if tracker.micro is not None:
        _install_backward(tracker)


def _install_backward(tracker: Tracker) -> None:
    """Mid-accumulation: every backward pass (``Tensor.backward`` calls ``torch.autograd.backward``) is
    counted, and the optimizers are known from their creation (a resumed launch's first backward pass comes
    before its optimizer first steps)."""
    import torch

    original_backward = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        tracker.before_backward()
        result = original_backward(*args, **kwargs)
        tracker.backwards += 1
        return result

    torch.autograd.backward = backward
    original_opt_init = torch.optim.Optimizer.__init__

    def opt_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_opt_init(self, *args, **kwargs)
        tracker.optimizers.append(weakref.ref(self))

    torch.optim.Optimizer.__init__ = opt_init  # type: ignore[method-assign]


def launch_args() -> tuple[str, list[int], int | None, int | None, str, str] | None:
    """This launch's part in the resume check, from the driver's environment (None: not a launch of it)."""
    role = os.environ.get(ROLE_ENV)
    if not role:
        return None
    at = [int(x) for x in os.environ.get(AT_ENV, "").split(",") if x]
    stop = int(os.environ[STOP_ENV]) if os.environ.get(STOP_ENV) else None
    resumed_from = int(os.environ[FROM_ENV]) if os.environ.get(FROM_ENV) else None
    return role, at, stop, resumed_from, os.environ[OUT_ENV], os.environ.get(SIGNAL_ENV) or "kill"


def install(framework: str) -> Callable[[], None]:
    """Install the resume check's hooks when this process is one of its launches (:data:`ROLE_ENV` set);
    returns the function that writes the launch's end record (call it when the user code is done). Keras:
    :func:`steady.worker.inrun.resumestate_keras.install_from_env`."""
    args = launch_args()
    if args is None or framework != "torch":
        return lambda: None
    tracker = Tracker(*args)
    tracker.micro = int(os.environ[MICRO_ENV]) if os.environ.get(MICRO_ENV) else None
    _install_torch(tracker)
    return tracker.finish
