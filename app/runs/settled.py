"""The one hook for "a run settled": a run of a study moved (leased, completed, failed, released, expired),
so the study's status has to be derived again.

The run lifecycle (:mod:`steady.server.lifecycle`) announces; the domains that build on a study's runs
subscribe when the app starts (:func:`steady.server.web.main.create_app` subscribes
:func:`steady.server.reports.service.run_settled`, which refreshes the study's status and judges a settled
stage of an adaptive study with its report). The lifecycle so names neither the studies' status rules nor
the reports.
"""

from __future__ import annotations

from collections.abc import Callable

from steady.server.kit.db import WriteSession

# (session, study id): called inside the transaction of the transition, after the run's row changed
Listener = Callable[[WriteSession, int], None]

_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    """Call ``listener`` whenever a run settles (once, however often the app is created)."""
    if listener not in _listeners:
        _listeners.append(listener)


def announce(session: WriteSession, study_id: int) -> None:
    """A run of ``study_id`` settled; tell every listener, in the order they subscribed."""
    if not _listeners:
        raise RuntimeError("a run settled but nothing listens: create the app (steady.server.web.main.create_app) "
                           "or subscribe steady.server.reports.service.run_settled first")
    for listener in list(_listeners):
        listener(session, study_id)
