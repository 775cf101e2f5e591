"""A finished run's story over the API and the run page, as a worker reports it: the output tail of a
completed run, the argv as run, and what the study gave it (params, command); a run's output, however
hostile, is text on the page (escaped, its terminal escapes stripped), and lists stay small."""

from __future__ import annotations

from steady.worker.agent.client import SteadyClient
from steady.worker.contract.protocol import RunResult, WorkerRegistration

HOSTILE = "step 3 loss 0.5\n\x1b[31m</pre><script>alert('run')</script>\x1b[0m\nepoch 1 done\n"


def test_a_completed_runs_tail_argv_and_params_are_kept_and_shown_safely(live_server):
    http = live_server.client()
    created = http.post("/api/v1/studies", json={
        "name": "story", "metrics": ["loss"], "seeds": [5], "determinism": ["seeded"], "max_attempts": 1,
        "workload": {"framework": "torch", "command": ["python", "train.py", "--seed", "{seed}"],
                     "params": {"lr": 0.05}}})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    worker = SteadyClient(live_server.url, live_server.tokens["worker"])
    try:
        wid = worker.register(WorkerRegistration(name="story-worker", labels=["torch"])).worker_id
        lease = worker.lease_or_idle(wid, study_id=sid).lease
        assert lease is not None
        argv = ["/usr/bin/python3", "train.py", "--seed", "5"]
        worker.complete(lease.run_id, RunResult(lease_id=lease.lease_id, stderr_tail=HOSTILE, argv=argv))
    finally:
        worker.close()

    run = http.get(f"/api/v1/runs/{lease.run_id}").json()
    assert run["status"] == "completed" and run["stderr_tail"] == HOSTILE and run["argv"] == argv
    assert run["story"]["params"] == {"lr": 0.05}
    assert run["story"]["command"] == ["python", "train.py", "--seed", "{seed}"]
    listed = http.get(f"/api/v1/studies/{sid}/runs").json()["items"]
    assert listed[0]["argv"] == argv and listed[0]["stderr_tail"] is None  # a list leaves completed tails out

    page = http.get(f"/runs/{lease.run_id}").text
    assert "/usr/bin/python3 train.py --seed 5" in page and '{"lr": 0.05}' in page
    assert "&lt;/pre&gt;&lt;script&gt;alert(&#39;run&#39;)&lt;/script&gt;" in page and "epoch 1 done" in page
    assert "<script>alert" not in page and "\x1b" not in page and "[31m" not in page

    # one level, no step times: the report and the study page say why there is no cost of determinism
    report = http.get(f"/api/v1/studies/{sid}/report").json()
    assert report["determinism_cost"] == [] and report["cost_note"].startswith("only one determinism level (seeded)")
    assert "Not computed: only one determinism level (seeded)" in http.get(f"/studies/{sid}").text
