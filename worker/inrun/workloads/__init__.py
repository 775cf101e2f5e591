"""Built-in workloads: small training jobs on scikit-learn's bundled digits data.

Each module exposes ``FRAMEWORKS`` (the frameworks it runs on) and ``run(ctx) -> dict``
(extra final metrics). They log per-step ``loss`` and ``step_time``, per-epoch ``val_loss``
and ``val_acc``, and record the initial/final weight, optimizer-state and per-epoch
data-order digests through :mod:`steady.worker.inrun.sdk`. Imported lazily by name.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

# What TensorFlow and Keras import only if it is installed, and no built-in workload uses: Keras' scikit-learn
# wrappers import scikit-learn (and SciPy with it), about 1 s of CPU per run; Keras' array slicing imports pandas
# and TensorFlow's v1 training loops scipy.sparse, for inputs of those types, 0.27 of a Keras control run's
# 3.3 CPU-s here. Each is an optional import there (ImportError: the type is not supported); torch imports none.
HIDDEN = ("sklearn", "scipy", "pandas")

WORKLOADS: dict[str, str] = {
    "torch_mlp": "steady.worker.inrun.workloads.torch_mlp",
    "fleet_canary": "steady.worker.inrun.workloads.fleet_canary",
    "torch_cnn": "steady.worker.inrun.workloads.torch_cnn",
    "torch_dataloader_workers": "steady.worker.inrun.workloads.torch_dataloader_workers",
    "torch_nondeterministic_kernels": "steady.worker.inrun.workloads.torch_nondeterministic_kernels",
    "hashseed_vocab": "steady.worker.inrun.workloads.hashseed_vocab",
    "torch_controls": "steady.worker.inrun.workloads.torch_controls",
    "torch_sources": "steady.worker.inrun.workloads.torch_sources",
    "numpy_sources": "steady.worker.inrun.workloads.numpy_sources",
    "torch_distributed": "steady.worker.inrun.workloads.torch_distributed",
    "keras_mlp": "steady.worker.inrun.workloads.keras_mlp",
    "keras_controls": "steady.worker.inrun.workloads.keras_controls",
}


def load(name: str) -> ModuleType:
    """The workload's module, imported with :data:`HIDDEN` hidden (an import of them fails), each found again
    afterwards (the digits data are read from scikit-learn's files). A user's own code is never loaded this way."""
    try:
        module = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; built-in workloads: {', '.join(sorted(WORKLOADS))}") from None
    hidden = [lib for lib in HIDDEN if lib not in sys.modules]
    for lib in hidden:
        sys.modules[lib] = None  # type: ignore[assignment]
    try:
        return importlib.import_module(module)
    finally:
        for lib in hidden:
            del sys.modules[lib]
