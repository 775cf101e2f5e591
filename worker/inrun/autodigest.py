"""Digests recorded without any user code, so attribution has something to go on.

Installed by the harness in the run subprocess before user code runs (:func:`install`):

* **PyTorch** — a global optimizer hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``,
  PyTorch >= 2.0, applies to every optimizer): the parameters an optimizer updates are digested
  just before its first ``step()`` (``initial_weights``), and those of every optimizer that
  stepped are digested when the run ends (``final_weights``); the order in which DataLoader
  samplers hand out indices is digested per epoch (``data_order``, :mod:`steady.worker.inrun.autodigest_order`).
* **Keras** — ``keras.Model.fit`` is wrapped: the model's weights are digested when the first
  ``fit`` starts (``initial_weights``) and when the last one returns (``final_weights``). Keras'
  data order is not recorded: ``fit(shuffle=True)`` and a ``tf.data`` pipeline's ``shuffle`` draw the
  order inside TensorFlow (graph code), where no Python hook sees the indices; the run says so
  (``digests_missing``) unless its code logged the order itself.

**Without an optimizer** (weights stepped by hand: ``p.data.add_``, ``w -= lr * w.grad``, a custom
optimizer that is no ``torch.optim.Optimizer``; a Keras custom training loop with no ``fit``): the model
is the module the code first calls. For torch a global forward pre-hook (one call, then removed) keeps the
outermost ``nn.Module`` of the first forward and digests its parameters there, before any update can
have happened (``initial_weights``), and again when the run ends (``final_weights``); without any forward
call the process's ``nn.Module`` objects that are no other module's child are digested at the end. For Keras,
``keras.Model.__call__`` is wrapped for its first call the same way (eager, or traced by ``tf.function``:
the weights are read outside the graph, before the function first runs); a model never called through it
(layers called one by one, a ``tf.Module`` of the code's own) is looked for at the end, among the process's
``keras.Model`` and ``tf.Module`` objects, for the final weights only. These digests are used only
when no optimizer hook (or ``fit``) recorded one. Where none can be had the run says which and why
(``digests_missing``: kind -> reason, in its applied record), and the report shows it.

A digest the code records itself (``sdk.set_digest``) always wins: an automatic one is only
written for a kind the run has not recorded by then. Entries are named by position
(``g<group>.p<index>`` for torch, ``w<index>`` for Keras) so runs of the same code compare.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from steady.worker.inrun import sdk
from steady.worker.contract.digests import state_digest

SOURCE = "automatic"


_said: dict[str, Any] = {"run": None, "reasons": {}}  # the reasons told so far for the active run


def _missing(reasons: dict[str, str]) -> None:
    """Tell the report which digests the run has none of, and why (only kinds still unrecorded). Each call
    sends every reason told so far: the agent keeps the last ``digests_missing`` it read."""
    reasons = {k: v for k, v in reasons.items() if not _recorded(k)}
    if not reasons:
        return
    run = sdk._active()
    if _said["run"] is not run:
        _said["run"], _said["reasons"] = run, {}
    _said["reasons"].update(reasons)
    sdk.emit({"e": "info", "value": {"digests_missing": dict(_said["reasons"])}})


def _recorded(kind: str) -> bool:
    run = sdk._active()
    return run is not None and kind in run.digests


def _record(kind: str, value: str, how: str | None = None) -> None:
    """``how``: where the weights were found when no optimizer (or ``fit``) hook fired ("module": the model the
    code called first)."""
    if not _recorded(kind):
        sdk.set_digest(kind, value)
        sdk.emit({"e": "info", "value": {f"{kind}_digest_source": SOURCE if how is None else f"{SOURCE} ({how})"}})


# --- PyTorch -------------------------------------------------------------------------------


class _TorchHooks:
    def __init__(self) -> None:
        self.stepped: list[Any] = []  # optimizers that stepped, in order of their first step
        self.handles: list[Any] = []
        self.forward_handles: list[Any] = []  # the one-shot forward pre-hook
        self.model: Any = None  # the outermost module of the first forward call
        self.model_initial: str | None = None  # its parameters' digest at that call

    def _params(self) -> Mapping[str, Any]:
        entries: dict[str, Any] = {}
        for oi, opt in enumerate(self.stepped):
            for gi, group in enumerate(opt.param_groups):
                for pi, p in enumerate(group["params"]):
                    entries[f"o{oi}.g{gi}.p{pi:05d}"] = p
        return _OnHost(entries)

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if any(o is optimizer for o in self.stepped):
            return
        self.stepped.append(optimizer)
        if len(self.stepped) == 1 and not _recorded("initial_weights"):
            _record("initial_weights", state_digest(self._params()))

    def forward_pre(self, module: Any, args: Any) -> None:
        """The first forward call of any module: keep its outermost module (the model) and digest it
        before an update can have happened; then the hook removes itself (one call costs nothing)."""
        for h in self.forward_handles:
            h.remove()
        self.forward_handles.clear()
        if self.model is None:
            self.model = module
            if _optimizer_exists():  # its first step will digest the weights: no second copy of them here
                return
            try:
                self.model_initial = _module_params_digest([module])
            except Exception:  # noqa: BLE001 - a parameter that cannot be read: no digest, said at the end
                self.model_initial = None

    def finish(self) -> None:
        for h in self.handles + self.forward_handles:
            h.remove()
        if self.stepped:
            if not _recorded("final_weights"):
                _record("final_weights", state_digest(self._params()))
            return
        # no torch.optim optimizer stepped: the weights were updated by hand (or not at all)
        modules = [self.model] if self.model is not None else _root_modules()
        if not modules:
            _missing({"initial_weights": NO_MODULE, "final_weights": NO_MODULE})
            return
        how = "module" if self.model is not None else "module found at exit"
        if self.model_initial is not None and not _recorded("initial_weights"):
            _record("initial_weights", self.model_initial, how)
        elif self.model is None:
            _missing({"initial_weights": NO_FORWARD})
        else:
            _missing({"initial_weights": NO_INITIAL})
        if not _recorded("final_weights"):
            try:
                _record("final_weights", _module_params_digest(modules), how)
            except Exception as exc:  # noqa: BLE001
                _missing({"final_weights": f"its parameters could not be read ({type(exc).__name__})"})


NO_MODULE = ("no torch.optim optimizer stepped and no torch.nn.Module with parameters was found "
             "(weights kept in plain tensors: sdk.set_digest records them)")
NO_INITIAL = ("a torch.optim optimizer existed at the first forward call but never stepped: the weights before "
              "the first update were not taken")
NO_FORWARD = ("no torch.optim optimizer stepped and no module was called: the parameters were found only when "
              "the run ended")


class _OnHost(Mapping):
    """Tensors by name, each copied to the host only when the digest reads it: one parameter in host memory
    at a time, not a second copy of the whole model."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        self._tensors = tensors

    def __getitem__(self, name: str) -> Any:
        from steady.worker.inrun.frameworks.torch import _to_numpy

        return _to_numpy(self._tensors[name].detach())

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def _module_params_digest(modules: list[Any]) -> str:
    """The parameters of ``modules`` (named ``m<i>.<parameter name>``), bitwise."""
    return state_digest(_OnHost({f"m{i}.{name}": p for i, m in enumerate(modules) for name, p in m.named_parameters()}))


