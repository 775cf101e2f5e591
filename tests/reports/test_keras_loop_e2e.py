"""A Keras custom training loop as the Keras guide writes its fast version, unmodified: a ``tf.data`` pipeline
shuffled from ``--seed``, the train step in ``tf.function``, the weights stepped by hand with ``assign_sub``
(no optimizer, no ``fit``), the loss printed with two decimals. Submitted from a fresh git folder at
``seeded`` (one seed, two repeats: the fewest runs that show repeatability's verdict), its ``submit``,
``report`` and ``check`` say exactly what was compared: the values at the 2 printed decimals, the weights
bitwise through the initial- and final-weight digests the worker took from the model the loop calls, and no
data-order digest, with the reason (``tf.data`` draws the order inside TensorFlow). A real ``steady serve``
(the shared one) and a real worker: running the user's command under the worker's shim is the point."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from steady.worker.inrun.autodigest import NO_KERAS_ORDER
from tests.gitfolder import commit_all
from tests.reports.test_public_scripts_e2e import PROGRAM_VALUES
from tests.reports.test_user_scripts_e2e import _gates
from tests.worker.test_worker_agent_e2e import Worker, runs, series

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parents[1] / "worker" / "fixtures" / "keras_tf_function_loop.py"
SPEC = """
    name: keras-custom-loop
    workload:
      framework: tensorflow
      command: ["python", "train.py", "--seed", "{seed}"]
      capture:
        patterns: ['step (?P<step>\\d+) loss (?P<loss>[0-9.]+)']
    seeds: [3]
    repeats: 2
    determinism: [seeded]
    threads: 1
    max_attempts: 1
    metrics: [loss]
"""


def test_a_keras_custom_loop_is_judged_at_its_printed_resolution_with_its_weight_digests(live_server, tmp_path):
    folder = tmp_path / "keras-loop"
    folder.mkdir()
    shutil.copy(SCRIPT, folder / "train.py")
    (folder / "study.yaml").write_text(textwrap.dedent(SPEC).lstrip())
    commit_all(folder, "the Keras guide's loop")
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "keras-loop", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        done = _gates(live_server, folder)
    finally:
        worker.stop()

    rep, text = done["body"], done["report"].stdout
    assert rep.study.progress.completed == 2, worker.log()
    http = live_server.client()
    got = runs(http, rep.study.id)
    for run in got:  # the stored loss is what the script printed: 8 steps, two decimals
        steps, values = series(http, run["id"], "loss")
        assert list(steps) == list(range(8)) and all(v == round(v, 2) for v in values)
        d = run["digests"]
        assert len(d["initial_weights"]) == 64 and len(d["final_weights"]) == 64, d
        assert d["initial_weights"] != d["final_weights"] and d["data_order"] == []
    assert {r["digests"]["final_weights"] for r in got} == {got[0]["digests"]["final_weights"]}

    (v,) = rep.of_level("repeatability")
    assert v.verdict == "identical", v
    assert v.summary.startswith("identical: every repeat equal at the 2 printed decimals, weights bitwise equal "
                                "(digests)"), v.summary
    assert re.fullmatch(re.escape("seeded runs of seed 3 equal across 2 repeats at the 2 printed decimals (values "
                                  "parsed from text, ") + r"\d significant digits?"
                        + re.escape(": a difference below 0.01 is not seen); the weights bitwise equal (initial-weight "
                                    "and final-weight digests); no data-order digest: " + NO_KERAS_ORDER),
                        v.reason), v.reason
    assert v.guarantee.startswith("exact at the printed precision only") and "(0.01)" in v.guarantee
    c = v.compared
    assert c is not None and (c.basis, c.decimals, c.resolution) == ("printed", 2, 0.01)
    assert set(c.digests) == {"initial_weights", "final_weights"} and c.missing == {"data_order": NO_KERAS_ORDER}
    # what the user reads: the same words in report and check, the study passes on the check it asked for
    assert rep.outcome.status == "pass", rep.outcome
    assert (done["submit"].returncode, done["report"].returncode, done["check"].returncode) == (0, 0, 0), done
    assert "identical: every repeat equal at the 2 printed decimals, weights bitwise equal (digests)" in text
    for out in (text, done["check"].stdout):
        assert "no data-order digest: TensorFlow's input order is not watched" in out, out
    for line in (text + done["check"].stdout).splitlines():
        assert not PROGRAM_VALUES.search(line), line
