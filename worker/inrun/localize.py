"""Localization inside a PyTorch run: per-step state digests, and an op trace of one step.

Off unless asked for. The agent turns it on with environment variables (the command shim and the
harness call :func:`install_from_env`); the in-process controls build a :class:`Localizer` directly.

* ``STEADY_LOCALIZE=steps``: after every ``optimizer.step()`` (a global step post-hook, every
  optimizer), an order-aware digest of the training state — the parameters, their gradients and
  the optimizer's state tensors, in order — is appended to the output file (one hex digest a line).
  The first line where two runs differ is the first divergent step, even when no logged metric
  shows it.
* ``STEADY_LOCALIZE=trace`` with ``STEADY_LOCALIZE_STEP=k``: the run replays to step ``k`` and traces
  that step (from the end of step ``k-1``'s ``optimizer.step()`` to the end of step ``k``'s, so the data
  loading, forward, backward and optimizer step of iteration ``k``) at the dispatcher with a
  ``TorchDispatchMode``: every ATen op's name, the order-aware hash of its tensor inputs (before it
  runs) and outputs (after: an in-place op's mutated argument), its non-tensor arguments, the module
  it ran in (its FQN, from global module hooks; in the backward, the module whose forward made the
  autograd node), the phase (data / forward / backward / optimizer) and the user's line that called it.
  The trace is written as JSON and the process exits at once (the rest of the run is not needed).

Hashes: xxh3 (when the ``xxhash`` package is installed, else BLAKE2b) over dtype, shape and the raw
C-order bytes, so a permutation or a swapped pair of values changes them (an XOR of element hashes
would not).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from typing import Any

MODE_ENV = "STEADY_LOCALIZE"
STEP_ENV = "STEADY_LOCALIZE_STEP"
OUT_ENV = "STEADY_LOCALIZE_OUT"

# ops whose output is uninitialised memory: hashing it would see garbage, not a divergence
_UNINITIALISED = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                            "aten::new_empty_strided", "aten::resize_", "aten::set_"})


_UNINIT = object()  # an argument the op overwrites that held uninitialised memory

try:  # xxh3 is ten times faster than BLAKE2b on CPU; optional: BLAKE2b when it is not installed
    import xxhash as _xxhash

    HASH_NAME = "xxh3"

    def _hasher() -> Any:
        return _xxhash.xxh3_64()
except ImportError:  # pragma: no cover - depends on the environment
    HASH_NAME = "blake2b"

    def _hasher() -> Any:
        return hashlib.blake2b(digest_size=8)


STEP_DIGEST_KEY = "steady.step_digest"  # the series a study with `localize: steps` records


def emit_step_digest(step: int, digest: str) -> None:
    """Inside a Steady run, the step's digest as a metric (its first 52 bits, exact as a float64),
    so the server knows the first divergent step of two runs without a replay. Bypasses ``sdk.log``:
    no step time, no final value."""
    from steady.worker.inrun import sdk

    run = sdk._active()
    if run is not None:
        run.writer.write({"e": "m", "s": int(step), "v": {STEP_DIGEST_KEY: float(int(digest[:13], 16))}})


def tensor_hash(t: Any) -> str:
    """Order-aware hash of a tensor's dtype, shape and bytes (16 hex digits)."""
    import torch

    t = t.detach()
    if t.layout != torch.strided or t.device.type == "meta":
        return f"{t.dtype}:{tuple(t.shape)}:unhashable"
    t = t.cpu().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        raw = memoryview(t.view(torch.int16).numpy()).cast("B") if t.numel() else b""
    elif t.dtype == torch.bool:
        raw = t.to(torch.uint8).numpy().tobytes()
    elif t.is_complex() or t.dtype.is_floating_point or t.dtype in (torch.int8, torch.uint8, torch.int16,
                                                                     torch.int32, torch.int64):
        raw = memoryview(t.numpy()).cast("B") if t.numel() else b""
    else:
        raw = repr(t.tolist()).encode()
    h = _hasher()
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(raw)
    return h.hexdigest()


