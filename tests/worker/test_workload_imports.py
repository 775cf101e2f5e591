"""A built-in workload's module loads without what it does not use: Keras imports scikit-learn (and SciPy) for
its wrappers wherever scikit-learn is installed, about 1 s of CPU per run, and pandas and scipy.sparse for inputs
of those types, about 0.3 s more."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_keras_workload_loads_without_scikit_learn_scipy_or_pandas_which_are_found_again_afterwards():
    pytest.importorskip("tensorflow")
    pytest.importorskip("sklearn")
    code = (
        "import sys, importlib.util; from steady.worker.inrun import workloads; "
        "m = workloads.load('keras_mlp'); assert 'tensorflow' in sys.modules; "
        "assert not {'sklearn', 'scipy', 'pandas'} & set(sys.modules), 'imported'; "
        "assert all(importlib.util.find_spec(n) is not None for n in ('sklearn', 'scipy', 'pandas')); "
        "from steady.worker.inrun.workloads.data import digits_split; assert len(digits_split().x_train) == 1438; "
        "import sklearn, scipy.sparse, pandas"  # the user's own code still can
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_workload_is_refused_by_name_and_hides_nothing():
    from steady.worker.inrun import workloads

    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        workloads.load("nope")
    assert all(sys.modules.get(lib, "absent") is not None for lib in workloads.HIDDEN)
