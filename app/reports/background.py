"""Computes the report of every study that settles, once, in the background of each API process."""

from __future__ import annotations

import logging

from steady.server.kit.background import BackgroundLoop
from steady.server.kit.db import Database
from steady.server.reports import service

log = logging.getLogger("steady.reports")


class ReportCacher:
    """Every ``interval`` seconds, caches the reports of studies that settled or changed."""

    def __init__(self, database: Database, interval: float) -> None:
        self.database, self.interval = database, interval
        self._loop = BackgroundLoop("report cache", self._drain, interval=interval, logger=log) if interval > 0 else None

    def start(self) -> None:
        if self._loop is not None:
            self._loop.start()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop(timeout=30)

    def run_once(self) -> list[int]:
        with self.database.write() as session:
            return service.refresh_cached_reports(session)

    def _drain(self) -> None:
        while self.run_once() and not (self._loop is not None and self._loop.stopping):
            pass  # more may be waiting: go on without sleeping
