"""``steady demo --controls --resume``: planted omissions prove that the resume check names what a resume forgot.

Each control is the training script ``worker/inrun/workloads/resume_controls.py`` (a small MLP with
dropout, Adam and a StepLR schedule, fed by a two-worker DataLoader with per-item noise from the
workers' torch RNG, and with noise from Python's and NumPy's global RNGs in the loop) submitted as a
command with the resume check at ``strict``: trained uninterrupted, then killed after update 6 (mid
epoch: 4 batches an epoch) and restarted from its checkpoint, with ``--omit`` forgetting exactly one
piece of the state it saves (two more controls scale the loss with a ``torch.amp.GradScaler``). The
runs go through the worker's own path (``python -m steady.worker.agent.local``: the agent's runner,
the resume driver, the command shim), no server. A row passes when every seed's check names exactly
the omitted piece, and the faithful resumes (one and two resume points, and with a scaler) are
judged identical for every seed.

The Keras controls (``worker/inrun/workloads/resume_controls_keras.py``: a ``tf.function`` train step,
``Dropout``, Adam on an ``ExponentialDecay`` schedule, a reshuffling ``tf.data`` pipeline, one
``tf.train.Checkpoint``) run the same way with ``framework: tensorflow``; ``--only Keras`` selects them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from steady.server.cli.demo.controls import _execute, markdown_table
from steady.worker.contract.resume import LABELS

SCRIPTS = {"torch": "steady.worker.inrun.workloads.resume_controls",
           "tensorflow": "steady.worker.inrun.workloads.resume_controls_keras"}
SCRIPT = SCRIPTS["torch"]
AT = (6,)


ACCUMULATE = ("--accumulate", "2")


@dataclass(frozen=True)
class ResumeControl:
    name: str
    omit: str | None  # the script's --omit; None: a faithful resume
    expected: str | None  # the component the check must name; None: identical
    at: tuple[int, ...] = AT
    args: tuple[str, ...] = ()  # more arguments of the script
    framework: str = "torch"
    micro_batches: int | None = None  # resume.micro_batches: the stop falls between micro-batches


CONTROLS: tuple[ResumeControl, ...] = (
    ResumeControl("faithful resume", None, None),
    ResumeControl("faithful resume, two resume points", None, None, at=(3, 6)),
    ResumeControl("model weights not loaded", "weights", "parameters"),
    ResumeControl("optimizer moments not loaded", "optimizer", "optimizer_state"),
    ResumeControl("LR scheduler not loaded", "scheduler", "lr_scheduler"),
    ResumeControl("step counter not restored", "step", "step_counter"),
    ResumeControl("Python RNG not restored", "python_rng", "python_rng"),
    ResumeControl("NumPy RNG not restored", "numpy_rng", "numpy_rng"),
    ResumeControl("torch RNG not restored", "torch_rng", "torch_rng"),
    ResumeControl("loader cursor not restored (epoch restarts)", "loader_cursor", "data"),
    ResumeControl("loader generator not restored (worker seeds)", "loader_generator", "loader_worker_seeds"),
    ResumeControl("faithful resume with a gradient scaler", None, None, args=("--grad-scaler",)),
    ResumeControl("gradient scaler not loaded", "grad_scaler", "grad_scaler", args=("--grad-scaler",)),
    # stopped after the first of two micro-batches of update 7 (mid-epoch: 13 of 24 loader batches done)
    ResumeControl("faithful resume mid-accumulation", None, None, args=ACCUMULATE, micro_batches=1),
    ResumeControl("faithful resume from the last update (no mid-accumulation checkpoint)", None, None,
                  args=(*ACCUMULATE, "--update-checkpoints-only"), micro_batches=1),
    ResumeControl("accumulated gradient not restored", "accumulated_grads", "accumulated_gradients", args=ACCUMULATE,
                  micro_batches=1),
    ResumeControl("micro-batch counter not restored", "micro_batch", "micro_batch_counter", args=ACCUMULATE,
                  micro_batches=1),
)
KERAS = "tensorflow"
KERAS_CONTROLS: tuple[ResumeControl, ...] = (
    ResumeControl("Keras: faithful resume (tf.train.Checkpoint)", None, None, framework=KERAS),
    ResumeControl("Keras: faithful resume, two resume points", None, None, at=(3, 6), framework=KERAS),
    ResumeControl("Keras: weights not restored", "weights", "parameters", framework=KERAS),
    ResumeControl("Keras: optimizer moments not restored", "optimizer", "optimizer_state", framework=KERAS),
    ResumeControl("Keras: optimizer iterations not restored (LR schedule step)", "iterations", "optimizer_iterations",
                  framework=KERAS),
    ResumeControl("Keras: step counter not restored", "step", "step_counter", framework=KERAS),
    ResumeControl("Keras: Python RNG not restored", "python_rng", "python_rng", framework=KERAS),
    ResumeControl("Keras: NumPy RNG not restored", "numpy_rng", "numpy_rng", framework=KERAS),
    ResumeControl("Keras: TF RNG not restored (SeedGenerator, tf.random.Generator)", "tf_rng", "tf_rng",
                  framework=KERAS),
    ResumeControl("Keras: tf.data iterator not restored (epoch restarts)", "data_cursor", "data", framework=KERAS),
)
ALL_CONTROLS = CONTROLS + KERAS_CONTROLS


@dataclass(frozen=True)
class ResumeRow:
    control: str
    expected: str | None
    at: tuple[int, ...]
    seeds: int
    right: int  # seeds whose check gave exactly the expected verdict and names
    named: tuple[str, ...]  # what the checks named, all seeds together
    seconds: float
    micro_batches: int | None = None
    wrong: tuple[str, ...] = ()  # per seed judged otherwise: what the check said and why

    @property
    def ok(self) -> bool:
        return self.right == self.seeds


def entry(control: ResumeControl, seed: int, *, workers: int = 2) -> dict:
    command = ["python", "-m", SCRIPTS[control.framework], "--checkpoint-dir", "{checkpoint_dir}", "--seed", "{seed}",
               *(["--workers", str(workers)] if control.framework == "torch" else []), *control.args]
    if control.omit:
        command += ["--omit", control.omit]
    return {"spec": {"framework": control.framework, "command": command, "seed": seed, "repeat": 0, "determinism": "strict",
                     "threads": 1, "time_limit_s": 600,
                     "resume": {"at": list(control.at), **({"micro_batches": control.micro_batches}
                                                           if control.micro_batches else {})}}, "device": "cpu"}


def right(control: ResumeControl, record: dict | None) -> bool:
    """Whether one check judged as the control says: identical, or not restored naming exactly the piece."""
    if not record:
        return False
    if control.expected is None:
        return record.get("verdict") == "identical"
    return record.get("verdict") == "not_restored" and record.get("missing") == [control.expected]


def judged_otherwise(seed: int, result: dict) -> str:
    """One line for a seed whose check did not judge as required: the run's failure, or the check's verdict, the
    pieces it named, its reason and the exit status of each launch (the record itself is in the run's digests)."""
    record = result["digests"].get("resume")
    if not result["ok"] or not record:
        return f"seed {seed}: the run failed ({result.get('failure_kind')}): {result.get('error')}"
    launches = ", ".join(str(launch.get("rc")) for launch in record.get("launches") or []) or "none"
    return (f"seed {seed}: {record.get('verdict')}, named {', '.join(record.get('missing') or []) or 'nothing'}; "
            f"launches' exit statuses {launches}; {record.get('reason') or 'no reason given'}")


def run_control(control: ResumeControl, seeds: Sequence[int], *, workers: int = 2) -> ResumeRow:
    t0 = time.monotonic()
    results = _execute([entry(control, seed, workers=workers) for seed in seeds], failed_ok=True)
    records = [r["digests"].get("resume") if r["ok"] else None for r in results]
    named = tuple(sorted({c for rec in records if rec for c in rec.get("missing") or []}))
    wrong = tuple(judged_otherwise(seed, r) for seed, r, rec in zip(seeds, results, records) if not right(control, rec))
    return ResumeRow(control.name, control.expected, control.at, len(seeds), len(seeds) - len(wrong), named,
                     time.monotonic() - t0, control.micro_batches, wrong)


def run_controls(controls: Sequence[ResumeControl] = ALL_CONTROLS, *, seeds: Sequence[int] = range(5), workers: int = 2,
                 progress: Callable[[ResumeRow], None] | None = None) -> list[ResumeRow]:
    rows = []
    for control in controls:
        row = run_control(control, seeds, workers=workers)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


HEADER = ("omitted on resume", "resumed after update", "must be named", "judged as required", "named")


def _point(row: ResumeRow) -> str:
    at = ", ".join(map(str, row.at))
    return at if row.micro_batches is None else f"{at} + {row.micro_batches} micro-batch"


def format_table(rows: Sequence[ResumeRow]) -> str:
    return markdown_table(HEADER, [(r.control, _point(r), r.expected or "nothing (identical)",
                                    f"{r.right} of {r.seeds}", ", ".join(r.named) or "—") for r in rows])


def main(args) -> int:
    seeds = range(int(getattr(args, "seeds", None) or 5))
    controls = [c for c in ALL_CONTROLS if not getattr(args, "only", None) or any(o in c.name for o in args.only)]
    print(f"steady demo --controls --resume: {len(controls)} resume controls × {len(seeds)} seeds, each an "
          "uninterrupted run, a run killed after its resume step and its restart …", flush=True)

    def progress(row: ResumeRow) -> None:
        print(f"  {'ok   ' if row.ok else 'WRONG'} {row.control}: {', '.join(row.named) or 'identical'} "
              f"({row.right} of {row.seeds}, {row.seconds:.0f} s)", flush=True)
        for line in row.wrong:
            print(f"        {line}", flush=True)

    rows = run_controls(controls, seeds=seeds, progress=progress)
    print()
    print(format_table(rows))
    print("\nnames: " + "; ".join(f"{k}: {v}" for k, v in LABELS.items()))
    print(f"\n{sum(r.ok for r in rows)} of {len(rows)} controls judged as required for every seed.")
    return 0 if all(r.ok for r in rows) else 1
