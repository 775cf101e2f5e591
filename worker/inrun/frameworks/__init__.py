"""Framework adapters, imported lazily: a torch-only box never imports TensorFlow, and a ``python`` run
(code that uses no ML framework) imports neither.

Also what the run subprocess does first, through the adapter of its framework: apply the determinism
level in-process (:func:`apply_determinism`) and record the fingerprint of the stack it sees
(:func:`run_fingerprint`); the agent's side of both lives in the contract
(:mod:`steady.worker.contract.determinism`, :mod:`steady.worker.contract.fingerprint`).
"""

from __future__ import annotations

import os
import random
import sys
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
        import numpy as np

        random.seed(seed)
        np.random.seed(int(seed) % (2**32))
        applied["python_random_seeded"] = True
        applied["numpy_seeded"] = True
    applied.update(_adapter(framework).apply_determinism(level, int(seed), int(threads)))
    return applied


def run_fingerprint(framework: str) -> dict[str, Any]:
    """Inside the run subprocess, after determinism was applied."""
    import numpy as np

    fp = fingerprint.host_fingerprint(os.environ.get("STEADY_DEVICE"))
    fp.pop("frameworks", None)
    fp["numpy_version"] = np.__version__
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
