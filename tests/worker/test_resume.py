"""The resume check on the worker: the judgement of the launches' records (pure), and the whole path on
real launches (the agent's runner, the driver, the command shim, a SIGKILL mid-epoch with two loader
workers, the script's own resume) for a faithful resume at two points and one planted omission. The
full control table (nine omissions and two faithful resumes, five seeds each) is
``steady demo --controls --resume``, recorded in docs/controls.md."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from steady.worker.agent.local import run_local
from steady.worker.contract.resume import COMPONENTS, judge

SAME = {c: f"{c}-digest" for c in COMPONENTS}


def _reference(at=(3,), steps=6):
    return [*({"state": k, "components": dict(SAME)} for k in at), {"steps": steps, "final_parameters": "end"}]


def _launches(differ=(), *, resumed_steps=3, final="end"):
    resumed = {c: ("other" if c in differ else d) for c, d in SAME.items()}
    return [{"rc": -9, "records": [{"killed_after": 3}], "tail": ""},
            {"rc": 0, "records": [{"state": 3, "components": resumed},
                                  {"steps": resumed_steps, "final_parameters": final}], "tail": ""}]


def test_a_faithful_resume_is_identical():
    record = judge(_reference(), _launches(), [3])
    assert record["verdict"] == "identical" and record["missing"] == [] and record["final_identical"]


@pytest.mark.parametrize("component", [c for c in COMPONENTS if c != "data"])
def test_each_component_is_named_alone_and_the_batch_it_changes_is_not(component):
    """A piece upstream of the batch (all but the optimizer, the scheduler and the gradient scaler, which
    change only later updates) changes the gradients of the first update too: only the piece is named."""
    later = ("optimizer_state", "lr_scheduler", "grad_scaler")
    differ = {component} if component in later else {component, "data"}
    if component == "optimizer_iterations":  # Keras: a learning-rate schedule is computed from them
        differ = {component, "lr_scheduler"}
    record = judge(_reference(), _launches(differ, final="other"), [3])
    assert record["verdict"] == "not_restored" and record["missing"] == [component], record


def test_a_learning_rate_that_differs_with_equal_iterations_is_named():
    """A Keras learning rate a callback or the code set (not a schedule of the iterations) is its own piece."""
    record = judge(_reference(), _launches({"lr_scheduler"}, final="other"), [3])
    assert record["missing"] == ["lr_scheduler"]


def test_with_two_resume_points_the_first_that_differs_is_attributed():
    """The optimizer missed at the first point: at the second the parameters differ as a consequence."""
    first = {c: ("other" if c == "optimizer_state" else d) for c, d in SAME.items()}
    second = {c: ("other" if c in ("optimizer_state", "parameters", "data") else d) for c, d in SAME.items()}
    launches = [{"rc": -9, "records": [{"killed_after": 2}], "tail": ""},
                {"rc": -9, "records": [{"state": 2, "components": first}, {"killed_after": 2}], "tail": ""},
                {"rc": 0, "records": [{"state": 4, "components": second}, {"steps": 2, "final_parameters": "x"}],
                 "tail": ""}]
    record = judge(_reference(at=(2, 4)), launches, [2, 4])
    assert record["missing"] == ["optimizer_state"], record
    assert [p["differ"] for p in record["points"]] == [["optimizer_state"], ["parameters", "optimizer_state", "data"]]


def test_the_data_position_is_named_when_nothing_upstream_differs():
    record = judge(_reference(), _launches({"data"}, final="other"), [3])
    assert record["missing"] == ["data"] and "data position" in record["reason"]


def test_a_resumed_run_that_starts_over_did_not_restore_its_step_counter():
    record = judge(_reference(), _launches({"data"}, resumed_steps=6, final="other"), [3])
    assert record["missing"] == ["step_counter"] and record["steps"] == {"reference": 6, "resumed": 9}


def test_a_resume_that_finds_no_checkpoint_is_told_so_not_given_a_list_of_pieces():
    """Saved every 5 updates, resumed after 3: the restart begins with the initial weights and optimizer."""
    start = {c: f"{c}-at-0" for c in COMPONENTS}
    reference = [{"state": 0, "components": start}, *_reference()]
    launches = [{"rc": -9, "records": [{"killed_after": 3}], "tail": ""},
                {"rc": 0, "records": [{"state": 3, "components": start}, {"steps": 6, "final_parameters": "end"}],
                 "tail": ""}]
    record = judge(reference, launches, [3])
    assert record["missing"] == ["checkpoint"] and "started from scratch" in record["reason"]
    assert judge(reference, _launches({"parameters", "data"}, final="x"), [3])["missing"] == ["parameters"]


def test_all_state_equal_but_a_different_end_is_state_the_check_does_not_see():
    record = judge(_reference(), _launches(final="other"), [3])
    assert record["missing"] == ["unseen"] and "does not see" in record["reason"]


def test_a_launch_that_ends_before_its_kill_or_a_reference_too_short_fails_the_check():
    not_killed = [{"rc": 0, "records": [{"steps": 6}], "tail": "done early"}]
    assert "ended first" in judge(_reference(), not_killed, [3])["reason"]
    assert judge(_reference(at=(3,), steps=3), _launches(), [3, 5])["verdict"] == "failed"
    crashed = _launches()[:1] + [{"rc": 1, "records": [], "tail": "FileNotFoundError: ckpt.pt"}]
    record = judge(_reference(), crashed, [3])
    assert record["verdict"] == "failed" and "ckpt.pt" in record["reason"]



def test_a_tensorflow_launch_of_the_check_gets_the_keras_hooks_with_the_drivers_plan(monkeypatch, tmp_path):
    """The Keras hooks are installed from the driver's environment for a tensorflow launch, and only there: a
    launch left without them is never stopped and its check fails naming nothing (the torch installer does not
    stand in for it)."""
    from steady.worker.contract.resume import AT_ENV, FROM_ENV, OUT_ENV, ROLE_ENV, SIGNAL_ENV, STOP_ENV
    from steady.worker.inrun import resumestate, resumestate_keras

    installed = []
    monkeypatch.setattr(resumestate_keras, "_install", installed.append)  # TensorFlow itself is not imported here
    for name in (AT_ENV, FROM_ENV, SIGNAL_ENV):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "launch.jsonl"
    monkeypatch.setenv(ROLE_ENV, "interrupted")
    monkeypatch.setenv(STOP_ENV, "6")
    monkeypatch.setenv(OUT_ENV, str(out))
    assert resumestate_keras.install_from_env("torch")() is None and not installed
    assert resumestate.install("tensorflow")() is None and not out.exists()
    finish = resumestate_keras.install_from_env("tensorflow")
    (tracker,) = installed
    assert isinstance(tracker, resumestate_keras.KerasTracker)
    assert (tracker.role, tracker.stop, tracker.resumed_from, tracker.out, tracker.signal) == (
        "interrupted", 6, None, str(out), "kill")
    finish()
    assert out.read_text() == '{"steps": 0}\n'


def _micro_reference(k=3, total=2, micro=1):
    """The uninterrupted run mid-accumulation: its state before backward 1 and before backward ``micro + 1`` of
    update ``k + 1``, and the gradient of that update, summed over ``total`` micro-batches."""
    mid = {c: f"{c}-mid" for c in COMPONENTS if c != "data"}
    boundary = {c: f"{c}-boundary" for c in COMPONENTS if c != "data"}
    boundary.update(parameters=mid["parameters"], optimizer_state=mid["optimizer_state"])  # no update in between
    return [{"state": 0, "components": {c: f"{c}-0" for c in COMPONENTS}}, {"boundary": k, "components": boundary},
            {"state": k, "components": mid}, {"update_after": k, "data": "grad", "micro_batches": total},
            {"steps": 6, "final_parameters": "end"}], mid, boundary


def _micro_launches(state, *, data="grad", backwards=1, final="end"):
    return [{"rc": -9, "records": [{"killed_after": 3, "micro_batches": 1}], "tail": ""},
            {"rc": 0, "records": [{"state": 3, "components": state},
                                  {"update_after": 3, "data": data, "micro_batches": backwards},
                                  {"steps": 3, "final_parameters": final}], "tail": ""}]


def test_mid_accumulation_a_faithful_resume_and_one_from_the_last_update_are_identical():
    """Restored with the partial gradient and the counter (1 backward left), or from the update before (the
    whole accumulation step again, 2 backwards): both continue the uninterrupted run."""
    reference, mid, boundary = _micro_reference()
    assert judge(reference, _micro_launches(dict(mid)), [3], micro=1)["verdict"] == "identical"
    record = judge(reference, _micro_launches(dict(boundary), backwards=2), [3], micro=1)
    assert record["verdict"] == "identical", record


def test_mid_accumulation_a_stop_past_the_updates_micro_batches_fails_the_check_saying_so():
    reference, _, _ = _micro_reference()
    reference = [r for r in reference if r.get("state") != 3]  # update 4 had one backward pass: no stop after 1
    record = judge(reference, _micro_launches({}), [3], micro=1)
    assert record["verdict"] == "failed" and "fewer than 2 backward passes" in record["reason"], record


@pytest.mark.parametrize(("changed", "backwards", "missing"), [
    ({"accumulated_gradients": "none"}, 1, ["accumulated_gradients"]),  # the partial .grad was not loaded
    ({}, 2, ["micro_batch_counter"]),  # the count restarted: two more micro-batches on top of the first
    ({"torch_rng": "other"}, 1, ["torch_rng"]),
])
def test_mid_accumulation_the_lost_piece_is_named_alone(changed, backwards, missing):
    reference, mid, _ = _micro_reference()
    record = judge(reference, _micro_launches({**mid, **changed}, data="other", backwards=backwards, final="x"),
                   [3], micro=1)
    assert record["verdict"] == "not_restored" and record["missing"] == missing, record


def _spec(omit: str | None, at: list[int], seed: int = 0, micro: int | None = None) -> dict:
    command = ["python", "-m", "steady.worker.inrun.workloads.resume_controls", "--checkpoint-dir",
               "{checkpoint_dir}", "--seed", "{seed}", "--workers", "2", "--steps", "8"]
    resume: dict = {"at": at}
    if micro:  # two loader batches an update, stopped after the first of update at + 1
        command += ["--accumulate", "2"]
        resume["micro_batches"] = micro
    if omit:  # stopped by SIGTERM, which the script's handler answers by exiting 0
        command += ["--omit", omit, "--exit-on-term"]
        resume["signal"] = "term"
    return {"framework": "torch", "command": command, "seed": seed, "repeat": 0, "determinism": "strict",
            "threads": 1, "time_limit_s": 300, "resume": resume}


ENTRYPOINT = """
from steady.worker.inrun.workloads.resume_controls import main as train


