"""``framework: python``: user code that uses no ML framework runs without one.

A command and an entrypoint that report whether ``torch`` or ``tensorflow`` is in their own ``sys.modules``:
neither is (the shim and the harness import no framework for them), yet ``random``, NumPy and
``PYTHONHASHSEED`` are fixed by the seed at ``seeded`` and ``strict``, the fingerprint records Python and
NumPy and no ML framework, no automatic digest is taken, and ``strict``'s record says it adds only its
environment variables. NumPy is not imported for the code either: its generator is seeded as the code first
imports it (the probes find it not yet imported), and code that never imports it gets the same record.
Real run subprocesses (what is imported in them is the point), one or two each.
"""

from __future__ import annotations

import json

import numpy as np

from steady.worker.agent.local import run_local
from steady.worker.inrun.frameworks.python import STRICT_ADDS
from tests.worker.test_code_runner import unpacked_code

PROBE = """
    import json, os, random, sys
    NUMPY_BEFORE = "numpy" in sys.modules  # what the shim or the harness imported before the code
    import numpy as np
    from steady import sdk

    def probe(ctx=None):
        seen = {"torch": "torch" in sys.modules, "tensorflow": "tensorflow" in sys.modules,
                "numpy_before": NUMPY_BEFORE,
                "random": random.random(), "numpy": float(np.random.random()),
                "hashseed": os.environ.get("PYTHONHASHSEED"), "hash": hash("steady")}
        with open(os.path.join(os.environ["STEADY_RUN_DIR_PROBE"], "probe.json"), "w") as f:
            json.dump(seen, f)
        sdk.log(step=0, loss=seen["random"])

    if __name__ == "__main__":
        probe()
"""


def _run(tmp_path, name: str, **spec):
    code = unpacked_code({"exp/probe.py": PROBE}, tmp_path / name)
    work = tmp_path / name / "run"
    base = {"framework": "python", "seed": 7, "repeat": 0, "threads": 1, "time_limit_s": 60, "code_workdir": "exp"}
    r = run_local({**base, **spec}, code_dir=code, work_dir=str(work), device="cpu",
                  run_vars={"STEADY_RUN_DIR_PROBE": str(tmp_path / name)})
    assert r.ok, (r.error, r.stderr_tail)
    return r, json.loads((tmp_path / name / "probe.json").read_text())


def test_a_python_command_imports_no_framework_and_is_seeded(tmp_path):
    r, seen = _run(tmp_path, "strict", determinism="strict", command=["python", "probe.py"])
    assert seen["torch"] is False and seen["tensorflow"] is False and seen["numpy_before"] is False
    # the seed fixed Python's and NumPy's generators and the hash seed, as at every framework
    rng = np.random.RandomState(7)
    import random

    assert seen["random"] == random.Random(7).random() and seen["numpy"] == rng.random_sample()
    assert seen["hashseed"] == "7"
    applied = r.determinism_applied
    assert applied["framework"] == "python" and applied["python_random_seeded"] and applied["numpy_seeded"]
    assert applied["framework_seeded"] is False and applied["deterministic_algorithms"] is False
    assert applied["strict_adds"] == STRICT_ADDS and applied["env"]["MKL_CBWR"]
    assert "generator" in applied["data_order"] and "shuffle" not in applied["data_order"]
    fp = r.fingerprint
    assert fp["framework"] == "python" and fp["ml_framework"] is None
    assert fp["numpy_version"] == np.__version__ and fp["framework_version"] == fp["python"]
    assert "torch_version" not in fp and "tensorflow_version" not in fp
    assert not any(r.digests.get(k) for k in ("initial_weights", "final_weights", "data_order")), r.digests


def test_a_python_entrypoint_imports_no_framework(tmp_path):
    r, seen = _run(tmp_path, "seeded", determinism="seeded", entrypoint="probe.py:probe")
    assert seen["torch"] is False and seen["tensorflow"] is False and seen["numpy_before"] is False
    assert seen["numpy"] == np.random.RandomState(7).random_sample()  # seeded as the code imported it
    assert "strict_adds" not in r.determinism_applied and r.determinism_applied["numpy_seeded"]
    assert r.fingerprint["ml_framework"] is None and r.series["loss"][1] == [seen["random"]]


NO_NUMPY = """
    import importlib.util, json, os, random, sys

    def late():
        assert importlib.util.find_spec("numpy") is not None  # an optional dependency's check: no import yet
        import numpy  # first imported here, after the code has run a while
        return float(numpy.random.random())

    seen = {"random": random.random(), "before": "numpy" in sys.modules}
    seen["late"] = late() if sys.argv[1:] == ["late"] else None
    seen["after"] = "numpy" in sys.modules
    seen["metadata"] = "importlib.metadata" in sys.modules  # the fingerprint's NumPy version is read without it
    with open(os.path.join(os.environ["STEADY_RUN_DIR_PROBE"], "probe.json"), "w") as f:
        json.dump(seen, f)
"""


def test_code_that_imports_numpy_late_or_never_gets_the_seeded_generator_and_the_same_record(tmp_path):
    import random

    for name, args in (("late", ["late"]), ("never", [])):
        code = unpacked_code({"exp/probe.py": NO_NUMPY}, tmp_path / name)
        r = run_local({"framework": "python", "seed": 7, "repeat": 0, "threads": 1, "time_limit_s": 60,
                       "code_workdir": "exp", "determinism": "seeded", "command": ["python", "probe.py", *args]},
                      code_dir=code, work_dir=str(tmp_path / name / "run"), device="cpu",
                      run_vars={"STEADY_RUN_DIR_PROBE": str(tmp_path / name)})
        assert r.ok, (r.error, r.stderr_tail)
        seen = json.loads((tmp_path / name / "probe.json").read_text())
        assert seen["random"] == random.Random(7).random() and seen["before"] is False
        if args:  # seeded before the code's first draw, though NumPy was imported long after the run started
            assert seen["late"] == np.random.RandomState(7).random_sample() and seen["after"] is True
        else:  # never imported, yet recorded as ever: seeded (for when it is) and its version
            assert seen["after"] is False and seen["metadata"] is False
        assert r.determinism_applied["numpy_seeded"] is True
        assert r.fingerprint["numpy_version"] == np.__version__
