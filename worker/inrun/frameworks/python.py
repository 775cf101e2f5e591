"""The adapter for code that uses no ML framework (``framework: python``: plain Python, NumPy, scikit-learn).

It imports neither torch nor TensorFlow: the point of ``python`` is that a run costs no framework
start-up (seconds of CPU per run) and needs no framework on the worker. What the levels fix for such
code is what :func:`steady.worker.inrun.frameworks.apply_determinism` and the agent's environment
already do for every framework: ``random`` and NumPy's global generator seeded, ``PYTHONHASHSEED``.
``strict`` adds only its environment variables (``MKL_CBWR`` matters to an MKL NumPy; the CUDA and
TensorFlow ones to nothing here): there is no framework whose deterministic algorithms it could switch
on, and the record says so rather than pretend.
"""

from __future__ import annotations

import platform
from typing import Any

STRICT_ADDS = ("environment variables only (MKL_CBWR, CUBLAS_WORKSPACE_CONFIG, TF_DETERMINISTIC_OPS): "
               "no ML framework to switch to deterministic algorithms")


def apply_determinism(level: str, seed: int, threads: int) -> dict[str, Any]:
    applied: dict[str, Any] = {"ml_framework": None}
    if level != "none":  # no framework data loader to seed: the order is whatever the code draws
        applied["data_order"] = "the code's own: random and NumPy's global generators seeded"
    if level == "strict":
        applied["strict_adds"] = STRICT_ADDS
    return applied


def fingerprint() -> dict[str, Any]:
    return {
        "framework": "python",
        "framework_version": platform.python_version(),
        "ml_framework": None,  # the run's code declared none; NumPy's version is beside it
    }
