"""Domain errors raised by services; ``app.main`` maps them to HTTP answers."""

from __future__ import annotations


class SteadyError(Exception):
    status_code = 400

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code  # machine-readable, sent next to ``detail`` when set


class NotFound(SteadyError):
    status_code = 404


class Forbidden(SteadyError):
    """The caller's role may do this, but not to this object (it belongs to another user)."""

    status_code = 403


class Conflict(SteadyError):
    """The request is valid but the resource's state refuses it (lease lost, already done)."""

    status_code = 409


class TooManyRequests(SteadyError):
    """A per-caller limit is reached for now (e.g. leases held by one worker)."""

    status_code = 429
    retry_after_s = 5


class Unavailable(SteadyError):
    """The service cannot do this now (e.g. writes refused on a database that failed its check)."""

    status_code = 503


class TooLarge(SteadyError):
    status_code = 413


class Invalid(SteadyError):
    """Bad input discovered past schema validation; answered 422 naming the field."""

    status_code = 422

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