def _hash_all(values: Any) -> tuple[str, str]:
    """(hash of the tensors, repr of everything else) of nested args."""
    import torch

    hashes: list[str] = []
    other: list[str] = []

    def walk(v: Any) -> None:
        if v is _UNINIT:
            hashes.append("uninitialised")
        elif isinstance(v, torch.Tensor):
            hashes.append(tensor_hash(v))
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                other.append(str(k))
                walk(v[k])
        else:
            text = repr(v)
            other.append(type(v).__name__ if " at 0x" in text else text)  # no addresses: they differ by run

    walk(values)
    h = hashlib.blake2b("|".join(hashes).encode(), digest_size=8).hexdigest() if hashes else "-"
    return h, ",".join(other)[:200]


_LIB_DIRS: tuple[str, ...] | None = None
USER_FILES: set[str] = set()  # files inside the library folders that count as the user's code (the controls)


def _library_dirs() -> tuple[str, ...]:
    global _LIB_DIRS
    if _LIB_DIRS is None:
        import torch

        steady_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
        dirs = {os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                os.path.join(steady_dir, "steady")}
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            try:
                dirs.add(sysconfig.get_paths()[key])
            except KeyError:
                pass
        _LIB_DIRS = tuple(os.path.realpath(d) + os.sep for d in dirs if d)
    return _LIB_DIRS


_FILE_IS_LIB: dict[str, bool] = {}


def user_line(skip: int = 1) -> str:
    """``path:line`` of the innermost frame outside torch, Steady and the installed packages."""
    f: Any = sys._getframe(skip)
    libs = _library_dirs()
    while f is not None:
        name = f.f_code.co_filename
        lib = _FILE_IS_LIB.get(name)
        if lib is None:
            real = os.path.realpath(name)
            lib = name.startswith("<") or (real.startswith(libs) and real not in USER_FILES)
            _FILE_IS_LIB[name] = lib
        if not lib:
            try:
                rel = os.path.relpath(name)
            except ValueError:
                rel = name
            return f"{rel if not rel.startswith('..') else name}:{f.f_lineno}"
        f = f.f_back
    return ""


