"""Run one RunSpec in a fresh subprocess and collect what it reports.

The subprocess (``python -m steady.worker.inrun.harness``) starts in its own session, so it and anything
it forks (DataLoader workers) form one process group that :meth:`RunProcess.kill` ends
together. Its environment carries the determinism settings that must exist before the
interpreter starts. It reports through an append-only event file (see
:mod:`steady.worker.contract.events`) that :meth:`RunProcess.poll` reads incrementally; stdout and stderr go
to a pipe that the agent copies to ``output.log`` (:mod:`steady.worker.agent.tee`, which dates each
chunk so captured step lines get their arrival times); the tail of that file, at most
:data:`TAIL_LINES` lines, is reported with every run, completed or failed.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from steady.worker.contract import determinism, distributed, placeholders, resume, runfiles, sources
from steady.worker.agent import reaper
from steady.worker.agent.capture import DEFAULT_PATTERNS, SCAN_INTERVAL_S, Capture
from steady.worker.agent.conflicts import ConflictGuard
from steady.worker.agent.tee import OutputTee
from steady.worker.contract.crashline import crash_line
from steady.worker.contract.events import (
    CONFIG_FILE_ENV,
    EVENTS_ENV,
    SPEC_ENV,
    EventReader,
    control_events,
    step_in_range,
)

STDERR_TAIL_BYTES = 60_000  # characters of the output tail a run reports (the wire allows 65,536)
TAIL_LINES = 200  # and at most this many lines of it
_WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # steady.worker's folder
# steady's own folder: site-packages/steady for a wheel, which holds the worker folder; for an editable install
# the repository's steady/, which holds only __init__.py (pyproject.toml maps worker/ in as steady.worker)
_STEADY_DIR = os.path.dirname(os.path.abspath(sys.modules["steady"].__file__ or ""))
_SHIM_DIR = os.path.join(_WORKER_DIR, "inrun", "shim")
_REAPER = os.path.abspath(reaper.__file__)
_LINUX = sys.platform.startswith("linux")
COMMAND_SHIM_ENV = "STEADY_COMMAND_SHIM"
LOCALIZE_ENV = "STEADY_LOCALIZE"  # steady.worker.inrun.localize: "steps" records the step digests
# A fault to plant in the built-in fleet canary's runs (steady.worker.inrun.workloads.fleet_canary), set in the
# agent's environment: tests and demonstrations of `steady fleet check` make one worker of a pool faulty.
FAULT_ENV = "STEADY_FAULT"

# The only names a run subprocess inherits from the agent's environment (``--pass-env`` adds
# more). Everything else it gets is set here: HOME (its run directory), the determinism
# variables, the device narrowing and the run-scoped variables. The worker's own token never
# reaches it.
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES")
REDACTED = "[redacted]"


def scrub(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """``text`` with every occurrence of each secret replaced, so Steady's own credentials never
    end up in a run record (error text, stderr tail)."""
    for secret in secrets:
        if secret and len(secret) >= 8:
            text = text.replace(secret, REDACTED)
    return text


def run_environment(
    spec: dict[str, Any],
    *,
    run_dir: str,
    device: str | None,
    run_vars: dict[str, str] | None = None,
    pass_env: tuple[str, ...] | list[str] = (),
    base: dict[str, str] | None = None,
    python_path: tuple[str, ...] | list[str] = (),
) -> dict[str, str]:
    """The whole environment of a run subprocess, built from an allow-list.

    From ``base`` (the agent's environment) only :data:`INHERITED_ENV` and the operator's
    ``pass_env`` names are copied; then HOME and TMPDIR point into the run directory, the
    determinism level's variables are set, ``device`` narrows CUDA_VISIBLE_DEVICES, and
    ``run_vars`` (events file, spec file, run-scoped credential) are added. PYTHONPATH is a
    folder holding only the ``steady`` package (:func:`package_path`), then ``python_path`` (e.g.
    the run's unpacked code), then the agent's PYTHONPATH entries; never the agent's working
    directory, and nothing named ``app`` or ``worker`` that could shadow the user's own."""
    base = dict(os.environ if base is None else base)
    inherited = {k: base[k] for k in (*INHERITED_ENV, *pass_env) if k in base}
    env = determinism.subprocess_env(spec["determinism"], int(spec["seed"]), int(spec.get("threads") or 2), base=inherited)
    env.setdefault("PATH", os.defpath)
    env["HOME"] = run_dir
    env["TMPDIR"] = os.path.join(run_dir, "tmp")
    env.update(device_env(device))
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_path(), *python_path, base.get("PYTHONPATH")) if p)
    env.update(run_vars or {})
    return env


