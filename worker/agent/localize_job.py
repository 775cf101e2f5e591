"""One leased localization job: replay two repeats and name the first op where they part.

The replays are the CLI's (`steady localize`): the same driver, ``python -m steady.worker.agent.localize``,
in a child process, given the two runs' specs (from the lease) and the study's code (fetched and unpacked
as for a run). A heartbeat thread extends the lease and hears a cancel; the job's time limit, a cancel, a
lost lease or the agent's shutdown end the driver and every replay below it. The driver's answer (JSON on
its stdout) is posted as it is; no answer is a failure with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from steady.worker.agent import codecache, reaper
from steady.worker.agent.heartbeat import heartbeat_loop
from steady.worker.agent.client import LeaseLostError, NonRetryableError, RetryableError
from steady.worker.contract import codepack
from steady.worker.contract.protocol import (
    FailureKind,
    LocalizationDone,
    LocalizationFailure,
    LocalizationHeartbeat,
    LocalizationLease,
    LocalizationRelease,
)

log = logging.getLogger("steady.worker")
DRIVER = "steady.worker.agent.localize"
MAX_REASON = 4000
# The worker's own credentials never reach the driver (the replays' environment is allow-listed anyway).
_WITHHELD = ("STEADY_TOKEN", "STEADY_RUN_TOKEN", "MLFLOW_TRACKING_TOKEN")


def driver_argv(lease: LocalizationLease, folder: str, code_dir: str | None, device: str | None) -> list[str]:
    argv = [sys.executable, "-m", DRIVER]
    for i, spec in enumerate(lease.specs):
        path = os.path.join(folder, f"spec-{i}.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(spec.model_dump_json())
        argv.append(path)
    if code_dir is not None:
        argv += ["--code", code_dir]
    if lease.step is not None:
        argv += ["--step", str(lease.step)]
    if device:
        argv += ["--device", device]
    return argv


def _tail(path: str, n: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


class LocalizationExecution:
    """The job's thread (code, driver, report) and its heartbeat thread."""

    def __init__(self, agent: Any, lease: LocalizationLease) -> None:
        """``agent``: the :class:`~steady.worker.agent.loop.Agent` that leased the job (its client, config and
        stop events; not imported here, as the agent imports this module)."""
        self.agent = agent
        self.client = agent.client
        self.lease = lease
        self.config = agent.config
        self.cancel = threading.Event()
        self.lease_lost = threading.Event()
        self.release_requested = threading.Event()
        self.finished = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.folder = os.path.join(self.config.work_dir, f"localize-{lease.job_id}-attempt-{lease.attempt}-"
                                                         f"{lease.lease_id[:8]}")
        self.thread = threading.Thread(target=self._main, name=f"localize-{lease.job_id}", daemon=True)
        self.heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-localize-{lease.job_id}",
                                                 daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _heartbeat_loop(self) -> None:
        heartbeat_loop(
            lambda deadline_s: self.client.localization_heartbeat(
                self.lease.job_id, LocalizationHeartbeat(lease_id=self.lease.lease_id), deadline_s=deadline_s),
            heartbeat_seconds=self.lease.heartbeat_seconds, label=f"localization job {self.lease.job_id}",
            finished=self.finished, cancel=self.cancel, lease_lost=self.lease_lost)

    def _stop_reason(self) -> str | None:
        if self.lease_lost.is_set():
            return "the lease was lost"
        if self.cancel.is_set():
            return "the job was cancelled"
        if self.release_requested.is_set() or self.agent.force.is_set():
            return "the worker is shutting down"
        return None

    def _end_driver(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        reaper.end_tree(proc.pid)  # the replays first (each in its own session), then the driver
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
        proc.wait()

    def _try(self, call: Any) -> None:
        try:
            call()
        except LeaseLostError:
            log.warning("localization job %d: lease lost before the report", self.lease.job_id)
        except (RetryableError, NonRetryableError) as exc:
            log.error("localization job %d: report failed: %s", self.lease.job_id, exc)

    def _fail(self, kind: FailureKind, reason: str) -> None:
        self._try(lambda: self.client.localization_failed(self.lease.job_id, LocalizationFailure(
            lease_id=self.lease.lease_id, kind=kind, error=reason[:MAX_REASON] or "failed")))
        log.info("localization job %d: %s: %s", self.lease.job_id, kind.value, reason[:300])

    def _release(self) -> None:
        self._try(lambda: self.client.localization_release(
            self.lease.job_id, LocalizationRelease(lease_id=self.lease.lease_id)))
        log.info("localization job %d: released", self.lease.job_id)

    def _main(self) -> None:
        job = self.lease.job_id
        self.heartbeat_thread.start()
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            code_dir = None
            sha = self.lease.specs[0].code_sha256
            if sha:
                try:
                    code_dir = codecache.unpack_for_run(os.path.join(self.config.work_dir, "code-cache"), sha,
                                                        self.folder, self.client.fetch_code, self.config.code_limits,
                                                        self._stop_reason)
                except (codepack.CodeError, RetryableError, NonRetryableError, OSError) as exc:
                    self._stopped_or(FailureKind.error, f"the worker could not fetch or unpack the study's code "
                                                        f"{sha[:12]}: {exc}")
                    return
            out, err = os.path.join(self.folder, "answer.json"), os.path.join(self.folder, "driver.log")
            argv = driver_argv(self.lease, self.folder, code_dir, self.config.device)
            env = {k: v for k, v in os.environ.items() if k not in _WITHHELD}
            log.info("localization job %d: replaying runs %d and %d of study %d%s", job, *self.lease.run_ids,
                     self.lease.study_id, f" at step {self.lease.step}" if self.lease.step is not None else "")
            started = time.monotonic()
            with open(out, "wb") as stdout, open(err, "wb") as stderr:
                self.proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, env=env, cwd=self.folder,
                                             start_new_session=True)
                while self.proc.poll() is None:
                    if self._stop_reason() is not None:
                        break
                    if time.monotonic() - started > self.lease.time_limit_s:
                        self._end_driver()
                        self._fail(FailureKind.timeout, f"the replays ran past the job's time limit "
                                                        f"({self.lease.time_limit_s:.0f} s)")
                        return
                    time.sleep(0.1)
            if self.proc.poll() is None:
                self._end_driver()
                self._stopped_or(FailureKind.error, "stopped")
                return
            try:
                with open(out, encoding="utf-8") as f:
                    answer = json.load(f)
                done = LocalizationDone(lease_id=self.lease.lease_id, status=answer["status"], step=answer.get("step"),
                                        replays=int(answer.get("replays") or 0), answer=answer.get("answer"),
                                        sentence=str(answer["sentence"])[:MAX_REASON])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._fail(FailureKind.error, f"the replay driver gave no answer (exit {self.proc.returncode}, "
                                              f"{type(exc).__name__}): {_tail(err)}")
                return
            try:
                self.client.localization_done(job, done)
                log.info("localization job %d: %s", job, done.sentence)
            except LeaseLostError:
                log.warning("localization job %d: lease lost before the answer", job)
            except NonRetryableError as exc:  # the server refused the answer: say why, as a failure
                self._fail(FailureKind.error, f"the server refused the replays' answer: {exc}")
            except RetryableError as exc:
                log.error("localization job %d: the answer could not be delivered: %s", job, exc)
        except Exception:  # the agent must carry on (logged here)
            log.exception("localization job %d: agent error", job)
            self._end_driver()
            self._fail(FailureKind.error, "worker agent error; see the worker log")
        finally:
            self.finished.set()
            if not self.config.keep_run_dirs:
                shutil.rmtree(self.folder, ignore_errors=True)

    def _stopped_or(self, kind: FailureKind, reason: str) -> None:
        """Report why the job ended early: a lost lease (nothing), a cancel, the agent's shutdown (released)."""
        if self.lease_lost.is_set():
            return
        if self.cancel.is_set():
            self._fail(FailureKind.cancelled, "cancelled")
        elif self.release_requested.is_set() or self.agent.force.is_set():
            self._release()
        else:
            self._fail(kind, reason)
