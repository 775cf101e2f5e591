"""HTTP client for the worker endpoints, with retries until a deadline.

Errors are typed: :class:`RetryableError` (connection errors, timeouts, 429, 502, 503, 504)
are retried with exponential backoff and full jitter until the call's deadline and raised
only after it; :class:`NonRetryableError` is raised at once, with :class:`LeaseLostError`
(409 ``lease_lost``: the lease expired and the run was re-queued or taken over),
:class:`AlreadyFinishedError` (409 ``already_finished``: the run completed, failed or was
cancelled) and :class:`PayloadTooLargeError` (413) as the cases the agent handles specially.

Retries are safe: lease, complete, fail and release carry a ``request_id`` chosen here once
per call and reused by every retry of it, and the server answers a repeat with the first
answer. A lost answer therefore never leases a second run, and a retried ``complete`` whose
first answer was lost gets that answer back rather than a conflict.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx
from pydantic import BaseModel

from steady.worker.agent.keepalive import ERRORS as KEPT_ALIVE_ERRORS
from steady.worker.agent.keepalive import KeptAlive, environment_names_a_proxy
from steady.worker.contract.protocol import (
    BatchAck,
    Heartbeat,
    HeartbeatAck,
    LOCALIZATIONS_HEADER,
    Lease,
    PENDING_HEADER,
    LeaseRequest,
    LocalizationAck,
    LocalizationDone,
    LocalizationFailure,
    LocalizationHeartbeat,
    LocalizationHeartbeatAck,
    LocalizationLease,
    LocalizationLeaseRequest,
    LocalizationRelease,
    MetricBatch,
    RunAck,
    RunFailure,
    RunRelease,
    RunResult,
    WorkerRegistered,
    WorkerRegistration,
)

log = logging.getLogger("steady.worker.agent.client")
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class LeaseAnswer:
    lease: Lease | None
    pending: int | None  # with no lease: runs in scope still running elsewhere (None: server did not say)
    localizations: int = 0  # with no lease: localization jobs in scope waiting for a worker


class ClientError(Exception):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class RetryableError(ClientError):
    """Transient: the request may succeed if repeated."""


class NonRetryableError(ClientError):
    """The server rejected the request; repeating it will not help."""


class LeaseLostError(NonRetryableError):
    """409: this worker no longer holds the run's lease; stop the run, report nothing more."""


class AlreadyFinishedError(NonRetryableError):
    """409: the run already completed, failed or was cancelled (by another request id)."""


class PayloadTooLargeError(NonRetryableError):
    """413: the metric batch is larger than the server accepts."""


def _errors(response: httpx.Response) -> list[dict]:
    """The answer's errors: ``{"detail": [{"loc", "msg", "type"}, ...]}``, the API's one error shape."""
    try:
        body = response.json()
    except ValueError:
        return []
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):  # a server before the one error shape
        return [{"msg": detail, "type": body.get("code")}]
    return [e for e in detail if isinstance(e, dict)] if isinstance(detail, list) else []


def _code(response: httpx.Response) -> str | None:
    """The machine-readable type of the answer's first error (``lease_lost``, ``already_finished``, ...)."""
    errors = _errors(response)
    return errors[0].get("type") if errors else None


def new_request_id() -> str:
    return uuid.uuid4().hex


def _with_request_id(body: M) -> M:
    if getattr(body, "request_id", "") is None:
        return body.model_copy(update={"request_id": new_request_id()})
    return body


def _detail(response: httpx.Response) -> str:
    errors = _errors(response)
    if not errors:
        return response.text[:500]
    return "; ".join(_located(e) for e in errors)[:500]


def _located(error: dict) -> str:
    where = ".".join(str(p) for p in error.get("loc") or ())
    return f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", ""))


