"""A user's own script exposing ``{init_seed}`` and ``{data_seed}`` gets a sources table, as a user drives it:
a fresh git folder, ``steady submit --wait``, ``steady report``; then the same study's answers where users already
look: ``steady report --tensorboard`` (read back with the tensorboard package's own event reader, custom-scalars
layout included) and ``--mlflow`` (read back with MLflow's client, from Steady's MLflow-compatible endpoint).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import run_cli_in_process, user_project
from tests.worker.test_worker_agent_e2e import Worker

SCRIPT = """
    import argparse
    import math
    import random

    p = argparse.ArgumentParser()
    p.add_argument("--init-seed", type=int, required=True)
    p.add_argument("--data-seed", type=int, required=True)
    p.add_argument("--ulp-seed", type=int, required=True)
    args = p.parse_args()
    w = random.Random(args.init_seed).gauss(0.0, 1.0)
    dead = 0.5  # a parameter that never reaches the loss, as a dead unit's weight
    if args.ulp_seed >= 0:  # move one parameter by one ULP: w, or (odd index) the dead one
        if args.ulp_seed % 2:
            dead = math.nextafter(dead, math.inf)
        else:
            w = math.nextafter(w, math.inf)
    print(f"step 0 loss {w!r}", flush=True)  # logged in full: later steps' rounding may swallow one ULP
    data = random.Random(args.data_seed)
    for step in range(1, 5):
        w -= 0.3 * (w - data.gauss(0.0, 0.5))
        print(f"step {step} loss {w * w!r}", flush=True)
"""

SPEC = """
    name: where-from
    workload:
      framework: python
      command: ["python", "train.py", "--init-seed", "{init_seed}", "--data-seed", "{data_seed}",
                "--ulp-seed", "{ulp_seed}"]
    seeds: [0, 1, 2, 3, 4]
    sources: {vary: [init, data, dropout, ulp]}
    threads: 1
    max_attempts: 1
    metrics: [loss]
"""


def _project(root: Path) -> Path:
    return user_project(root, {"train.py": SCRIPT, "study.yaml": SPEC})


def test_own_script_gets_a_sources_table_and_its_exports(live_server, tmp_path, monkeypatch):
    folder = _project(tmp_path / "project")
    env = {"STEADY_SERVER": live_server.url, "STEADY_TOKEN": live_server.tokens["user"], "NO_COLOR": "1",
           "HOME": str(folder), "XDG_CONFIG_HOME": str(folder / ".config"), "PATH": "/usr/bin:/bin",
           "MLFLOW_TRACKING_TOKEN": live_server.tokens["user"]}
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "sources", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        submit = run_cli_in_process("submit", "study.yaml", "--wait", env=env, cwd=folder)
    finally:
        worker.stop()
    sid = re.search(r"submitted study (\d+)", submit.stdout + submit.stderr).group(1)
    # the none arm pins every seed and the script never reads {dropout_seed}: identical runs of different seeds
    # there are repeats by design, never "the seed has no effect"; no check fails (one seed per run: inconclusive)
    assert submit.returncode in (0, 2) and "no effect" not in submit.stderr, (submit.stderr, worker.log())
    logdir = tmp_path / "tb"
    report = run_cli_in_process("report", sid, "--tensorboard", str(logdir), "--mlflow", f"{live_server.url}/mlflow",
                                "--mlflow-experiment", "where-from-summary", env=env, cwd=folder)
    out = report.stdout
    assert "Where the variance comes from" in out, (out, report.stderr, worker.log())
    # the script reads no dropout seed: that arm is "not varied", never a zero SD
    assert re.search(r"dropout / augmentation\s+\d+\s+not varied\s+the code never reads", out), out
    assert re.search(r"initial weights\s+5\s+\S+\s+\[", out) and re.search(r"data order\s+5\s+\S+\s+\[", out), out
    assert re.search(r"all sources\s+5\s+", out), out
    assert "arm dropout: every seed the code reads is pinned in this arm" in out and "arm none: every seed" in out, out

    from steady.server.reports.models import Report

    body = Report.model_validate_json(run_cli_in_process("report", sid, "--json", env=env, cwd=folder).stdout)
    assert body.study.progress.completed == 30, worker.log()  # none, init, data, dropout, ulp, all × 5 seeds
    table = body.sources[0]
    rows = {r.source: r for r in table.rows}
    assert rows["dropout"].status == "not_varied" and rows["dropout"].sd is None
    assert rows["init"].status == "measured" and rows["init"].sd > 0 and rows["init"].vs_all is not None
    assert rows["data"].sd > 0 and table.all_sources.sd > 0
    assert {v.group.stack for v in body.of_level("seed_stability")} == {"init", "data", "ulp", "all"}
    # the one-ULP runs whose change moved only the dead parameter never left their twin: counted and said
    from steady.worker.contract.sources import seed_for

    dead = sum(seed_for("ulp", seed=s, params={"sources": "ulp"}) % 2 for s in range(5))
    assert 0 < dead < 5 and table.divergence is not None
    assert (table.divergence.absorbed, table.divergence.n_runs) == (dead, 5)
    assert f"{dead} of 5 one-ULP runs never left their twin (loss equal at every step)" in out, out
    assert body.outcome.status == "inconclusive" and [c.stack for c in body.caveats] == ["dropout", "none"]

    # TensorBoard, read back with its own reader: the band's margin chart names what the band is and N
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "band/loss/seeded-all/upper" in tags["scalars"] and "sources/loss/init/sd" in tags["scalars"]
    sd = acc.Scalars("sources/loss/init/sd")[0].value
    assert abs(sd - rows["init"].sd) <= 1e-6 * rows["init"].sd
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors(metadata.CONFIG_SUMMARY_TAG)[0].tensor_proto.string_val[0])
    charts = {c.title: c for cat in layout.category for c in cat.chart}
    band_chart = next(c for t, c in charts.items() if t.startswith("loss seeded-all"))
    assert "normal tolerance interval" in band_chart.title and "N = 5 runs" in band_chart.title
    assert band_chart.margin.series[0].upper == "band/loss/seeded-all/upper"
    assert any(t.startswith("SD of final loss per source") for t in charts)

    # MLflow's own client reads the summary run back
    run_id = re.search(r"logged summary run (\S+)", out).group(1)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", live_server.tokens["user"])
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=f"{live_server.url}/mlflow").get_run(run_id)
    assert run.data.tags["steady.band/loss/seeded-all"].endswith("N = 5 runs")
    assert run.data.tags["steady.sources/loss/dropout"].startswith("not_varied")
    assert abs(run.data.metrics["sources/loss/init/sd"] - rows["init"].sd) <= 1e-9 * rows["init"].sd