def main(ctx):
    train(["--checkpoint-dir", ctx.checkpoint_dir, "--seed", str(ctx.seed), "--workers", "2", "--steps", "8"])
"""


@pytest.mark.slow
@pytest.mark.parametrize(("omit", "at", "missing", "micro"), [
    (None, [2, 5], [], None),
    ("loader_generator", [5], ["loader_worker_seeds"], None),
    ("micro_batch", [5], ["micro_batch_counter"], 1),
])
def test_real_launches_killed_mid_epoch_with_loader_workers(tmp_path, omit, at, missing, micro):
    """Four batches an epoch: a kill after update 5 is mid-epoch, with two live loader workers. The faithful
    resume runs as an entrypoint (the harness, ``ctx.checkpoint_dir``) killed by SIGKILL, the omissions as a
    command stopped by SIGTERM (its handler exits 0); the third stops between the two micro-batches of
    update 6 (11 of 16 loader batches done) and restarts the accumulation step's count."""
    spec, code = _spec(omit, at, micro=micro), None
    if omit is None:
        code = tmp_path / "code"
        code.mkdir()
        (code / "train.py").write_text(ENTRYPOINT)
        spec = {**{k: v for k, v in spec.items() if k != "command"}, "entrypoint": "train.py"}
    # the run's TMPDIR lies in its work dir, where the loader workers' sockets are made: an AF_UNIX path
    # holds at most 107 bytes, which pytest's own tmp_path (under xdist) nearly fills by itself
    work = tempfile.mkdtemp(prefix="sr-", dir="/tmp")
    try:
        r = run_local(spec, device="cpu", work_dir=os.path.join(work, "run"),
                      code_dir=None if code is None else str(code))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert r.ok, r.stderr_tail
    record = r.digests["resume"]
    assert record["missing"] == missing, record
    assert record["verdict"] == ("identical" if not missing else "not_restored")
    assert [launch["rc"] for launch in record["launches"]] == [0 if omit else -9] * len(at) + [0]
    assert record["steps"] == {"reference": 8, "resumed": 8}
    if omit is not None:  # captured from the command's output: the uninterrupted launch's, once
        assert r.series["loss"][0] == list(range(1, 9))