def package_path() -> str:
    """A folder holding only the ``steady`` package: the first PYTHONPATH entry of every run, so a
    run's interpreter (the agent's or the user's own) imports ``steady`` and nothing else of the
    agent's: not the folder ``steady`` was installed from (a checkout holds ``app/``, ``worker/``
    and ``tests/``), not the agent's site-packages. Its ``steady`` links to the installed package's
    ``__init__.py`` and worker folder (the two a run imports, wherever the install put them). One
    per user and install, made once and atomically (``os.replace`` of a finished folder), readable
    by a ``--run-as`` user."""
    parts = {"__init__.py": os.path.join(_STEADY_DIR, "__init__.py"), "worker": _WORKER_DIR}
    key = hashlib.sha256("|".join(parts.values()).encode()).hexdigest()[:16]
    home = os.path.join(tempfile.gettempdir(), f"steady-path-{os.getuid()}-{key}")
    if _links_in_place(os.path.join(home, "steady"), parts):
        return home
    fresh = tempfile.mkdtemp(prefix=f"{os.path.basename(home)}.", dir=os.path.dirname(home))
    os.chmod(fresh, 0o755)
    os.mkdir(os.path.join(fresh, "steady"), 0o755)
    for name, target in parts.items():
        os.symlink(target, os.path.join(fresh, "steady", name))
    try:
        os.replace(fresh, home)  # fails if another process made it first (a non-empty folder): use theirs
    except OSError:
        shutil.rmtree(fresh, ignore_errors=True)
        if not _links_in_place(os.path.join(home, "steady"), parts):
            raise RuntimeError(f"{home} exists and does not hold links to {_STEADY_DIR} and {_WORKER_DIR}") from None
    return home


def _links_in_place(folder: str, parts: dict[str, str]) -> bool:
    try:  # (a run's interpreter may add a __pycache__ beside them)
        return all(os.readlink(os.path.join(folder, n)) == t for n, t in parts.items())
    except OSError:
        return False


def last_lines(text: str, n: int) -> str:
    """The last ``n`` lines of ``text`` (a trailing newline does not count as a line)."""
    end = len(text) - 1 if text.endswith("\n") else len(text)
    cut = end
    for _ in range(n):
        cut = text.rfind("\n", 0, cut)
        if cut < 0:
            return text
    return text[cut + 1:]


@dataclass(frozen=True)
class RunAs:
    """An unprivileged account the run subprocess becomes (``steady worker --run-as USER``)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def lookup(cls, name: str) -> RunAs:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"--run-as: no such user {name!r}") from None
        if pw.pw_uid == 0:
            raise ValueError("--run-as: the run user must not be root")
        return cls(name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(name, pw.pw_gid)))

    def can_read(self, path: str) -> bool:
        """Whether this user may read ``path`` by its mode bits (owner, then group, then others;
        ACLs aside): the agent refuses a ``--token-file`` its runs could read."""
        st = os.stat(path)
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IRUSR)
        if st.st_gid == self.gid or st.st_gid in self.groups:
            return bool(st.st_mode & stat.S_IRGRP)
        return bool(st.st_mode & stat.S_IROTH)


def _chown_tree(path: str, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def _load_libc() -> Any:
    """libc through ctypes, loaded in the agent: the child runs :func:`_die_with_parent` after it became
    the ``--run-as`` user, who may not be allowed to list the interpreter's folders to import ctypes."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except (ImportError, OSError):
        return None


_LIBC = _load_libc() if sys.platform.startswith("linux") else None


