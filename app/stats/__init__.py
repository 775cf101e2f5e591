"""Steady's pure numerical core: numpy/scipy only, arrays in, frozen dataclasses out.

Never import fastapi, sqlalchemy, pydantic or other ``app.*`` modules from here
(``tests/stats/test_report.py`` checks it). Entry points for services:
``steady.server.stats.report.build_report`` and ``steady.server.stats.report.compute_bands``.
"""
from steady.server.stats.report import GroupBand, MetricSpec, RunData, StudyReport, build_report, compute_bands

__all__ = ["GroupBand", "MetricSpec", "RunData", "StudyReport", "build_report", "compute_bands"]