def test_the_controls_plant_every_piece_once_and_the_demo_command_runs_them(monkeypatch, capsys):
    """``steady demo --controls --resume``: one torch control per piece the check names (ten) and one Keras
    control per Keras piece (eight), five faithful resumes; a row passes only when every seed names exactly
    its piece."""
    from steady.server.cli import build_parser
    from steady.server.cli.demo import resume_controls as demo
    from steady.worker.contract.resume import ACCUMULATION_COMPONENTS, KERAS_COMPONENTS, STEP_COUNTER, TORCH_COMPONENTS
    from steady.worker.inrun.workloads.resume_controls import OMISSIONS
    from steady.worker.inrun.workloads.resume_controls_keras import OMISSIONS as KERAS_OMISSIONS

    planted = [c for c in demo.CONTROLS if c.omit]
    assert sorted(c.expected for c in planted) == sorted([*TORCH_COMPONENTS, *ACCUMULATION_COMPONENTS, STEP_COUNTER])
    assert all(OMISSIONS[c.omit] == c.expected for c in planted)
    # Keras: every piece but the learning rate, which a schedule computes from the iterations (planted there)
    keras = [c for c in demo.KERAS_CONTROLS if c.omit]
    assert sorted(c.expected for c in keras) == sorted({*KERAS_COMPONENTS, STEP_COUNTER} - {"lr_scheduler"})
    assert all(KERAS_OMISSIONS[c.omit] == c.expected and c.framework == "tensorflow" for c in keras)
    assert demo.entry(keras[0], 3)["spec"]["command"][:3] == ["python", "-m", demo.SCRIPTS["tensorflow"]]
    weights = next(c for c in planted if c.omit == "weights")
    assert demo.right(weights, {"verdict": "not_restored", "missing": ["parameters"]})
    assert not demo.right(weights, {"verdict": "not_restored", "missing": ["parameters", "torch_rng"]})
    assert not demo.right(demo.CONTROLS[0], {"verdict": "not_restored", "missing": ["unseen"]})
    seen = {}

    def fake(controls=demo.CONTROLS, *, seeds, workers=2, progress=None):
        seen["seeds"] = list(seeds)
        rows = [demo.ResumeRow(c.name, c.expected, c.at, len(seeds), len(seeds), (c.expected,) if c.expected else (), 1.0)
                for c in controls]
        for row in rows:
            progress(row)
        return rows

    monkeypatch.setattr(demo, "run_controls", fake)
    args = build_parser().parse_args(["demo", "--controls", "--resume", "--seeds", "2"])
    assert args.func(args) == 0 and seen["seeds"] == [0, 1]
    out = capsys.readouterr().out
    assert "| LR scheduler not loaded " in out and "2 of 2" in out and "27 of 27 controls judged as required" in out
    assert "| Keras: TF RNG not restored" in out


