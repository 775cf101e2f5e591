"""Slurm: one job array whose tasks each run an agent until the study has nothing left.

Plain ``sbatch`` rather than submitit: the job only runs ``steady worker``, a command, not a
pickled Python callable, so there is nothing for submitit to serialise; a batch script is
what Slurm sites read, audit and rerun by hand (``--dry-run`` prints it), it needs no extra
dependency on the login node, and it works with any Slurm version's ``sbatch``.

Each array task asks for ``--gpus-per-task`` GPUs; Slurm binds them and sets
``CUDA_VISIBLE_DEVICES`` (and ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``) for the task, and the
agent's default device (auto) uses exactly the GPUs it was given. The worker token reaches
the job through the environment of ``sbatch`` (Slurm exports the submitting environment by
default), never through the script file.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Slurm's own spelling of times: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}|UNLIMITED|INFINITE)$")


class LaunchError(Exception):
    pass


@dataclass(frozen=True)
class SlurmLaunch:
    study_id: int
    server: str
    tasks: int
    gpus_per_task: int = 1
    cpus_per_task: int = 2
    partition: str | None = None
    time: str | None = None
    mem: str | None = None
    account: str | None = None
    output_dir: str = "."
    agent_command: str = ""  # default: this interpreter's ``-m steady.worker``
    # On scancel or preemption Slurm sends SIGTERM, then SIGKILL after KillWait (30 s by
    # default): the agent lets its run finish for this long, else releases it to the queue.
    grace_s: float = 20.0
    worker_args: tuple[str, ...] = ()
    extra_sbatch: tuple[str, ...] = field(default_factory=tuple)  # further "#SBATCH" options, verbatim

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise LaunchError("--tasks must be at least 1")
        if self.grace_s < 0:
            raise LaunchError("--grace must be >= 0")
        if self.gpus_per_task < 0 or self.cpus_per_task < 1:
            raise LaunchError("--gpus-per-task must be >= 0 and --cpus-per-task >= 1")
        if self.time is not None and not _TIME.match(self.time):
            raise LaunchError(f"--time {self.time!r} is not a Slurm time (e.g. 90, 4:00:00, 1-12:00)")
        # The batch script is lines: a newline in a path or an option would start a line of its own
        # (a further #SBATCH directive, or a command run on every node). Checked as written into the script:
        # the output directory resolved (a relative one takes the working directory's name, which may hold a
        # newline) and the interpreter the default agent command names.
        resolved = str(Path(self.output_dir).resolve())
        texts = [("--output-dir", self.output_dir), ("--output-dir (resolved)", resolved),
                 ("--agent-command", self.agent_command or sys.executable), ("--server", self.server),
                 *(("--worker-arg", a) for a in self.worker_args), *(("--sbatch-option", o) for o in self.extra_sbatch)]
        for flag, text in texts:
            bad = sorted({c for c in text if ord(c) < 32 or ord(c) == 127 or 0x80 <= ord(c) <= 0x9f})
            if bad:
                raise LaunchError(f"{flag} {text!r} holds control characters ({', '.join(map(repr, bad))}): "
                                  "the batch script would run them as lines of their own")
        for name, value in (("partition", self.partition), ("account", self.account), ("mem", self.mem)):
            if value is not None and not re.match(r"^[A-Za-z0-9_.,:\-]+$", value):
                raise LaunchError(f"--{name} {value!r} has characters Slurm does not accept")

    @property
    def job_name(self) -> str:
        return f"steady-study-{self.study_id}"


def agent_argv(launch: SlurmLaunch) -> list[str]:
    base = shlex.split(launch.agent_command) if launch.agent_command else [sys.executable, "-m", "steady.worker"]
    return [*base, "--study", str(launch.study_id), "--exit-when-idle", "--grace", f"{launch.grace_s:g}",
            *launch.worker_args]


def batch_script(launch: SlurmLaunch) -> str:
    out = Path(launch.output_dir).resolve() / "steady-slurm-%A_%a.out"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={launch.job_name}",
        f"#SBATCH --array=0-{launch.tasks - 1}",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={launch.cpus_per_task}",
        f"#SBATCH --output={out}",
    ]
    if launch.gpus_per_task:
        lines.append(f"#SBATCH --gpus-per-task={launch.gpus_per_task}")
    for flag, value in (("partition", launch.partition), ("time", launch.time), ("mem", launch.mem),
                        ("account", launch.account)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH {opt}" for opt in launch.extra_sbatch]
    lines += [
        "",
        "# One Steady agent per array task: it leases this study's runs until none is queued or",
        "# running elsewhere, then exits 0. A cancelled or preempted task's run returns to the",
        "# queue (released on SIGTERM, or when its lease expires) and another task takes it.",
        f"export STEADY_SERVER={shlex.quote(launch.server)}",
        ': "${STEADY_TOKEN:?set STEADY_TOKEN (a worker token) in the environment of sbatch}"',
        'echo "steady: array task ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} on $(hostname)'
        ' CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-none}"',
        "exec " + " ".join(shlex.quote(a) for a in agent_argv(launch)) + ' --name "steady-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        "",
    ]
    return "\n".join(lines)


def submit(launch: SlurmLaunch, *, worker_token: str, script_path: Path) -> str:
    """Write the batch script, ``sbatch`` it, return the array's job id."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise LaunchError("sbatch not found: run steady launch slurm on a Slurm login node (or --dry-run)")
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(batch_script(launch))
    env = {**os.environ, "STEADY_TOKEN": worker_token}
    proc = subprocess.run([sbatch, "--parsable", str(script_path)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LaunchError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    if not (job_id.isascii() and job_id.isdigit()):
        raise LaunchError(f"sbatch printed {proc.stdout!r}, not a job id")
    return job_id