def _optimizer_exists() -> bool:
    """Whether the process holds a ``torch.optim.Optimizer`` (whose first step the optimizer hook digests)."""
    import gc

    import torch

    base = torch.optim.Optimizer
    return any(issubclass(type(o), base) for o in gc.get_objects())


def _root_modules() -> list[Any]:
    """The process's ``nn.Module`` objects with parameters that are no other module's child, in an order that
    does not depend on memory (class name, parameter count, parameter shapes)."""
    import gc

    import torch

    module = torch.nn.Module
    found = [o for o in gc.get_objects() if issubclass(type(o), module)]  # type(): no __class__ property runs
    children = {id(c) for m in found for c in m.modules() if c is not m}
    roots = [m for m in found if id(m) not in children and any(True for _ in m.parameters())]

    def key(m: Any) -> tuple:
        shapes = tuple(tuple(p.shape) for p in m.parameters())
        return (type(m).__qualname__, sum(p.numel() for p in m.parameters()), shapes)

    return sorted(roots, key=key)


def _record_data_order(epochs: list[str]) -> None:
    """The automatic data order, per epoch, unless the code logged its own (that one wins)."""
    if not epochs or _recorded("data_order"):
        return
    for epoch, value in enumerate(epochs):
        sdk.set_digest("data_order", value, epoch=epoch)
    sdk.emit({"e": "info", "value": {"data_order_digest_source": SOURCE}})


