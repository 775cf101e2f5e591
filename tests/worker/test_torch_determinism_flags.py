"""``strict`` sets what ``torch.use_deterministic_algorithms(True)`` sets, without the public call's import of
TorchInductor (and with it ``torch._dynamo`` and SymPy, about 2 s of CPU per run). Each case runs in a fresh
interpreter: the flags are process-wide and what is imported is the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec

import pytest

from steady.worker.contract.determinism import subprocess_env

pytestmark = pytest.mark.skipif(find_spec("torch") is None, reason="torch is not installed")

STATE = """
import json, sys, torch
def state():
    import torch._inductor.config as inductor  # imported here at the latest: its flag is part of the state
    return [torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            inductor.deterministic]
"""

OURS_FIRST = STATE + """
from steady.worker.inrun.frameworks.torch import use_deterministic_algorithms
use_deterministic_algorithms()
dynamo_imported = "torch._dynamo" in sys.modules
ours = state()
torch.use_deterministic_algorithms(True)  # the public call, now that Inductor is imported: changes nothing
print(json.dumps({"dynamo_imported": dynamo_imported, "ours": ours, "public_after": state()}))
"""

INDUCTOR_FIRST = STATE + """
before = state()  # Inductor imported before Steady applies strict (a user's code that compiled already)
from steady.worker.inrun.frameworks.torch import use_deterministic_algorithms
use_deterministic_algorithms()
ours = state()
torch.use_deterministic_algorithms(True)
print(json.dumps({"before": before, "ours": ours, "public_after": state()}))
"""


def _run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_DETERMINISTIC"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_strict_sets_the_public_calls_flags_without_importing_dynamo():
    got = _run(OURS_FIRST)
    assert got["dynamo_imported"] is False
    assert got["ours"] == [True, False, True]  # the dispatcher's flag, not warn-only, Inductor's flag
    assert got["public_after"] == got["ours"]


def test_where_inductor_is_already_imported_its_flag_is_set_directly():
    got = _run(INDUCTOR_FIRST)
    assert got["before"] == [False, False, False]
    assert got["ours"] == [True, False, True] and got["public_after"] == got["ours"]


def test_the_agent_starts_a_strict_run_with_inductors_flag_and_no_weaker_level_inherits_it():
    strict = subprocess_env("strict", 7, 1, base={})
    assert strict["TORCHINDUCTOR_DETERMINISTIC"] == "1"
    for level in ("none", "seeded"):
        assert "TORCHINDUCTOR_DETERMINISTIC" not in subprocess_env(level, 7, 1, base={"TORCHINDUCTOR_DETERMINISTIC": "1"})
