"""Framework adapters, imported lazily: a torch-only box never imports TensorFlow, and a ``python`` run
(code that uses no ML framework) imports neither.

Also what the run subprocess does first, through the adapter of its framework: apply the determinism
level in-process (:func:`apply_determinism`) and record the fingerprint of the stack it sees
(:func:`run_fingerprint`); the agent's side of both lives in the contract
(:mod:`steady.worker.contract.determinism`, :mod:`steady.worker.contract.fingerprint`).
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from steady.worker.contract import determinism, fingerprint


def _adapter(framework: str) -> ModuleType:
    if framework == "torch":
        from steady.worker.inrun.frameworks import torch

        return torch
    if framework == "tensorflow":
        from steady.worker.inrun.frameworks import tensorflow

        return tensorflow
    if framework == "python":
        from steady.worker.inrun.frameworks import python

        return python
    raise ValueError(f"unknown framework {framework!r}")


def apply_determinism(level: Any, seed: int, framework: str, threads: int) -> dict[str, Any]:
    """Apply ``level`` in this (fresh) process, importing only ``framework``. Returns what was done."""
    level = determinism.level_name(level)
    applied: dict[str, Any] = {
        "level": level,
        "seed": int(seed) if level != "none" else None,
        "framework": framework,
        "threads": int(threads),
        "env": {k: os.environ[k] for k in determinism.DETERMINISM_ENV_VARS if k in os.environ},
        "python_random_seeded": False,
        "numpy_seeded": False,
        "framework_seeded": False,
        "deterministic_algorithms": False,
        "data_order": "seeded generator, fixed shuffle seed" if level != "none" else "fresh entropy",
    }
    if level != "none":
        random.seed(seed)
        seed_numpy_when_imported(int(seed))
        applied["python_random_seeded"] = True
        applied["numpy_seeded"] = True
    applied.update(_adapter(framework).apply_determinism(level, int(seed), int(threads)))
    return applied


def run_fingerprint(framework: str) -> dict[str, Any]:
    """Inside the run subprocess, after determinism was applied."""
    fp = fingerprint.host_fingerprint(os.environ.get("STEADY_DEVICE"), frameworks=False)
    fp["python_executable"] = sys.executable
    fp["env"] = {k: os.environ[k] for k in determinism.DETERMINISM_ENV_VARS if k in os.environ}
    fp["threads"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    fp.update(_adapter(framework).fingerprint())
    world = os.environ.get("WORLD_SIZE")
    if world and world != "1":  # a rank of a multi-process run: its world size and backend are the stack's
        from steady.worker.contract.distributed import BACKEND_ENV

        fp["distributed"] = {"world_size": int(world) if world.isdigit() else world,
                             "backend": os.environ.get(BACKEND_ENV)}
    return fp


def seed_numpy_when_imported(seed: int) -> None:
    """Seed NumPy's global generator with ``seed`` (modulo 2**32): now where NumPy is imported, else as the first
    import of NumPy completes, before that import returns to whatever asked for it, so no code can draw from
    the generator unseeded. Code that never uses NumPy does not pay for importing it (0.05 of a pure-Python
    command run's 0.14 CPU-s here). Where NumPy's loader could not be wrapped, it is imported and seeded now."""
    spec = importlib.util.find_spec("numpy") if "numpy" not in sys.modules else None
    if spec is not None and hasattr(spec.loader, "exec_module"):
        sys.meta_path.insert(0, _SeedNumpyOnImport(seed % (2**32)))
    else:
        import numpy

        numpy.random.seed(seed % (2**32))


class _SeedNumpyOnImport:
    """A finder placed first on ``sys.meta_path`` that finds nothing itself: for ``numpy`` it asks the finders
    after it and wraps the loader they give, so that loading the module ends by seeding its generator and
    taking this finder off the path. A spec asked for without an import (``importlib.util.find_spec``) is
    wrapped too and never loaded: only the load seeds, once."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname != "numpy":
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if not hasattr(loader, "exec_module"):  # not the loader seed_numpy_when_imported found: leave it
            return spec
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            try:
                load(module)
                if self in sys.meta_path:  # the first load of NumPy (the import machinery is done with the path)
                    module.random.seed(self.seed)
            finally:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)

        loader.exec_module = exec_module  # this spec's own loader, made for this import
        return spec