def _install_torch() -> Any:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from steady.worker.inrun.autodigest_order import install_torch as install_order

    hooks = _TorchHooks()
    hooks.handles.append(register_optimizer_step_pre_hook(hooks.pre))
    try:
        from torch.nn.modules.module import register_module_forward_pre_hook

        hooks.forward_handles.append(register_module_forward_pre_hook(hooks.forward_pre))
    except ImportError:  # an old torch: the modules are looked for at the end only
        pass
    try:  # the order hook uses a private torch method: without it, the weight digests still count
        finish_order = install_order(_record_data_order)
    except (AttributeError, KeyError, ImportError):
        def finish_order() -> None:
            return None

    def finish() -> None:
        hooks.finish()
        finish_order()

    return finish


# --- Keras ---------------------------------------------------------------------------------


def _install_keras() -> Any:
    import tensorflow as tf

    from steady.worker.inrun.frameworks.tensorflow import model_digest

    model_cls = tf.keras.Model
    original = model_cls.fit
    state: dict[str, Any] = {"model": None}

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if state["model"] is None and self.built and not _recorded("initial_weights"):
            _record("initial_weights", model_digest(self))
        if state["model"] is None and not self.built:
            # weights are created on the first batch: digest them there, before any update
            callbacks = list(kwargs.pop("callbacks", None) or [])
            callbacks.append(_FirstBatch(self))
            kwargs["callbacks"] = callbacks
        state["model"] = self
        return original(self, *args, **kwargs)

    class _FirstBatch(tf.keras.callbacks.Callback):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self._target = model

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if batch == 0 and not _recorded("initial_weights") and self._target.built:
                _record("initial_weights", model_digest(self._target))

    model_cls.fit = fit
    had_call = "__call__" in model_cls.__dict__
    original_call = model_cls.__call__

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        """The first call of a model outside ``fit`` (a custom training loop): keep it, and digest its weights
        right after that call built them, before any gradient is applied; then unwrap (one call). A call
        traced by ``tf.function`` counts too: the trace runs before the function first executes, and the
        weights are read outside the graph being built (``tf.init_scope``). The outermost call is the model's:
        a model called inside another's call is a part of it. Inside ``fit`` nothing is digested (``fit``'s
        own hook does it). A call on symbolic inputs (a functional model being built around this one) is no
        call of the model."""
        state["depth"] += 1
        try:
            out = original_call(self, *args, **kwargs)
        finally:
            state["depth"] -= 1
        if state["called"] is None and state["depth"] == 0 and not _symbolic(args, kwargs):
            _unwrap_call()
            state["called"] = self
            if state["model"] is None:
                try:
                    with tf.init_scope():
                        state["called_initial"] = model_digest(self) if self.weights else None
                except Exception:  # noqa: BLE001 - weights that cannot be read here: said at the end
                    state["called_initial"] = None
        return out

    def _symbolic(args: Any, kwargs: Any) -> bool:
        try:
            return any(type(x).__name__ == "KerasTensor" for x in tf.nest.flatten((args, kwargs)))
        except Exception:  # noqa: BLE001 - inputs tf.nest cannot walk: taken as a real call
            return False

    def _unwrap_call() -> None:
        if model_cls.__dict__.get("__call__") is call:
            if had_call:
                model_cls.__call__ = original_call
            else:
                del model_cls.__call__

    state["called"] = state["called_initial"] = None
    state["depth"] = 0
    model_cls.__call__ = call

    def finish() -> None:
        model_cls.fit = original
        _unwrap_call()
        _missing({"data_order": NO_KERAS_ORDER})
        if state["model"] is not None:
            if not _recorded("final_weights"):
                _record("final_weights", model_digest(state["model"]))
            return
        # no fit: a custom training loop (GradientTape and apply_gradients, or assign_sub by hand)
        called = state["called"]
        if called is None:
            roots = _keras_roots(tf)
            if not roots:
                _missing({"initial_weights": NO_KERAS_MODEL, "final_weights": NO_KERAS_MODEL})
                return
            _missing({"initial_weights": NO_KERAS_CALL})
            _record("final_weights", _variables_of(roots), "model found at exit")
            return
        if state["called_initial"] is not None:
            _record("initial_weights", state["called_initial"], "model")
        else:
            _missing({"initial_weights": NO_KERAS_INITIAL})
        _record("final_weights", model_digest(called), "model")

    return finish


