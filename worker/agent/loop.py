"""The worker agent: register, poll for leases, execute runs, stream metrics, heartbeat.

Two independent loops with jitter and backoff, as the house style asks: the **poll loop**
(main thread) leases runs while fewer than ``concurrency`` are executing, backing off
exponentially while the queue is empty; each executing run has a **heartbeat loop**
(thread) that extends the lease, and stops the run when the server answers ``cancel`` or
409 (lease lost). Every run executes in a fresh subprocess (:mod:`steady.worker.agent.runner`); its
metric points are streamed in batches with per-lease sequence numbers, re-sent with the
same ``seq`` after a timeout, so ingestion stays idempotent.

Shutdown: the first SIGTERM/SIGINT stops leasing; running runs get ``grace_s`` to finish
and are reported normally, otherwise they are killed and released back to the queue. A
second signal kills and releases at once. Either way the agent exits within ``grace_s`` +
``report_s`` of the first signal (plus one request's timeout, 15 s, if a call was under way
and the grace is shorter): every call to the server gives up at that deadline
(:meth:`SteadyClient.stop_by`), so a server that is gone cannot hold it for minutes of retries.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from steady.worker.agent import codecache
from steady.worker.contract import codepack, pkgenv
from steady.worker.agent import engine as engines
from steady.worker.agent.client import (
    LeaseAnswer,
    LeaseLostError,
    NonRetryableError,
    PayloadTooLargeError,
    RetryableError,
    SteadyClient,
)
from steady.worker.contract.events import READ_CHUNK_BYTES
from steady.worker.contract.fingerprint import auto_labels, host_fingerprint
from steady.worker.contract.placeholders import PlaceholderError
from steady.worker.contract.protocol import (
    MAX_BATCH_POINTS,
    MAX_ERROR_LENGTH,
    MAX_SERIES_PER_BATCH,
    Digests,
    EngineJob,
    FailureKind,
    Heartbeat,
    Lease,
    MetricBatch,
    RunFailure,
    RunRelease,
    RunResult,
    Series,
    WorkerRegistered,
    WorkerRegistration,
)
from steady.worker.agent.heartbeat import heartbeat_loop
from steady.worker.agent.localize_job import LocalizationExecution
from steady.worker.agent.runner import RunProcess

log = logging.getLogger("steady.worker")


@dataclass
class AgentConfig:
    server: str
    token: str
    labels: list[str] = field(default_factory=list)
    device: str | None = None
    concurrency: int = 1
    work_dir: str = ".steady/worker"
    name: str = ""
    poll_min_s: float = 1.0
    poll_max_s: float = 15.0
    grace_s: float = 30.0
    report_s: float = 10.0  # on shutdown, after the grace: time to report or release runs before exiting anyway
    batch_interval_s: float = 0.5
    batch_points: int = 5_000
    max_runs: int | None = None  # exit after this many runs (tests, one-shot workers)
    study_id: int | None = None  # lease only this study's runs
    exit_when_idle: bool = False  # exit once nothing in scope is queued or running elsewhere
    once: bool = False  # one lease request: run what it returns (if anything), then exit
    engine: EngineJob | None = None  # the batch job this agent runs in (default: detected)
    keep_run_dirs: bool = False
    health_file: str | None = None
    run_as: Any = None  # steady.worker.agent.runner.RunAs: run user code as this unprivileged user
    builtin_only: bool = False  # lease built-in workloads only
    pass_env: tuple[str, ...] = ()  # extra environment names the runs inherit
    # what one code archive may unpack to (STEADY_MAX_CODE_UNPACKED_BYTES, _FILES, _RATIO)
    code_limits: codepack.Limits = field(default_factory=codepack.Limits)

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"{socket.gethostname()}-{os.getpid()}"
        self.concurrency = max(1, int(self.concurrency))


def batch_size(pending: int, *, backlog: bool, steady: int, limit: int) -> int:
    """Points in the next batch.

    At steady state the agent keeps up: a batch is what is waiting, at most ``steady`` points
    (a batch goes out every ``interval_s`` or as soon as ``steady`` points wait). With a
    backlog (events still unread in the file, or more than one steady batch waiting, e.g.
    after the server stalled) it sends what is waiting up to ``limit`` (the server's batch
    limit), so it catches up in fewer, larger requests.
    """
    if backlog or pending > steady:
        return min(pending, limit)
    return min(pending, steady)


def _packed(key: str, steps: array, values: array, dtype: str | None, resolution: float | None = None) -> Series:
    """A packed series straight from int64/float64 arrays (the wire is little-endian)."""
    if sys.byteorder != "little":
        steps, values = array("q", steps), array("d", values)
        steps.byteswap()
        values.byteswap()
    return Series.from_bytes(key, steps.tobytes(), values.tobytes(), dtype, resolution)


class MetricStream:
    """Buffers metric points and sends them as batches (seq from 0 per lease).

    Points wait in int64/float64 arrays (16 B a point). The caller reads events only while
    :meth:`wants_more` (the rest stays in the run's event file), so at most about one batch
    limit of points is held however far the server falls behind. A batch whose delivery is not
    confirmed is kept as it is and re-sent with the same ``seq``: the server stores each seq once.
    """

    def __init__(self, client: SteadyClient, lease: Lease, *, interval_s: float, max_points: int,
                 steady_points: int | None = None) -> None:
        self.client = client
        self.lease = lease
        self.interval_s = interval_s
        self.limit = max(1, min(max_points, MAX_BATCH_POINTS))  # largest batch; halved on 413
        self.steady = self.limit if steady_points is None else max(1, min(steady_points, self.limit))
        self.backlog = False  # events wait unread in the file (set by the reader)
        self.pending: dict[str, tuple[array, array]] = {}
        self.pending_points = 0
        self.seq = 0
        self.unsent: MetricBatch | None = None  # a batch whose delivery is not confirmed yet
        self.last_flush = time.monotonic()
        self.points_sent = 0
        self.batches_sent = 0
        self.dtypes: dict[str, str] = {}  # key -> logged float type, when not float64
        self.resolutions: dict[str, float] = {}  # key -> coarsest last printed digit, for values parsed from text
        self.send_resolutions = True  # False once a server older than the field refused it

    @property
    def max_points(self) -> int:
        """The steady batch size (halved with the limit after a 413)."""
        return self.steady

    def wants_more(self) -> bool:
        """Whether the reader should take more events from the file (the window is not full)."""
        return self.pending_points < self.limit

    def add(self, step: int, values: dict[str, float], dtypes: dict[str, str] | None = None,
            printed: dict[str, float] | None = None) -> None:
        if dtypes:
            self.dtypes.update(dtypes)
        for key, unit in (printed or {}).items():
            if isinstance(unit, (int, float)) and unit > 0:
                self.resolutions[key] = max(self.resolutions.get(key, 0.0), float(unit))
        step = int(step)
        pending = self.pending
        for key, value in values.items():
            entry = pending.get(key)
            if entry is None:
                entry = pending[key] = (array("q"), array("d"))
            entry[0].append(step)
            entry[1].append(float(value))
        self.pending_points += len(values)

    def due(self) -> bool:
        return self.unsent is not None or self.pending_points >= self.steady or (
            self.pending_points > 0 and time.monotonic() - self.last_flush >= self.interval_s
        )

    def _resolution(self, key: str) -> float | None:
        return self.resolutions.get(key) if self.send_resolutions else None

    def _without_resolutions(self, batch: MetricBatch) -> MetricBatch | None:
        """The batch for a server that forbids ``Series.resolution`` (older than it); None when it has none."""
        if all(s.resolution is None for s in batch.series):
            return None
        self.send_resolutions = False
        log.warning("the server does not take the printed resolution of captured values: sending them without it")
        return batch.model_copy(update={"series": [s.model_copy(update={"resolution": None}) for s in batch.series]})

    def _next_batch(self) -> MetricBatch | None:
        if not self.pending_points:
            return None
        budget = batch_size(self.pending_points, backlog=self.backlog, steady=self.steady, limit=self.limit)
        series: list[Series] = []
        for key in sorted(self.pending):
            if budget <= 0 or len(series) >= MAX_SERIES_PER_BATCH:
                break
            steps, vals = self.pending[key]
            take = min(len(steps), budget)
            if take == len(steps):
                series.append(_packed(key, steps, vals, self.dtypes.get(key), self._resolution(key)))
                del self.pending[key]
            else:
                series.append(_packed(key, steps[:take], vals[:take], self.dtypes.get(key), self._resolution(key)))
                del steps[:take]  # one memmove of at most a window: no quadratic re-slicing
                del vals[:take]
            budget -= take
            self.pending_points -= take
        return MetricBatch(lease_id=self.lease.lease_id, seq=self.seq, series=series)

    def flush(self, *, everything: bool = False, deadline_s: float = 30.0) -> None:
        """Send due points. Raises LeaseLostError; RetryableError leaves the batch for later."""
        self.last_flush = time.monotonic()
        while True:
            if self.unsent is None:
                self.unsent = self._next_batch()
                if self.unsent is None:
                    return
            try:
                self.client.send_metrics(self.lease.run_id, self.unsent, deadline_s=deadline_s)
            except PayloadTooLargeError:
                points = sum(len(s) for s in self.unsent.series)
                if points <= 1:
                    raise
                self._requeue(self.unsent)  # the seq was not accepted: split and reuse it
                self.unsent = None
                self.limit = max(1, points // 2)
                self.steady = min(self.steady, self.limit)
                continue
            except NonRetryableError as exc:
                older = exc.status_code == 422 and "resolution" in str(exc)
                retry = self._without_resolutions(self.unsent) if older else None
                if retry is None:
                    raise
                self.unsent = retry
                continue
            self.points_sent += sum(len(s) for s in self.unsent.series)
            self.batches_sent += 1
            self.unsent = None
            self.seq += 1
            if not everything and self.pending_points < self.steady:
                return

    def _requeue(self, batch: MetricBatch) -> None:
        restored: dict[str, tuple[array, array]] = {}
        for s in batch.series:
            sent_steps, sent_vals = s.unpacked()
            restored[s.key] = (array("q", sent_steps), array("d", sent_vals))
        for key, (steps, vals) in self.pending.items():
            if key in restored:
                restored[key][0].extend(steps)
                restored[key][1].extend(vals)
            else:
                restored[key] = (steps, vals)
        self.pending = restored
        self.pending_points = sum(len(s) for s, _ in restored.values())


def run_variables(server: str, lease: Lease) -> dict[str, str]:
    """What a run learns about Steady: its id and its run-scoped credential (valid for this run
    and lease only), also as the MLflow client's settings so ``mlflow.log_metric`` lands here."""
    out = {"STEADY_RUN_ID": str(lease.run_id), "STEADY_SERVER": server}
    if lease.run_token:
        out["STEADY_RUN_TOKEN"] = lease.run_token
        out["MLFLOW_TRACKING_URI"] = server.rstrip("/") + "/mlflow"
        out["MLFLOW_TRACKING_TOKEN"] = lease.run_token
        out["MLFLOW_RUN_ID"] = str(lease.run_id)
    return out


def _finite_or_none(values: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in values.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


class RunExecution:
    """One leased run: subprocess, event pump, metric stream, heartbeat thread, report."""

    def __init__(self, agent: Agent, lease: Lease) -> None:
        self.agent = agent
        self.client = agent.client
        self.lease = lease
        self.config = agent.config
        self.cancel = threading.Event()
        self.lease_lost = threading.Event()
        self.refused: str | None = None  # why the server refused this run's metrics (a per-run limit)
        self.finished = threading.Event()
        self.release_requested = threading.Event()
        self.run_dir = os.path.join(self.config.work_dir, f"run-{lease.run_id}-attempt-{lease.attempt}-{lease.lease_id[:8]}")
        self.proc = RunProcess(
            lease.spec.model_dump(mode="json"), run_dir=self.run_dir, device=self.config.device,
            run_vars=run_variables(self.config.server, lease), secrets=(self.config.token,),
            run_as=self.config.run_as, pass_env=self.config.pass_env,
        )
        self.stream = MetricStream(self.client, lease, interval_s=self.config.batch_interval_s,
                                   max_points=MAX_BATCH_POINTS, steady_points=self.config.batch_points)
        self.thread = threading.Thread(target=self._main, name=f"run-{lease.run_id}", daemon=True)
        self.heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{lease.run_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # --- heartbeat loop --------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        heartbeat_loop(
            lambda deadline_s: self.client.heartbeat(
                self.lease.run_id, Heartbeat(lease_id=self.lease.lease_id, step=self.proc.collected.last_step),
                deadline_s=deadline_s),
            heartbeat_seconds=self.lease.heartbeat_seconds, label=f"run {self.lease.run_id}", finished=self.finished,
            cancel=self.cancel, lease_lost=self.lease_lost)

    # --- run -------------------------------------------------------------------------------

    def _pump(self) -> int:
        """Read events while the stream has room (what does not fit stays in the run's event
        file, to be read once batches went out); returns how many were read."""
        read = skipped = 0
        while self.stream.wants_more():
            before = self.proc.consumed()
            events = self.proc.poll(READ_CHUNK_BYTES)
            if not events:
                # a chunk of an oversized line, skipped: read on (read > 0 keeps _deliver_all going), a
                # bounded number of chunks per call so the loop still checks the time limit and flushes
                if self.proc.consumed() > before and skipped < 64:
                    read += 1
                    skipped += 1
                    continue
                break
            read += len(events)
            for event in events:
                if event.get("e") == "m":
                    self.stream.add(event["s"], event["v"], event.get("t"), event.get("r"))
        self.stream.backlog = self.proc.unread_bytes() > 0
        return read

    def _deliver_all(self) -> bool:
        """Once the run ended: send every point it logged, one window at a time. False when
        some could not be delivered (server unreachable past the deadline, refused, lease lost)."""
        while not self.lease_lost.is_set() and self.refused is None:
            read = self._pump()
            if not read and not self.stream.pending_points and self.stream.unsent is None:
                return True
            self._flush(everything=True)
            if self.stream.pending_points or self.stream.unsent is not None:
                return False
        return False

    def _flush(self, everything: bool = False) -> None:
        if self.lease_lost.is_set():
            return
        try:
            self.stream.flush(everything=everything, deadline_s=60.0 if everything else 10.0)
        except LeaseLostError:
            self.lease_lost.set()
        except NonRetryableError as exc:  # e.g. 422 over STEADY_MAX_KEYS_PER_RUN: more data will not fit
            if self.refused is None:
                log.error("run %d: the server refused its metrics: %s", self.lease.run_id, exc)
                self.refused = str(exc)
        except RetryableError as exc:
            log.warning("run %d: metrics not delivered yet (%s); will re-send seq %d", self.lease.run_id, exc, self.stream.seq)

    def _main(self) -> None:
        run_id = self.lease.run_id
        try:
            if self.config.builtin_only and not self.lease.spec.workload:
                # the server leases built-in runs only to such a worker; an older server might not
                self._try(lambda: self.client.fail(run_id, RunFailure(
                    lease_id=self.lease.lease_id, kind=FailureKind.error,
                    error="this worker runs built-in workloads only (--builtin-only); it does not execute user code")))
                return
            self.heartbeat_thread.start()  # before the code is fetched and unpacked: that may take a while
            if not self._prepare_code() or not self._prepare_environment():
                return
            try:
                self.proc.start()
            except (OSError, PlaceholderError) as exc:  # e.g. a program not installed here, a '{seed:>9999}'
                error = f"could not start the run: {exc}"[:MAX_ERROR_LENGTH]
                self._try(lambda: self.client.fail(run_id, RunFailure(
                    lease_id=self.lease.lease_id, kind=FailureKind.error, error=error)))
                return
            ran = self.proc.argv_as_run()  # a command as it ran: placeholders filled, secrets scrubbed
            log.info("run %d (attempt %d): started pid %s: %s", run_id, self.lease.attempt, self.proc.pid,
                     self.lease.spec.workload or self.lease.spec.entrypoint or shlex.join(ran or []))
            while self.proc.running():
                self._pump()
                if self.stream.due():
                    self._flush()
                if self.lease_lost.is_set():
                    self.proc.kill("lease_lost")
                elif self.refused is not None:
                    self.proc.kill(FailureKind.error.value)
                elif self.cancel.is_set():
                    self.proc.kill(FailureKind.cancelled.value)
                elif self.release_requested.is_set():
                    self.proc.kill("released")
                else:
                    self.proc.check_time_limit()
                time.sleep(0.05)
            outcome = self.proc.outcome()
            self._pump()
            self._report(outcome)
        except Exception:  # the agent must carry on (logged below)
            log.exception("run %d: agent error", run_id)
            if self.proc.running():
                self.proc.kill("error")
            self._try(lambda: self.client.fail(run_id, RunFailure(
                lease_id=self.lease.lease_id, kind=FailureKind.error, error="worker agent error; see the worker log",
                stderr_tail=self.proc.stderr_tail()[-MAX_ERROR_LENGTH:])))
        finally:
            self.finished.set()
            if not self.config.keep_run_dirs:
                shutil.rmtree(self.run_dir, ignore_errors=True)

    def _prepare_code(self) -> bool:
        """Unpack a fresh copy of the study's code for this run; on failure report the run failed."""
        sha = self.lease.spec.code_sha256
        if not sha:
            return True
        try:
            self.proc.code_dir = codecache.unpack_for_run(
                self.agent.code_cache_dir, sha, self.run_dir, self.client.fetch_code,
                self.config.code_limits, self._stop_reason)
            return True
        except (codepack.CodeError, RetryableError, NonRetryableError, OSError) as exc:
            if self.lease_lost.is_set():
                log.warning("run %d: lease lost while its code was prepared", self.lease.run_id)
                return False
            if self.cancel.is_set() or self.agent.stopping.is_set():
                kind = "cancelled" if self.cancel.is_set() else "shutting down"
                log.info("run %d: stopped while its code was prepared (%s)", self.lease.run_id, kind)
                if self.cancel.is_set():
                    self._try(lambda: self.client.fail(self.lease.run_id, RunFailure(
                        lease_id=self.lease.lease_id, kind=FailureKind.cancelled, error="cancelled")))
                else:
                    self._try(lambda: self.client.release(self.lease.run_id, RunRelease(lease_id=self.lease.lease_id)))
                return False
            log.error("run %d: cannot prepare code %s: %s", self.lease.run_id, sha[:12], exc)
            error = f"the worker could not fetch or unpack the study's code {sha[:12]}: {exc}"[:MAX_ERROR_LENGTH]
            self._try(lambda: self.client.fail(self.lease.run_id, RunFailure(
                lease_id=self.lease.lease_id, kind=FailureKind.error, error=error)))
            return False

    def _prepare_environment(self) -> bool:
        """The run's interpreter: an overlay environment with the stack's pinned packages
        (``steady.worker.contract.pkgenv``, cached under the work directory); when it cannot be built the
        run fails (kind ``environment``) rather than run on other versions."""
        packages = self.lease.spec.packages
        if not packages:
            return True
        try:
            self.proc.python = pkgenv.overlay_python(packages, self.agent.env_cache_dir)
            return True
        except pkgenv.EnvironmentBuildError as exc:
            log.error("run %d: cannot build its environment: %s", self.lease.run_id, exc)
            error = f"the worker could not build the stack's environment: {exc}"[:MAX_ERROR_LENGTH]
            self._try(lambda: self.client.fail(self.lease.run_id, RunFailure(
                lease_id=self.lease.lease_id, kind=FailureKind.environment, error=error)))
            return False

    def _stop_reason(self) -> str | None:
        """Why unpacking the code should stop now (asked between its files), or None."""
        if self.lease_lost.is_set():
            return "the lease was lost"
        if self.cancel.is_set():
            return "the run was cancelled"
        if self.agent.stopping.is_set():
            return "the worker is shutting down"
        return None

    def _try(self, call: Any) -> None:
        try:
            call()
        except LeaseLostError:
            log.warning("run %d: lease lost before the report", self.lease.run_id)
        except (RetryableError, NonRetryableError) as exc:
            log.error("run %d: report failed: %s", self.lease.run_id, exc)

    def _report(self, outcome: Any) -> None:
        run_id, lease_id = self.lease.run_id, self.lease.lease_id
        c = self.proc.collected
        if self.lease_lost.is_set():
            log.warning("run %d: lease lost; nothing more is reported", run_id)
            return
        if outcome.kind == "crash" and self.agent.stopping.wait(1.0):
            # The batch job was cancelled or preempted: the scheduler signalled the run's process
            # along with the agent (its handler may run a moment after the run died: hence the
            # short wait). Not the run's fault, so it goes back to the queue.
            outcome.kind = "released"
        if outcome.kind == "released":
            self._try(lambda: self.client.release(run_id, RunRelease(lease_id=lease_id)))
            log.info("run %d: released back to the queue", run_id)
            return
        delivered = self._deliver_all() if self.refused is None else False
        outcome.stderr_tail = self.proc.stderr_tail()  # again: its notes count what was skipped while delivering
        if self.lease_lost.is_set():
            return
        if self.refused is not None:
            outcome.ok = False
            outcome.kind = FailureKind.error.value
            outcome.error = f"the server refused the run's metrics: {self.refused}"[:MAX_ERROR_LENGTH]
        elif not delivered:
            outcome.ok = False
            outcome.kind = FailureKind.error.value
            outcome.error = "could not deliver all metric points to the server"
        if outcome.ok:
            result = c.result or {}
            timings = _finite_or_none(result.get("timings") or {})
            timings["wall_s"] = outcome.wall_s
            body = RunResult(
                lease_id=lease_id,
                final_metrics=_finite_or_none({**c.captured, **(result.get("final_metrics") or {})}),
                digests=Digests(**c.digests_model()),
                fingerprint=c.fingerprint,
                determinism_applied=c.determinism_applied,
                timings=timings,
                stderr_tail=outcome.stderr_tail[-MAX_ERROR_LENGTH:],
                argv=self.proc.argv_as_run(),
                conflicts=self.proc.guard.summary(),
            )
            self._try(lambda: self.client.complete(run_id, body))
            log.info("run %d: completed (%d points in %d batches, %.1f s)", run_id, self.stream.points_sent,
                     self.stream.batches_sent, outcome.wall_s)
        else:
            kind = outcome.kind if outcome.kind in FailureKind._value2member_map_ else FailureKind.error.value
            failure = RunFailure(
                lease_id=lease_id,
                kind=FailureKind(kind),
                error=(outcome.error or "failed")[:MAX_ERROR_LENGTH],
                stderr_tail=outcome.stderr_tail[-MAX_ERROR_LENGTH:],
                fingerprint=c.fingerprint,
                determinism_applied=c.determinism_applied,
                argv=self.proc.argv_as_run(),
                conflicts=self.proc.guard.summary(),
            )
            self._try(lambda: self.client.fail(run_id, failure))
            log.info("run %d: failed (%s): %s", run_id, kind, outcome.error)


class Agent:
    def __init__(self, config: AgentConfig, client: SteadyClient | None = None) -> None:
        self.config = config
        self.client = client or SteadyClient(config.server, config.token)
        self.stopping = threading.Event()
        self.stop_at: float | None = None  # time.monotonic() of the first stop signal
        self.force = threading.Event()
        self.registered: WorkerRegistered | None = None
        self.executions: list[RunExecution] = []
        self.localizations: list[LocalizationExecution] = []
        self.runs_started = 0
        self.last_poll = 0.0
        # The agent's files are its own (0700); with --run-as the run user may only pass through
        # (0711) to its own run directory, which it cannot list its way to either. A directory
        # that already existed keeps its mode (it may be shared, e.g. --work-dir /tmp): then
        # each run directory alone is 0700.
        if not os.path.isdir(config.work_dir):
            os.makedirs(config.work_dir, exist_ok=True)
            os.chmod(config.work_dir, 0o711 if config.run_as is not None else 0o700)
        codecache.sweep(self.code_cache_dir)  # downloads an agent killed mid-write left behind

    @property
    def code_cache_dir(self) -> str:
        return os.path.join(self.config.work_dir, "code-cache")

    @property
    def env_cache_dir(self) -> str:
        return os.path.join(self.config.work_dir, "env-cache")

    # --- lifecycle -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            if self.stopping.is_set():
                log.warning("second signal: killing and releasing running runs")
                self.force.set()
                self.client.stop_by(time.monotonic() + self.config.report_s)
            else:
                log.info("signal %d: no new runs; finishing current ones (grace %.0f s)", signum, self.config.grace_s)
                self.stop(signalled=True)
            self.stopping.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def stop(self, *, signalled: bool = False) -> None:
        """Stop leasing; with ``signalled`` (SIGTERM/SIGINT) the shutdown is bounded from now: runs get the
        grace, reports ``report_s`` more, and no call to the server outlasts that."""
        if signalled and self.stop_at is None:
            self.stop_at = time.monotonic()
            self.client.stop_by(self.stop_at + self.config.grace_s + self.config.report_s)
        self.stopping.set()

    def labels(self) -> list[str]:
        seen: list[str] = []
        for label in [*self.config.labels, *auto_labels(self.config.device)]:
            if label and label not in seen:
                seen.append(label)
        return seen

    def register(self) -> WorkerRegistered:
        job = self.config.engine or engines.detect()
        registration = WorkerRegistration(
            name=self.config.name, labels=self.labels(), fingerprint=host_fingerprint(self.config.device), engine=job
        )
        delay = self.config.poll_min_s
        while not self.stopping.is_set():
            try:
                self.registered = self.client.register(registration)
                log.info("registered as worker %d (%s) with labels %s%s", self.registered.worker_id,
                         self.registered.name, ",".join(self.registered.labels),
                         f" in {job.engine} job {job.job_id}" if job else "")
                return self.registered
            except RetryableError as exc:
                log.warning("registration failed (%s); retrying in %.1f s", exc, delay)
                self.stopping.wait(delay)
                delay = min(self.config.poll_max_s, delay * 2)
        raise SystemExit(0)

    def _touch_health(self) -> None:
        self.last_poll = time.time()
        if self.config.health_file:
            with open(os.open(self.config.health_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                      "w", encoding="utf-8") as f:
                f.write(f"{self.last_poll}\n")

    def _active(self) -> list[RunExecution]:
        self.executions = [e for e in self.executions if not e.finished.is_set()]
        return self.executions

    def _active_localizations(self) -> list[LocalizationExecution]:
        self.localizations = [e for e in self.localizations if not e.finished.is_set()]
        return self.localizations

    def _take_localization(self, answer: LeaseAnswer) -> bool:
        """With nothing to run and localization jobs announced: lease one and start it. A worker that runs user
        code as another user (--run-as) leaves them to others: the replay driver runs as the agent's user."""
        if answer.localizations <= 0 or self.config.run_as is not None or self.registered is None:
            return False
        try:
            job = self.client.lease_localization(self.registered.worker_id, deadline_s=30.0,
                                                 study_id=self.config.study_id, builtin_only=self.config.builtin_only)
        except (RetryableError, NonRetryableError) as exc:
            log.warning("localization lease failed: %s", exc)
            return False
        if job is None:
            return False
        execution = LocalizationExecution(self, job)
        self.localizations.append(execution)
        execution.start()
        return True

    def poll_once(self) -> Lease | None:
        return self._poll().lease

    def _poll(self) -> LeaseAnswer:
        assert self.registered is not None
        self._touch_health()
        return self.client.lease_or_idle(self.registered.worker_id, deadline_s=30.0, study_id=self.config.study_id,
                                         builtin_only=self.config.builtin_only)

    def _idle_exit(self, answer: LeaseAnswer) -> bool:
        """--exit-when-idle: nothing to lease, none of ours executing, none running elsewhere.

        A run still running on another agent keeps this one polling: if that agent's job is
        cancelled or preempted, its lease expires, the run returns to the queue, and someone
        must be left to take it.
        """
        return (self.config.exit_when_idle and answer.pending == 0 and not self._active()
                and not self._active_localizations())

    def run(self) -> int:
        """Run until stopped (signal), idle (``exit_when_idle``), ``once`` or ``max_runs``. Returns the exit status."""
        self.register()
        idle_delay = self.config.poll_min_s
        polls = 0
        while not self.stopping.is_set():
            if self.config.max_runs is not None and self.runs_started >= self.config.max_runs:
                break
            if self.config.once and polls:
                break
            if len(self._active()) + len(self._active_localizations()) >= self.config.concurrency:
                self.stopping.wait(0.1)
                continue
            polls += 1
            try:
                answer = self._poll()
                lease = answer.lease
            except RetryableError as exc:
                log.warning("poll failed: %s", exc)
                answer, lease = LeaseAnswer(lease=None, pending=None), None
            except NonRetryableError as exc:
                if exc.status_code == 404:
                    log.warning("server does not know this worker (%s); registering again", exc)
                    self.register()
                    continue
                log.error("poll rejected: %s", exc)
                if exc.status_code in (401, 403):
                    self.stopping.set()
                    self._shutdown()
                    return 2
                answer, lease = LeaseAnswer(lease=None, pending=None), None
            if lease is None and self._take_localization(answer):
                idle_delay = self.config.poll_min_s
                continue
            if lease is None:
                if self._idle_exit(answer) or self.config.once:
                    scope = f"study {self.config.study_id}" if self.config.study_id is not None else "the queue"
                    log.info("nothing left to run in %s; exiting", scope)
                    break
                self.stopping.wait(idle_delay * random.uniform(0.5, 1.0) + random.uniform(0, 0.1))
                idle_delay = min(self.config.poll_max_s, idle_delay * 2)
                continue
            idle_delay = self.config.poll_min_s
            self.runs_started += 1
            execution = RunExecution(self, lease)
            self.executions.append(execution)
            execution.start()
        self._shutdown()
        return 0

    def _shutdown(self) -> None:
        start = self.stop_at if self.stop_at is not None else time.monotonic()
        deadline = start + (self.config.grace_s if self.stopping.is_set() else math.inf)
        for execution in list(self._active()):
            while not execution.finished.is_set():
                if self.force.is_set() or time.monotonic() >= deadline:
                    execution.release_requested.set()
                if time.monotonic() >= deadline + self.config.report_s + 1.0:  # its thread is stuck: go anyway
                    log.warning("run %d: not reported within the shutdown bound; exiting", execution.lease.run_id)
                    execution.proc.kill("released")
                    break
                execution.finished.wait(0.1)
        for job in list(self._active_localizations()):
            while not job.finished.is_set():
                if self.force.is_set() or time.monotonic() >= deadline:
                    job.release_requested.set()
                if time.monotonic() >= deadline + self.config.report_s + 1.0:
                    log.warning("localization job %d: not reported within the shutdown bound; exiting", job.lease.job_id)
                    job._end_driver()
                    break
                job.finished.wait(0.1)
        end = deadline + self.config.report_s + 1.0
        for execution in self.executions:
            execution.thread.join(timeout=max(0.0, min(5.0, end - time.monotonic())) if math.isfinite(end) else 5.0)
        self.client.close()
