"""The heartbeat loop of a leased run or localization job: it extends the lease, hears a cancel and notices a
lost lease, on its own thread, until the work is finished."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Protocol

from steady.worker.agent.client import LeaseLostError, NonRetryableError, RetryableError

log = logging.getLogger("steady.worker")


class _Ack(Protocol):
    @property
    def cancel(self) -> bool: ...


def heartbeat_loop(send: Callable[[float], _Ack], *, heartbeat_seconds: float, label: str, finished: threading.Event,
                   cancel: threading.Event, lease_lost: threading.Event) -> None:
    """Beat every 0.8–1.0 × ``heartbeat_seconds`` (jittered, at least 0.2 s) until ``finished`` is set.

    ``send(deadline_s)`` posts one heartbeat (built afresh each time) and returns the server's ack; each beat
    gets twice the interval to get through. A lost lease (409) sets ``lease_lost`` and ends the loop; a failed
    beat is logged and the next one tried; an ack that asks to cancel sets ``cancel``. ``label`` names the
    work in the log ("run 7")."""
    interval = max(0.2, float(heartbeat_seconds))
    while not finished.wait(interval * random.uniform(0.8, 1.0)):
        try:
            ack = send(interval * 2)
        except LeaseLostError:
            log.warning("%s: lease lost (409); stopping it", label)
            lease_lost.set()
            return
        except (RetryableError, NonRetryableError) as exc:
            log.warning("%s: heartbeat failed: %s", label, exc)
            continue
        if ack.cancel and not cancel.is_set():
            log.info("%s: cancelled by the server", label)
            cancel.set()
