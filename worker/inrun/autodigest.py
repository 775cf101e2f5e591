"""Digests recorded without any user code, so attribution has something to go on.

Installed by the harness in the run subprocess before user code runs (:func:`install`):

* **PyTorch** — a global optimizer hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``,
  PyTorch >= 2.0, applies to every optimizer): the parameters an optimizer updates are digested
  just before its first ``step()`` (``initial_weights``), and those of every optimizer that
  stepped are digested when the run ends (``final_weights``); the order in which DataLoader
  samplers hand out indices is digested per epoch (``data_order``, :mod:`steady.worker.inrun.autodigest_order`).
* **Keras** — ``keras.Model.fit`` is wrapped: the model's weights are digested when the first
  ``fit`` starts (``initial_weights``) and when the last one returns (``final_weights``). Keras'
  data order is not recorded: ``fit(shuffle=True)`` shuffles inside its tf.data pipeline
  (``tf.random.shuffle`` in graph code), where no Python hook sees the indices.

A digest the code records itself (``sdk.set_digest``) always wins: an automatic one is only
written for a kind the run has not recorded by then. Entries are named by position
(``g<group>.p<index>`` for torch, ``w<index>`` for Keras) so runs of the same code compare.
"""

from __future__ import annotations

from typing import Any

from steady.worker.inrun import sdk
from steady.worker.contract.digests import state_digest

SOURCE = "automatic"


def _recorded(kind: str) -> bool:
    run = sdk._active()
    return run is not None and kind in run.digests


def _record(kind: str, value: str) -> None:
    if not _recorded(kind):
        sdk.set_digest(kind, value)
        sdk.emit({"e": "info", "value": {f"{kind}_digest_source": SOURCE}})


# --- PyTorch -------------------------------------------------------------------------------


class _TorchHooks:
    def __init__(self) -> None:
        self.stepped: list[Any] = []  # optimizers that stepped, in order of their first step
        self.handles: list[Any] = []

    def _params(self) -> dict[str, Any]:
        from steady.worker.inrun.frameworks.torch import _to_numpy

        entries: dict[str, Any] = {}
        for oi, opt in enumerate(self.stepped):
            for gi, group in enumerate(opt.param_groups):
                for pi, p in enumerate(group["params"]):
                    entries[f"o{oi}.g{gi}.p{pi:05d}"] = _to_numpy(p.detach())
        return entries

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if any(o is optimizer for o in self.stepped):
            return
        self.stepped.append(optimizer)
        if len(self.stepped) == 1 and not _recorded("initial_weights"):
            _record("initial_weights", state_digest(self._params()))

    def finish(self) -> None:
        for h in self.handles:
            h.remove()
        if self.stepped and not _recorded("final_weights"):
            _record("final_weights", state_digest(self._params()))


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

    def finish() -> None:
        model_cls.fit = original
        if state["model"] is not None and not _recorded("final_weights"):
            _record("final_weights", model_digest(state["model"]))

    return finish


def install(framework: str) -> Any:
    """Install the hooks for ``framework``; returns a function that records the final digests
    (call it when the user code has returned). Never raises: no hook, no automatic digest.
    ``python`` code has no framework to hook (and importing one would cost seconds): nothing."""
    if framework not in ("torch", "tensorflow"):
        return lambda: None
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
