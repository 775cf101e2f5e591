"""The digits data set (scikit-learn's bundled copy, no download) and a seeded split.

The split is fixed by ``split_seed`` (param, default 0), independent of the run seed, so
runs with different seeds train on the same data; it is recorded (seed, sizes, digest of
the validation indices) in the run's applied-determinism record.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    x_train: np.ndarray  # float32, (n, 64), scaled to [0, 1]
    y_train: np.ndarray  # int64
    x_val: np.ndarray
    y_val: np.ndarray
    info: dict


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(X, y) as ``sklearn.datasets.load_digits`` returns them, read straight from the
    bundled CSV (importing sklearn.datasets costs ~1 s of scipy imports)."""
    spec = importlib.util.find_spec("sklearn")
    if spec and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            with gzip.open(path, "rt") as f:
                raw = np.loadtxt(f, delimiter=",")
            return raw[:, :-1], raw[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data, d.target.astype(np.int64)


def digits_split(split_seed: int = 0, val_fraction: float = 0.2) -> Split:
    x, y = load_digits_arrays()
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(split_seed).permutation(len(x))
    n_val = int(round(len(x) * val_fraction))
    val, train = np.sort(order[:n_val]), np.sort(order[n_val:])
    info = {
        "dataset": "sklearn.datasets.load_digits",
        "split_seed": split_seed,
        "n_train": int(len(train)),
        "n_val": int(len(val)),
        "val_indices_sha256": hashlib.sha256(val.astype("<i8").tobytes()).hexdigest(),
    }
    return Split(x[train], y[train], x[val], y[val], info)