class SteadyClient:
    def __init__(
        self,
        server: str,
        token: str,
        *,
        timeout_s: float = 15.0,
        retry_deadline_s: float = 120.0,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = server.rstrip("/")
        self.timeout_s = timeout_s
        self.cutoff: float | None = None  # time.monotonic() past which no call is tried (stop_by)
        self.retry_deadline_s = retry_deadline_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        headers = {"Authorization": f"Bearer {token}", "User-Agent": "steady-worker"}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport)
        # POSTs on kept-alive standard-library connections (a third of httpx's CPU per request), unless a
        # transport was given or the environment names a proxy: steady.worker.agent.keepalive
        self._direct: KeptAlive | None = None
        if transport is None and not environment_names_a_proxy():
            try:
                self._direct = KeptAlive(self.base_url, headers)
            except ValueError:  # not an http(s) URL: httpx says why at the first request
                self._direct = None

    def close(self) -> None:
        self._http.close()
        if self._direct is not None:
            self._direct.close()

    def stop_by(self, when: float) -> None:
        """Give up every call at ``when`` (``time.monotonic()``), the agent's shutdown deadline: retries,
        backoff and each request's own timeout end there, so a server that is gone cannot hold a stopping
        agent for the calls' full retry deadlines (minutes)."""
        self.cutoff = when if self.cutoff is None else min(self.cutoff, when)

    def _deadline(self, deadline_s: float | None) -> float:
        deadline = time.monotonic() + (self.retry_deadline_s if deadline_s is None else deadline_s)
        return deadline if self.cutoff is None else min(deadline, self.cutoff)

    def _timeout(self, path: str, method: str = "POST", longest: float | None = None) -> float:
        """This request's timeout: the client's (or ``longest``), cut to what is left before the cutoff;
        RetryableError, without a request, once it has passed."""
        timeout = longest or self.timeout_s
        if self.cutoff is None:
            return timeout
        left = self.cutoff - time.monotonic()
        if left <= 0:
            raise RetryableError(f"{method} {path}: not sent: the agent is shutting down and its time to report is up")
        return min(timeout, max(0.1, left))

    def __enter__(self) -> SteadyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport -------------------------------------------------------------------------

    def _exchange(self, path: str, body: BaseModel, *, full: bool) -> tuple[bytes, httpx.Response | None]:
        """POST once: the answer's body, and its httpx response (``full``, or an error; without ``full`` none is
        built for a success on a kept-alive connection: that would cost more than the rest of the exchange)."""
        timeout = self._timeout(path)
        # Unset optional fields are left out, so an agent that uses no newer field (a lease
        # scoped to a study, an engine job) still speaks to an older server.
        content = body.model_dump_json(exclude_none=True)
        if self._direct is not None:
            try:
                status, headers, raw = self._direct.post(path, content.encode(), "application/json", timeout)
            except KEPT_ALIVE_ERRORS as exc:
                raise RetryableError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
            if status < 300 and not full:
                return raw, None
            response = httpx.Response(status, headers=headers, content=raw,
                                      request=httpx.Request("POST", self.base_url + path))
        else:
            try:
                response = self._http.post(path, content=content, headers={"Content-Type": "application/json"},
                                           timeout=timeout)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                raise RetryableError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if status < 300:
            return response.content, response
        message = f"POST {path}: HTTP {status}: {_detail(response)}"
        if status in RETRYABLE_STATUS:
            err = RetryableError(message, status)
            err.retry_after = _retry_after(response)  # type: ignore[attr-defined]
            raise err
        if status == 409:
            if _code(response) == "already_finished":
                raise AlreadyFinishedError(message, status)
            raise LeaseLostError(message, status)
        if status == 413:
            raise PayloadTooLargeError(message, status)
        raise NonRetryableError(message, status)

    def _once(self, path: str, body: BaseModel) -> httpx.Response:
        response = self._exchange(path, body, full=True)[1]
        assert response is not None
        return response

    def _retrying(self, send: Callable[[], T], deadline_s: float | None) -> T:
        """``send()`` with retries of retryable errors until ``deadline_s`` (default: the client's), or the cutoff."""
        deadline = self._deadline(deadline_s)
        attempt = 0
        while True:
            try:
                return send()
            except RetryableError as exc:
                attempt += 1
                delay = random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2 ** min(attempt, 10)))
                delay = max(delay, getattr(exc, "retry_after", None) or 0.0)
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("%s; retry %d in %.1f s", exc, attempt, delay)
                time.sleep(delay)

    def post(self, path: str, body: BaseModel, *, deadline_s: float | None = None) -> httpx.Response:
        """POST with retries of retryable errors until ``deadline_s`` (default: the client's), or the cutoff."""
        return self._retrying(lambda: self._once(path, body), deadline_s)

    def _call(self, path: str, body: BaseModel, model: type[M], deadline_s: float | None = None) -> M:
        return model.model_validate_json(self._retrying(lambda: self._exchange(path, body, full=False)[0], deadline_s))

    # --- endpoints -------------------------------------------------------------------------

    def register(self, registration: WorkerRegistration, *, deadline_s: float | None = None) -> WorkerRegistered:
        return self._call("/api/v1/workers/register", registration, WorkerRegistered, deadline_s)

    def lease(self, worker_id: int, *, deadline_s: float | None = None, study_id: int | None = None) -> Lease | None:
        return self.lease_or_idle(worker_id, deadline_s=deadline_s, study_id=study_id).lease

    def lease_or_idle(self, worker_id: int, *, deadline_s: float | None = None, study_id: int | None = None,
                      builtin_only: bool = False) -> LeaseAnswer:
        """A lease, or (nothing to lease) how many runs in scope still run elsewhere."""
        body = LeaseRequest(worker_id=worker_id, study_id=study_id, request_id=new_request_id(),  # one id for all retries
                            builtin_only=True if builtin_only else None, run_credential=True)
        response = self.post(f"/api/v1/workers/{worker_id}/lease", body, deadline_s=deadline_s)
        if response.status_code == 204 or not response.content:
            raw = response.headers.get(PENDING_HEADER)
            jobs = response.headers.get(LOCALIZATIONS_HEADER)
            return LeaseAnswer(lease=None, pending=int(raw) if raw and raw.isascii() and raw.isdigit() else None,
                               localizations=int(jobs) if jobs and jobs.isascii() and jobs.isdigit() else 0)
        return LeaseAnswer(lease=Lease.model_validate_json(response.content), pending=None)

    def heartbeat(self, run_id: int, heartbeat: Heartbeat, *, deadline_s: float | None = None) -> HeartbeatAck:
        return self._call(f"/api/v1/runs/{run_id}/heartbeat", heartbeat, HeartbeatAck, deadline_s)

    def send_metrics(self, run_id: int, batch: MetricBatch, *, deadline_s: float | None = None) -> BatchAck:
        return self._call(f"/api/v1/runs/{run_id}/metrics", batch, BatchAck, deadline_s)

    def complete(self, run_id: int, result: RunResult, *, deadline_s: float | None = None) -> RunAck:
        return self._call(f"/api/v1/runs/{run_id}/complete", _with_request_id(result), RunAck, deadline_s)

    def fail(self, run_id: int, failure: RunFailure, *, deadline_s: float | None = None) -> RunAck:
        return self._call(f"/api/v1/runs/{run_id}/fail", _with_request_id(failure), RunAck, deadline_s)

    def fetch_code(self, sha256: str, *, deadline_s: float | None = None) -> bytes:
        """A study's code archive (GET /api/v1/code/{sha256}), retried like every call; the caller verifies it."""
        deadline = self._deadline(deadline_s)
        path, attempt = f"/api/v1/code/{sha256}", 0
        while True:
            timeout = self._timeout(path, "GET", max(60.0, self.timeout_s))
            try:
                response = self._http.get(path, timeout=timeout)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                err: ClientError = RetryableError(f"GET {path}: {type(exc).__name__}: {exc}")
            else:
                if response.status_code < 300:
                    return response.content
                message = f"GET {path}: HTTP {response.status_code}: {_detail(response)}"
                if response.status_code not in RETRYABLE_STATUS:
                    raise NonRetryableError(message, response.status_code)
                err = RetryableError(message, response.status_code)
            attempt += 1
            delay = random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2 ** min(attempt, 10)))
            if time.monotonic() + delay > deadline:
                raise err
            time.sleep(delay)

    def release(self, run_id: int, release: RunRelease, *, deadline_s: float | None = None) -> RunAck:
        return self._call(f"/api/v1/runs/{run_id}/release", _with_request_id(release), RunAck, deadline_s)


    # --- localization jobs -------------------------------------------------------------------

    def lease_localization(self, worker_id: int, *, deadline_s: float | None = None, study_id: int | None = None,
                           builtin_only: bool = False) -> LocalizationLease | None:
        body = LocalizationLeaseRequest(request_id=new_request_id(), study_id=study_id,
                                        builtin_only=True if builtin_only else None)
        response = self.post(f"/api/v1/workers/{worker_id}/localization-lease", body, deadline_s=deadline_s)
        if response.status_code == 204 or not response.content:
            return None
        return LocalizationLease.model_validate_json(response.content)

    def localization_heartbeat(self, job_id: int, body: LocalizationHeartbeat, *,
                               deadline_s: float | None = None) -> LocalizationHeartbeatAck:
        return self._call(f"/api/v1/localization-jobs/{job_id}/heartbeat", body, LocalizationHeartbeatAck, deadline_s)

    def localization_done(self, job_id: int, body: LocalizationDone, *, deadline_s: float | None = None) -> LocalizationAck:
        return self._call(f"/api/v1/localization-jobs/{job_id}/complete", _with_request_id(body), LocalizationAck,
                          deadline_s)

    def localization_failed(self, job_id: int, body: LocalizationFailure, *,
                            deadline_s: float | None = None) -> LocalizationAck:
        return self._call(f"/api/v1/localization-jobs/{job_id}/fail", _with_request_id(body), LocalizationAck,
                          deadline_s)

    def localization_release(self, job_id: int, body: LocalizationRelease, *,
                             deadline_s: float | None = None) -> LocalizationAck:
        return self._call(f"/api/v1/localization-jobs/{job_id}/release", _with_request_id(body), LocalizationAck,
                          deadline_s)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return min(60.0, max(0.0, float(value)))
    except ValueError:
        return None
