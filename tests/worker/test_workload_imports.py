"""A built-in workload's module loads without what it does not use: Keras imports scikit-learn (and SciPy) for
its wrappers wherever scikit-learn is installed, about 1 s of CPU per run."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_keras_workload_loads_without_scikit_learn_which_is_found_again_afterwards():
    pytest.importorskip("tensorflow")
    pytest.importorskip("sklearn")
    code = (
        "import sys, importlib.util; from steady.worker.inrun import workloads; "
        "m = workloads.load('keras_mlp'); assert 'tensorflow' in sys.modules; "
        "assert 'sklearn' not in sys.modules and 'scipy.stats' not in sys.modules, 'imported'; "
        "assert importlib.util.find_spec('sklearn') is not None; "
        "from steady.worker.inrun.workloads.data import digits_split; assert len(digits_split().x_train) == 1438; "
        "import sklearn"  # the user's own code still can
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_workload_is_refused_by_name_and_hides_nothing():
    from steady.worker.inrun import workloads

    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        workloads.load("nope")
    assert sys.modules.get("sklearn", "absent") is not None
