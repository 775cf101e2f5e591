"""Domain errors raised by services, and the one shape of every error answer (``steady.server.web.boundary``
maps errors to it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SteadyError(Exception):
    status_code = 400
    loc: tuple[str | int, ...] = ()
    retry_after_s: int | None = None  # sent as Retry-After when set

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code  # machine-readable: the answer's detail[0].type when set


class NotFound(SteadyError):
    status_code = 404


class Forbidden(SteadyError):
    """The caller's role may do this, but not to this object (it belongs to another user)."""

    status_code = 403


class Conflict(SteadyError):
    """The request is valid but the resource's state refuses it (lease lost, already done); ``loc``
    names the input whose state refuses it, when one does."""

    status_code = 409

    def __init__(self, message: str, *, code: str | None = None, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message, code=code)
        self.loc = loc


class TooManyRequests(SteadyError):
    """A per-caller limit is reached for now (e.g. leases held by one worker)."""

    status_code = 429
    retry_after_s = 5


class Unavailable(SteadyError):
    """The service cannot do this now (e.g. writes refused on a database that failed its check)."""

    status_code = 503
    retry_after_s = 2


class TooLarge(SteadyError):
    status_code = 413


class RequestTimeout(SteadyError):
    """The client stopped sending its request's body (an upload that stalled)."""

    status_code = 408


class InsufficientStorage(SteadyError):
    """The server's disk is full (or over quota): nothing was stored; the message says where."""

    status_code = 507
    retry_after_s = 60


class Invalid(SteadyError):
    """Bad input discovered past schema validation; answered 422 naming the field."""

    status_code = 422

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


@contextmanager
def judging(loc: tuple[str | int, ...]) -> Iterator[None]:
    """Around a call into the stats core, which refuses data it cannot judge with ValueError:
    that refusal becomes a 422 naming ``loc`` (the study, the metric) and the reason."""
    try:
        yield
    except ValueError as exc:
        raise Invalid(loc, f"the data cannot be judged: {exc}") from exc


# --- the one error shape of the API ------------------------------------------------------------
# Every error answer outside /mlflow (whose clients read MLflow's own shape) is FastAPI's
# validation shape: {"detail": [{"loc": [...], "msg": "...", "type": "..."}]}. ``loc`` names the
# offending input (empty when the error is not about one field); ``type`` is machine-readable:
# pydantic's error types for a 422 of request validation, else one of ``ERROR_TYPES`` below or
# a specific code a service set (e.g. ``lease_lost``, ``already_finished`` on a 409).

ERROR_TYPES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
               408: "request_timeout", 409: "conflict", 413: "too_large", 422: "value_error", 429: "too_many_requests",
               500: "internal_error", 503: "unavailable"}


class ErrorItem(BaseModel):
    # A 422 of request validation also carries pydantic's ``input`` and ``ctx``.
    model_config = ConfigDict(extra="allow")

    loc: list[str | int] = Field(description="where the error is: e.g. [\"body\", \"seeds\", 0]; [] for none")
    msg: str
    type: str = Field(description="machine-readable: not_found, conflict, lease_lost, value_error, missing, ...")


class ErrorResponse(BaseModel):
    """The body of every error answer of /api/v1 (and the dashboard's data routes)."""

    detail: list[ErrorItem]


def error_type(status_code: int) -> str:
    return ERROR_TYPES.get(status_code, "client_error" if status_code < 500 else "server_error")


def error_body(msg: str, status_code: int, *, type: str | None = None, loc: tuple[str | int, ...] = ()) -> dict:
    return {"detail": [{"loc": list(loc), "msg": msg, "type": type or error_type(status_code)}]}


# Declared on every /api/v1 route (``include_router(..., responses=ERROR_RESPONSES)``).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "the request was refused: see detail[].loc, .msg and .type"},
    "5XX": {"model": ErrorResponse, "description": "internal error (500), or the database is busy or "
                                                   "unavailable (503, with Retry-After)"},
}