def _keras_roots(tf: Any) -> list[Any]:
    """The process's models with weights at exit: ``keras.Model`` objects, and ``tf.Module`` objects of the
    code's own classes (TensorFlow's and Keras' own modules left out). One per set of variables: a model
    whose variables are all another's (a layer of it, the graph a ``Sequential`` builds inside) is left out.
    In an order that does not depend on memory (class name, variable count, variable shapes)."""
    import gc

    model, module = tf.keras.Model, tf.Module
    found = []
    for o in gc.get_objects():
        kind = type(o)  # type(): no __class__ property runs
        if issubclass(kind, model) or (issubclass(kind, module)
                                       and not kind.__module__.startswith(("tensorflow", "keras", "tf_keras"))):
            try:
                variables = list(o.weights if issubclass(kind, model) else o.variables)
            except Exception:  # noqa: BLE001 - an object half built: not a model to digest
                continue
            if variables:
                found.append((o, variables, frozenset(id(v) for v in variables)))

    def key(entry: tuple) -> tuple:
        o, variables, _ = entry
        shapes = tuple(tuple(v.shape) for v in variables)
        return (type(o).__qualname__, len(variables), shapes)

    found.sort(key=key)
    roots: list[tuple] = []
    for entry in found:
        ids = entry[2]
        if any(ids < other[2] for other in found) or any(ids == r[2] for r in roots):
            continue
        roots.append(entry)
    return [variables for _, variables, _ in roots]


def _variables_of(roots: list[list[Any]]) -> str:
    from steady.worker.inrun.frameworks.tensorflow import variables_digest

    return variables_digest([v for variables in roots for v in variables])


NO_KERAS_MODEL = ("no keras.Model was fitted or called and no model with variables was found at exit (weights "
                  "kept in plain tf.Variables): sdk.set_digest records them")
NO_KERAS_CALL = ("no keras.Model was fitted or called: the model was found only when the run ended, so the weights "
                 "before the first update were not taken")
NO_KERAS_INITIAL = "the model's weights could not be read at its first call, before the first update"
NO_KERAS_ORDER = ("TensorFlow's input order is not watched (tf.data shuffles inside TensorFlow, where no sample "
                  "index reaches Python): sdk.log_data_order records it")


def install(framework: str) -> Any:
    """Install the hooks for ``framework``; returns a function that records the final digests
    (call it when the user code has returned). Never raises: no hook, no automatic digest.
    ``python`` code has no framework to hook (and importing one would cost seconds): no digest, and the run
    says so (``digests_missing``) unless its code recorded its own."""
    if framework not in ("torch", "tensorflow"):
        why = (f"framework {framework}: Steady hooks no model's weights here (sdk.set_digest records them; "
               "framework torch or tensorflow digests them automatically)")

        def note() -> None:
            try:
                _missing({"initial_weights": why, "final_weights": why})
            except Exception:  # noqa: BLE001
                pass

        return note
    try:
        finish = _install_torch() if framework == "torch" else _install_keras()
    except Exception:  # noqa: BLE001 - an old framework without the hooks: just no digests
        return lambda: None

    def safe_finish() -> None:
        try:
            finish()
        except Exception:  # noqa: BLE001
            pass

    return safe_finish