def _check_program(program: str, env: dict[str, str], cwd: str) -> None:
    """FileNotFoundError, as ``Popen`` would raise, for a program that is not there: the reaper execs it in
    a child, where a missing program would only be an exit status 127."""
    if os.sep in program:
        found = os.path.isfile(os.path.join(cwd, program)) and os.access(os.path.join(cwd, program), os.X_OK)
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (or not executable)", program)


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL it when the agent thread that started it
    dies, so a SIGKILLed agent leaves no orphaned training process behind."""
    try:
        if _LIBC is not None:
            _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def device_env(device: str | None) -> dict[str, str]:
    """``--device`` -> environment: 'cuda:3' narrows CUDA_VISIBLE_DEVICES to GPU 3 (the run
    sees it as cuda:0); 'cpu' hides all GPUs; None leaves the choice to the run."""
    if device is None or device == "auto":
        return {"STEADY_DEVICE": "auto"}
    if device == "cpu":
        return {"STEADY_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    if device.startswith("cuda"):
        _, _, index = device.partition(":")
        env = {"STEADY_DEVICE": "cuda"}
        if index:
            env["CUDA_VISIBLE_DEVICES"] = index
        return env
    raise ValueError(f"unsupported device {device!r}: use cpu, cuda or cuda:N")


@dataclass
class Collected:
    """Everything the run reported, accumulated from its events."""

    fingerprint: dict[str, Any] = field(default_factory=dict)
    determinism_applied: dict[str, Any] = field(default_factory=dict)
    digests: dict[str, Any] = field(default_factory=lambda: {"data_order": {}})
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    last_step: int | None = None
    captured: dict[str, float] = field(default_factory=dict)  # last values captured without the SDK

    def absorb(self, event: dict[str, Any]) -> None:
        kind = event.get("e")
        if kind == "m":
            self.last_step = event["s"] if self.last_step is None else max(self.last_step, event["s"])
        elif kind == "digest":
            if event["kind"] == "data_order":
                self.digests["data_order"][int(event["epoch"])] = event["value"]
            elif event["kind"] in ("resume", "distributed", "rank_state"):  # records (resume check, ranks)
                if not isinstance(event["value"], dict):
                    raise TypeError(f"a {event['kind']} record is an object")
                self.digests[event["kind"]] = event["value"]
            else:
                self.digests[event["kind"]] = event["value"]
        elif kind == "fingerprint":
            self.fingerprint = event["value"]
        elif kind == "determinism" or kind == "info":
            self.determinism_applied.update(event["value"])
        elif kind == "result":
            self.result = event
        elif kind == "error":
            self.error = event

    def digests_model(self) -> dict[str, Any]:
        orders = self.digests.get("data_order", {})
        return {
            "initial_weights": self.digests.get("initial_weights"),
            "data_order": [orders[k] for k in sorted(orders)],
            "final_weights": self.digests.get("final_weights"),
            "optimizer_state": self.digests.get("optimizer_state"),
            "resume": self.digests.get("resume"),
            "distributed": self.digests.get("distributed"),
        }


@dataclass
class Outcome:
    ok: bool
    kind: str | None = None  # FailureKind value when not ok
    error: str = ""
    stderr_tail: str = ""
    returncode: int | None = None
    wall_s: float = 0.0


class RunProcess:
    def __init__(
        self,
        spec: dict[str, Any],
        *,
        run_dir: str,
        device: str | None = None,
        python: str | None = None,
        run_vars: dict[str, str] | None = None,
        secrets: list[str] | tuple[str, ...] = (),
        run_as: RunAs | None = None,
        pass_env: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.spec = dict(spec)
        self.run_vars = dict(run_vars or {})
        # never written into a record: the worker token and the run token
        self.secrets = tuple(s for s in (*secrets, *self.run_vars.get("STEADY_RUN_TOKEN", "").split()) if s)
        self.run_as = run_as
        self.pass_env = tuple(pass_env)
        self.run_dir = os.path.abspath(run_dir)
        self.device = device
        self.python = python or sys.executable
        self.events_path = os.path.join(self.run_dir, "events.jsonl")
        self.output_path = os.path.join(self.run_dir, "output.log")
        self.spec_path = os.path.join(self.run_dir, "spec.json")
        self.reader = EventReader(self.events_path)
        self.collected = Collected()
        self.guard = ConflictGuard()
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self._kill_reason: str | None = None
        self._outcome: Outcome | None = None
        self.code_dir: str | None = None  # the unpacked study code (steady.worker.agent.codecache), if it ships any
        self.capture: Capture | None = None
        self.tee: OutputTee | None = None
        self._captured_at = 0.0
        self._refused: dict[str, str] = {}  # files under run_dir the agent would not open (runfiles)
        self.bad_events = 0  # events skipped: a step outside int64, values that are no numbers, a missing field

    # --- the study's code: where the run starts and what it runs ------------------------------

    def working_dir(self) -> str:
        """The run's working directory: the spec's folder in its fresh copy of the code, else the run's
        own directory (never the agent's: user code must not see the agent's files)."""
        if self.code_dir is None:
            return self.run_dir
        return os.path.normpath(os.path.join(self.code_dir, self.spec.get("code_workdir") or "."))

    def code_path(self) -> list[str]:
        """PYTHONPATH entries for the code: its working directory, then the archive's top (modules)."""
        if self.code_dir is None:
            return []
        return list(dict.fromkeys([self.working_dir(), self.code_dir]))

    def argv_as_run(self) -> list[str] | None:
        """A command workload's argv as it ran (placeholders filled; the worker's secrets scrubbed),
        for the run's record; None for built-in workloads and entrypoints (the harness runs those)."""
        if not self.spec.get("command"):
            return None
        return [scrub(arg, self.secrets) for arg in self.argv()]

    def argv(self) -> list[str]:
        """The harness for built-in workloads and entrypoints; a command workload's own argv with
        its placeholders filled (``python``/``python3`` as first word: the worker's interpreter)."""
        command = self.spec.get("command")
        if not command:
            return [self.python, "-m", "steady.worker.inrun.harness"]
        # names only, even if the server let one by
        return placeholders.fill_command(command, self.placeholder_values(), self.python)

    def placeholder_values(self) -> dict[str, Any]:
        return {
            "seed": self.spec["seed"], "repeat": self.spec.get("repeat") or 0, "determinism": self.spec["determinism"],
            "device": device_env(self.device)["STEADY_DEVICE"], "run_dir": self.run_dir,
            "threads": self.spec.get("threads") or 2, "checkpoint_dir": self.checkpoint_dir(),
            **sources.placeholder_values(seed=int(self.spec["seed"]), params=self.spec.get("params") or {}),
        }

    def checkpoint_dir(self) -> str:
        """Where the code keeps its checkpoints (``{checkpoint_dir}``, ``ctx.checkpoint_dir``); the resume
        check gives each of its launches its own (steady.worker.inrun.resume)."""
        return os.path.join(self.run_dir, "checkpoints")

    def resume_plan(self) -> dict[str, Any] | None:
        """What the resume check's driver needs to start the code again (None: no resume check)."""
        resume = self.spec.get("resume")
        if not resume:
            return None
        values = self.placeholder_values()
        return {"at": list(resume["at"]), "signal": resume.get("signal") or "kill",
                "micro_batches": resume.get("micro_batches"),
                "command": self.spec.get("command"), "values": values,
                "shim_env": COMMAND_SHIM_ENV if self.spec.get("command") else None,
                "python": self.python, "run_dir": self.run_dir, "determinism": self.spec["determinism"]}

    def distributed_plan(self) -> dict[str, Any] | None:
        """What the multi-process driver needs (None: one process): the ranks' count and backend, and the argv
        each rank runs (a ``torchrun`` command's script, with the worker playing torchrun)."""
        spec = self.spec.get("distributed")
        command = self.spec.get("command")
        launch = distributed.torchrun_launch(command) if command else None
        if not spec and launch is None:
            return None
        if launch is not None:
            nproc, rank_command = launch
            argv = placeholders.fill_command(rank_command, self.placeholder_values(), self.python)
        else:
            nproc = int((spec or {})["nproc"])
            argv = self.argv()
        return {"nproc": nproc, "backend": (spec or {}).get("backend") or "gloo", "argv": argv,
                "run_dir": self.run_dir, "shim_env": COMMAND_SHIM_ENV if command else None}

    def environment(self) -> dict[str, str]:
        env = run_environment(
            self.spec, run_dir=self.run_dir, device=self.device, pass_env=self.pass_env,
            run_vars={**self.run_vars, EVENTS_ENV: self.events_path, SPEC_ENV: self.spec_path},
            python_path=(*self.shim_path(), *self.code_path()),
        )
        if self.spec.get("config_file"):
            env[CONFIG_FILE_ENV] = os.path.join(self.run_dir, "config", os.path.basename(self.spec["config_file"]["name"]))
        env[resume.CHECKPOINT_ENV] = self.checkpoint_dir()
        plan = self.resume_plan()
        if plan is not None:  # the driver's interpreter must not set up a run: it gives each launch the shim
            env[resume.PLAN_ENV] = json.dumps(plan)
        elif (dist := self.distributed_plan()) is not None:  # the driver gives each rank the shim
            env[distributed.PLAN_ENV] = json.dumps(dist)
        elif self.spec.get("command"):
            env[COMMAND_SHIM_ENV] = "1"
        fault = os.environ.get(FAULT_ENV)
        if fault and self.spec.get("workload") == "fleet_canary":  # a planted fault: the canary's only
            env[FAULT_ENV] = fault
        if self.spec.get("localize_steps") and LOCALIZE_ENV not in env:  # a replay sets its own mode
            env[LOCALIZE_ENV] = "steps"
        return env

    def shim_path(self) -> list[str]:
        """A command workload starts with worker/inrun/shim on PYTHONPATH: its ``sitecustomize`` applies
        the determinism level in-process and records the fingerprint and result (steady.worker.inrun.shim)."""
        return [_SHIM_DIR] if self.spec.get("command") else []

    def start(self) -> None:
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        for path in (self.events_path, self.output_path):
            if os.path.exists(path):
                os.remove(path)
        os.makedirs(os.path.join(self.run_dir, "tmp"), mode=0o700, exist_ok=True)
        os.makedirs(self.checkpoint_dir(), mode=0o700, exist_ok=True)
        spec = dict(self.spec, device=device_env(self.device)["STEADY_DEVICE"], work_dir=self.run_dir)
        config = spec.get("config_file")
        if config:  # an arm's config file: written per run, its path in the env and in params
            path = os.path.join(self.run_dir, "config", os.path.basename(config["name"]))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            runfiles.write_new(path, self.run_dir, config["content"].encode("utf-8"))
            spec["params"] = dict(spec.get("params") or {}, config_file=path)
        runfiles.write_new(self.spec_path, self.run_dir, json.dumps(spec).encode("utf-8"))
        identity: dict[str, Any] = {}
        if self.run_as is not None:
            _chown_tree(self.run_dir, self.run_as.uid, self.run_as.gid)
            # setgid + initgroups + setuid in the child, before exec (the agent stays root)
            identity = {"user": self.run_as.uid, "group": self.run_as.gid, "extra_groups": list(self.run_as.groups)}
        self.capture = self._capture()
        argv, env = self.argv(), self.environment()
        dist = None if self.spec.get("resume") else self.distributed_plan()
        _check_program((dist["argv"] if dist else argv)[0], env, self.working_dir())
        if self.spec.get("resume"):  # the driver starts the code itself, once per launch of the check
            argv = [self.python, "-m", resume.DRIVER_MODULE]
        elif dist is not None:  # the driver starts one copy of the code per rank (it plays torchrun)
            argv = [self.python, "-m", distributed.DRIVER_MODULE]
        if _LINUX:  # through the run's own subreaper: no daemon it starts outlives it (steady.worker.agent.reaper)
            argv = [self.python, "-I", "-S", _REAPER, *argv]
        # never through a link, even one planted before the child starts
        out_fd = runfiles.open_fd(self.output_path, self.run_dir, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: kill() reaches DataLoader workers too
                preexec_fn=_die_with_parent if _LINUX else None,
                cwd=self.working_dir(),  # its own directory (or its code's), never the agent's
                **identity,
            )
        except BaseException:
            for fd in (read_fd, out_fd):
                os.close(fd)
            raise
        finally:
            os.close(write_fd)  # the run holds the only write end: end of file when it (and its children) exit
        self.tee = OutputTee(read_fd, out_fd)
        self.tee.start()
        if self.capture is not None:
            self.capture.arrival = self.tee.arrival
        self.started_at = time.monotonic()

    def _capture(self) -> Capture | None:
        """TensorBoard files under the run's directory (the code's copy is inside it) and
        output lines matching the spec's patterns; a command gets both by default."""
        spec = self.spec.get("capture")
        if spec is None:
            if not self.spec.get("command"):
                return None
            spec = {}
        tensorboard = spec.get("tensorboard", True)
        stdout, preset = spec.get("stdout", True), spec.get("preset")
        patterns = (spec.get("patterns") or ([] if preset else list(DEFAULT_PATTERNS))) if stdout else []
        if not tensorboard and not patterns and not (stdout and preset):
            return None
        return Capture(events_path=self.events_path, output_path=self.output_path, roots=[self.run_dir],
                       tensorboard=tensorboard, patterns=patterns, preset=preset if stdout else None)

    def _pump_capture(self) -> None:
        if self.capture is not None and time.monotonic() - self._captured_at >= SCAN_INTERVAL_S:
            self._captured_at = time.monotonic()
            self.capture.pump()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at if self.started_at else 0.0

    def poll(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        """New events since the last call (also absorbed into :attr:`collected`); at most about
        ``max_bytes`` of the file per call (``None``: all of it). The rest stays in the file."""
        self._pump_capture()
        events = []
        for event in self.reader.read_new(max_bytes):
            if not self._admissible(event):  # a hostile or broken line costs its run a warning, nothing more
                self.bad_events += 1
                continue
            events.append(event)
            self.collected.absorb(event)
            if self.capture is not None and event.get("e") == "m" and "c" not in event:
                self.capture.sdk_keys.update(event["v"])  # a key the run logs itself is not captured
            if event.get("e") == "m":  # a second, different value for a (key, step) is recorded, not sent
                event["v"] = self.guard.admit(event)
        return events

    def _admissible(self, event: Any) -> bool:
        """Whether an event can be taken as the run's: a metric event needs an int64 step and numbers
        (a value that is no float is dropped, its event's other values kept), the others their fields."""
        if not isinstance(event, dict):
            return False
        if event.get("e") == "m":
            values = event.get("v")
            if not step_in_range(event.get("s")) or not isinstance(values, dict):
                return False
            kept = {}
            for key, value in values.items():
                if isinstance(key, str) and isinstance(value, (int, float)) and not isinstance(value, bool):
                    try:
                        kept[key] = float(value)
                    except OverflowError:  # an int beyond float (10**400)
                        continue
            if len(kept) < len(values):
                self.bad_events += 1
                event["v"] = kept
            # dtypes, printed units, held values (a captured value of a key the SDK logs): well-formed or left out
            for extra, kind in (("t", str), ("r", (int, float)), ("h", (int, float))):
                given = event.get(extra)
                if given is not None and not (isinstance(given, dict) and all(
                        isinstance(k, str) and isinstance(v, kind) and not isinstance(v, bool) for k, v in given.items())):
                    del event[extra]
            return bool(kept) or not values or bool(event.get("h"))
        try:  # what absorb() reads of the other kinds, checked on a copy of the record
            Collected().absorb(event)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            return False
        return True

    def consumed(self) -> int:
        """Bytes of the event file read so far (grows on a read that skipped an oversized line, too)."""
        return self.reader.consumed

    def unread_bytes(self) -> int:
        """Bytes of events the run wrote that :meth:`poll` has not returned yet."""
        return self.reader.unread_bytes()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, reason: str) -> None:
        """SIGKILL the whole process group; ``reason`` is a FailureKind value."""
        if self._kill_reason is None:
            self._kill_reason = reason
        self._killpg()

    def _killpg(self) -> None:
        if self.proc is None:
            return
        if _LINUX and self.proc.poll() is None:
            reaper.end_tree(self.proc.pid)  # first what left the group (a setsid daemon), then the group
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def check_time_limit(self) -> bool:
        limit = float(self.spec.get("time_limit_s") or 0)
        if limit and self.running() and self.elapsed() > limit:
            self.kill("timeout")
            return True
        return False

    def stderr_tail(self, limit: int = STDERR_TAIL_BYTES) -> str:
        """The end of the run's output (secrets scrubbed), then one line per file the agent refused
        to read (a symlink, FIFO or device the run put in its directory: :mod:`steady.worker.contract.runfiles`)."""
        text = ""
        try:  # margin: a secret cut by the window is still whole
            raw = runfiles.read_tail(self.output_path, self.run_dir, limit + 512)
            text = scrub(raw.decode("utf-8", "replace"), self.secrets)
        except runfiles.UnsafeFileError as exc:
            self._refused.setdefault(exc.path, exc.reason)
        except OSError:
            pass
        text = last_lines(text, TAIL_LINES)
        notes = "\n".join(self.warnings())[-limit:]
        room = limit - len(notes) - 1  # the notes come last: the agent keeps the end of the tail
        if not notes:
            return text[-limit:]
        return text[-room:] + "\n" + notes if text and room > 0 else notes

    def warnings(self) -> list[str]:
        """One line per file under the run directory the agent refused to open, and why."""
        refused = dict(self._refused)
        if self.reader.refused is not None:
            refused.setdefault(self.events_path, self.reader.refused)
        if self.capture is not None:
            for path, reason in self.capture.skipped.items():
                refused.setdefault(path, reason)
        lines = [f"[steady] skipped {os.path.relpath(path, self.run_dir)}: {reason}; the worker reads only "
                 "regular files inside the run directory" for path, reason in sorted(refused.items())]
        if self.reader.oversized:
            lines.append(f"[steady] skipped {self.reader.oversized} line(s) of events.jsonl over "
                         f"{self.reader.max_line_bytes} bytes")
        if self.bad_events:
            lines.append(f"[steady] skipped {self.bad_events} event(s) or value(s) of events.jsonl: a step outside "
                         "the 64-bit signed range, a value that is no number or a missing field")
        if self.capture is not None:
            lines += [f"[steady] {note}" for note in self.capture.notes()]
        return lines

    def wait(self, timeout: float | None = None) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def outcome(self) -> Outcome:
        """Call once the process has exited: reap stragglers, read the last events, classify."""
        if self._outcome is not None:
            return self._outcome
        assert self.proc is not None
        rc = self.proc.wait()
        self._killpg()  # leftover children (e.g. DataLoader workers) of an exited run
        if self.tee is not None:  # the last bytes of the pipe into output.log, before the capture and the tail read it
            self.tee.close()
        if self.capture is not None:  # what the run wrote last, appended before the last reads
            self.capture.close()
            self.collected.captured = dict(self.capture.last)
            self.guard.restart, self.guard.restarts = self.capture.restart, self.capture.restarts
        # What the run reported about itself may lie behind a metric backlog that poll() has not
        # reached: read it without the metric lines (absorbing an event twice changes nothing),
        # and leave those to later poll() calls.
        for event in control_events(self.events_path, self.reader.offset):
            if isinstance(event, dict) and event.get("e") != "m" and self._admissible(event):
                self.collected.absorb(event)
        wall = self.elapsed()
        tail = self.stderr_tail()
        c = self.collected
        if self._kill_reason == "timeout":
            limit = float(self.spec.get("time_limit_s") or 0)
            out = Outcome(False, "timeout", f"run exceeded its time limit of {limit:g} s and was killed", tail, rc, wall)
        elif self._kill_reason is not None:
            out = Outcome(False, self._kill_reason, f"run was killed ({self._kill_reason})", tail, rc, wall)
        elif rc == 0 and (c.result is not None or self.spec.get("command")):  # a command need not use the SDK
            out = Outcome(True, None, "", tail, rc, wall)
        elif c.error is not None:
            out = Outcome(False, "error", scrub(c.error.get("error", "error"), self.secrets), tail, rc, wall)
        elif rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = str(-rc)
            out = Outcome(False, "crash", f"run process was killed by signal {name}", tail, rc, wall)
        else:
            line = crash_line(tail)
            error = (f"{line} (the run exited with status {rc})" if line
                     else f"run process exited with status {rc} without reporting a result")
            out = Outcome(False, "error", error, tail, rc, wall)
        self._outcome = out
        return out
