"""Computes the report of every study that settles, once, in the background of each API process."""

from __future__ import annotations

import logging
import threading

from app.db import Database
from app.reports import service

log = logging.getLogger("steady.reports")


class ReportCacher:
    """Every ``interval`` seconds, caches the reports of studies that settled or changed."""

    def __init__(self, database: Database, interval: float) -> None:
        self.database, self.interval = database, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="steady-report-cache", daemon=True)

    def start(self) -> None:
        if self.interval > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def run_once(self) -> list[int]:
        with self.database.write() as session:
            return service.refresh_cached_reports(session)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                while self.run_once() and not self._stop.is_set():
                    pass  # more may be waiting: go on without sleeping
            except Exception as exc:  # noqa: BLE001 - the database may be down, a study may not be judgeable: next tick
                log.warning("report cache: %s", exc)