def test_a_control_row_keeps_why_each_wrong_seed_was_judged_otherwise_and_a_failed_run_does_not_end_the_table(
        monkeypatch):
    """A seed whose check names nothing, or whose run failed (a time limit on a loaded machine), counts as
    wrong and says why in the row, with the launches' exit statuses; the other seeds are still judged."""
    from steady.server.cli.demo import resume_controls as demo

    control = demo.KERAS_CONTROLS[0]  # a faithful resume: identical is required
    killed_early = {"verdict": "failed", "missing": [], "reason": "launch 1 was to be killed after update 6 but ended "
                    "first (exit status 0)", "launches": [{"rc": 0, "tail": ""}]}
    results = [{"ok": True, "digests": {"resume": {"verdict": "identical", "missing": []}}},
               {"ok": True, "digests": {"resume": killed_early}},
               {"ok": False, "failure_kind": "timeout", "error": "run exceeded its time limit of 600 s and was killed",
                "digests": {}}]
    seen = {}

    def execute(entries, *, failed_ok=False):
        seen["failed_ok"] = failed_ok
        return results

    monkeypatch.setattr(demo, "_execute", execute)
    row = demo.run_control(control, [0, 1, 2])
    assert seen["failed_ok"] and (row.right, row.seeds, row.ok, row.named) == (1, 3, False, ())
    assert row.wrong == ("seed 1: failed, named nothing; launches' exit statuses 0; launch 1 was to be killed after "
                         "update 6 but ended first (exit status 0)",
                         "seed 2: the run failed (timeout): run exceeded its time limit of 600 s and was killed")