class Localizer:
    """Per-step digests (``mode="steps"``) or a trace of step ``step`` (``mode="trace"``).

    ``install()`` registers the global hooks; ``close()`` removes them. ``digests`` holds the step
    digests, ``trace`` the op records; ``on_traced(localizer)`` is called when the traced step ends
    (the subprocess writes the file and exits there)."""

    def __init__(self, mode: str, *, step: int = 0, out: str | None = None, on_traced: Any = None) -> None:
        if mode not in ("steps", "trace"):
            raise ValueError(f"{MODE_ENV} must be 'steps' or 'trace', not {mode!r}")
        self.mode = mode
        self.target = int(step)
        self.out = out
        self.on_traced = on_traced
        self.steps_done = 0
        self.digests: list[str] = []
        self.trace: list[dict[str, Any]] = []
        self.traced = False
        self._handles: list[Any] = []
        self._mode: Any = None
        self._module_stack: list[Any] = []
        self._names: dict[int, str] = {}
        self._nodes: dict[int, tuple[Any, str, str]] = {}  # id(autograd node) -> (node, module, line)
        self._call_lines: list[str] = []
        self._in_optimizer = 0
        self._in_data = 0
        self._param_names: dict[int, str] = {}
        self._out_file: Any = None
        self._restore: list[tuple[Any, str, Any]] = []
        self._uninit: set[int] = set()  # storages of uninitialised tensors (aten::empty...) not written yet
        self._pending: tuple[str, str, list[Any]] = ("", "", [])

    # --- hooks ----------------------------------------------------------------------------------

    def install(self) -> Localizer:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(register_optimizer_step_post_hook(self._opt_post))
        if self.mode == "trace":
            self._handles.append(register_module_forward_pre_hook(self._fwd_pre))
            self._handles.append(register_module_forward_hook(self._fwd_post))
            self._patch_dataloader()
            if self.target == 0:
                self._start_tracing()
        elif self.out:
            self._out_file = open(self.out, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        return self

    def close(self) -> None:
        self._stop_tracing()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for owner, name, original in self._restore:
            setattr(owner, name, original)
        self._restore.clear()
        if self._out_file is not None:
            self._out_file.close()
            self._out_file = None

    def _patch_dataloader(self) -> None:
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        original = cls.__next__
        me = self

        def __next__(it: Any) -> Any:
            me._in_data += 1
            try:
                return original(it)
            finally:
                me._in_data -= 1

        cls.__next__ = __next__  # type: ignore[method-assign,assignment]
        self._restore.append((cls, "__next__", original))

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        import torch

        self._in_optimizer += 1
        if self._mode is not None:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    name = self._names.get(id(p))
                    if not name:
                        continue
                    tensors = [p, p.grad, *optimizer.state.get(p, {}).values()]
                    for t in tensors:
                        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                            self._param_names.setdefault(t.untyped_storage().data_ptr(), name)

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._in_optimizer -= 1
        k = self.steps_done
        self.steps_done += 1
        if self.mode == "steps":
            digest = self.state_digest(optimizer)
            self.digests.append(digest)
            emit_step_digest(k, digest)
            if self._out_file is not None:
                self._out_file.write(digest + "\n")
                self._out_file.flush()
            return
        if k == self.target and self._mode is not None:
            self._stop_tracing()
            self.traced = True
            if self.out:
                with open(self.out, "w", encoding="utf-8") as f:
                    json.dump({"step": k, "trace": self.trace}, f)
            if self.on_traced is not None:
                self.on_traced(self)
        elif k + 1 == self.target:
            self._start_tracing()

    @staticmethod
    def state_digest(optimizer: Any) -> str:
        """Parameters, gradients and optimizer state of ``optimizer``, in order."""
        import torch

        h = hashlib.blake2b(f"steady-step-v1-{HASH_NAME}".encode(), digest_size=16)
        with torch.no_grad():
            for gi, group in enumerate(optimizer.param_groups):
                for pi, p in enumerate(group["params"]):
                    h.update(f"g{gi}.p{pi}:".encode() + tensor_hash(p).encode())
                    h.update(b"grad:" + (tensor_hash(p.grad).encode() if p.grad is not None else b"none"))
                    for name in sorted(optimizer.state.get(p, {})):
                        value = optimizer.state[p][name]
                        text = tensor_hash(value) if isinstance(value, torch.Tensor) else repr(value)
                        h.update(f"{name}:{text}".encode())
        return h.hexdigest()

    # --- module paths ----------------------------------------------------------------------------

    def _fqn(self, module: Any) -> str:
        name = self._names.get(id(module))
        if name is None and self._module_stack and self._module_stack[0] is not module:
            self._fqn(self._module_stack[0])  # the outermost module names its whole tree
            name = self._names.get(id(module))
        if name is None:  # a root (no module around it): name its whole tree after its class
            root = type(module).__name__
            for sub, m in module.named_modules():
                self._names.setdefault(id(m), f"{root}.{sub}" if sub else root)
                for pn, p in m.named_parameters(recurse=False):
                    self._names.setdefault(id(p), f"{root}.{sub}.{pn}" if sub else f"{root}.{pn}")
            name = self._names[id(module)]
        return name

    def _fwd_pre(self, module: Any, args: Any) -> None:
        self._module_stack.append(module)
        if self._mode is not None:
            self._call_lines.append(user_line(1))

    def _fwd_post(self, module: Any, args: Any, output: Any) -> None:
        if self._module_stack and self._module_stack[-1] is module:
            self._module_stack.pop()
        if self._mode is None:
            return
        line = self._call_lines.pop() if self._call_lines else ""
        self._label_nodes(output, self._fqn(module), line)

    def _label_nodes(self, output: Any, fqn: str, line: str) -> None:
        """Autograd nodes this module's forward made (not labelled by an inner module yet)."""
        import torch

        todo: list[Any] = []

        def roots(v: Any) -> None:
            if isinstance(v, torch.Tensor) and v.grad_fn is not None:
                todo.append(v.grad_fn)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    roots(x)
            elif isinstance(v, dict):
                for x in v.values():
                    roots(x)

        roots(output)
        while todo:
            node = todo.pop()
            if node is None or id(node) in self._nodes:
                continue
            self._nodes[id(node)] = (node, fqn, line)
            todo.extend(n for n, _ in node.next_functions)

    # --- tracing ---------------------------------------------------------------------------------

    def _start_tracing(self) -> None:
        if self._mode is not None:
            return
        from torch.utils._python_dispatch import TorchDispatchMode

        me = self

        class _Trace(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                me._record_before(func, args, kwargs)
                out = func(*args, **kwargs)
                me._record_after(func, args, kwargs, out)
                return out

        self._mode = _Trace()
        self._mode.__enter__()

    def _stop_tracing(self) -> None:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def _where(self) -> tuple[str, str, str]:
        import torch

        if self._in_data:
            return "DataLoader", "data", user_line(1)
        node = torch._C._current_autograd_node()
        if node is not None:
            found = self._nodes.get(id(node))
            return (found[1], "backward", found[2]) if found else ("", "backward", user_line(1))
        if self._in_optimizer:
            return "optimizer", "optimizer", user_line(1)
        module = self._fqn(self._module_stack[-1]) if self._module_stack else ""
        return module, "forward", user_line(1)

    def _record_before(self, func: Any, args: Any, kwargs: Any) -> None:
        import torch

        schema = getattr(func, "_schema", None)
        written = {i for i, a in enumerate(schema.arguments) if a.is_write} if schema is not None else set()
        masked: list[Any] = []
        for i, a in enumerate(args):
            # an argument the op overwrites, still holding uninitialised memory: not an input
            if (i in written and isinstance(a, torch.Tensor) and a.layout == torch.strided
                    and a.untyped_storage().data_ptr() in self._uninit):
                masked.append(_UNINIT)
            else:
                masked.append(a)
        self._pending = (*_hash_all((masked, kwargs)), [a for i, a in enumerate(args) if i in written])

    def _record_after(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        import torch

        name = func._schema.name if hasattr(func, "_schema") else str(func)
        inputs, other, mutated = self._pending
        if name in _UNINITIALISED:
            output = ""
            for t in (out if isinstance(out, (list, tuple)) else [out]):
                if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                    self._uninit.add(t.untyped_storage().data_ptr())
        else:
            output, _ = _hash_all((out, mutated))
            for t in mutated:
                if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                    self._uninit.discard(t.untyped_storage().data_ptr())
        module, phase, line = self._where()
        if phase == "optimizer":  # name the parameter the op updates
            for a in args:
                ts = a if isinstance(a, (list, tuple)) else [a]
                hit = next((self._param_names.get(t.untyped_storage().data_ptr()) for t in ts
                            if isinstance(t, torch.Tensor) and t.layout == torch.strided
                            and t.untyped_storage().data_ptr() in self._param_names), None)
                if hit:
                    module = hit
                    break
        self.trace.append({"op": name, "module": module, "phase": phase, "line": line, "inputs": inputs,
                           "output": output, "args": other})


def install_from_env(on_traced_exit: bool = True) -> Localizer | None:
    """The localizer the environment asks for (``STEADY_LOCALIZE``), installed; None when off or not torch."""
    mode = os.environ.get(MODE_ENV)
    if not mode:
        return None

    def done(loc: Localizer) -> None:
        if on_traced_exit:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    loc = Localizer(mode, step=int(os.environ.get(STEP_ENV) or 0), out=os.environ.get(OUT_ENV), on_traced=done)
    return loc.install()
