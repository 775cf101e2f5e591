"""A user's own torch script that checkpoints weights and optimizer but not the RNG state, submitted with
the resume check as a command from a fresh git folder: the report names the torch RNG state as the piece
the resumed run did not restore, and every gate fails with it.

The script uses dropout (the torch RNG) and a fixed batch per step (so the data position cannot be
what differs); it saves ``model`` and ``optimizer`` to ``{checkpoint_dir}`` after every update and loads
them when the folder holds a checkpoint, as tutorials show. A real ``steady serve`` (the shared one) and a
real worker: the kill and the restart of the user's command are the point.
"""

from __future__ import annotations

from tests.reports.resume_study import run_resume_study

SCRIPT = """
    import argparse
    import os

    import torch
    from torch import nn

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--checkpoints", required=True)
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    y = x.sum(dim=1, keepdim=True)
    path = os.path.join(args.checkpoints, "ckpt.pt")
    start = 0
    if os.path.exists(path):
        ckpt = torch.load(path)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start = ckpt["step"]
    for step in range(start, args.steps):
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, path)
"""

SPEC = """
    name: resume-without-rng
    workload:
      framework: torch
      command: ["python", "train.py", "--seed", "{seed}", "--checkpoints", "{checkpoint_dir}"]
    seeds: [1]
    determinism: [strict]
    threads: 1
    max_attempts: 1
    metrics: [loss]
    resume: {at: [3]}
"""


def test_a_resume_without_the_rng_state_is_named_in_the_report(live_server, tmp_path):
    study = run_resume_study(live_server, tmp_path, {"train.py": SCRIPT, "study.yaml": SPEC}, "resume-e2e")
    submit, report, body, worker = study.submit, study.report, study.body, study.worker
    check = study.cli("check", study.sid)
    assert body.study.progress.completed == 1, worker.log()
    # one seed: that only the first seed of several carries the check is tests/api/test_resume_spec.py's
    assert body.resume is not None and len(body.resume) == 1, (body.resume, worker.log())
    check_ = body.resume[0]
    assert check_.seed == 1 and check_.at == [3]
    assert check_.verdict == "not_restored", check_
    assert check_.missing == ["torch_rng"], check_  # weights, optimizer, step and data all came back
    assert check_.steps == {"reference": 6, "resumed": 6}
    said = "killed after update 3 and resumed: it did not restore the torch RNG state"
    assert said in report.stdout, report.stdout
    assert said in check.stdout and check.returncode == 1, check.stdout
    assert submit.returncode == 1 and said in body.outcome.reason
