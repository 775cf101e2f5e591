"""Steady's pure numerical core: numpy/scipy only, arrays in, frozen dataclasses out.

Never import fastapi, sqlalchemy, pydantic or other ``app.*`` modules from here
(``tests/stats/test_report.py`` checks it). Entry points for services:
``app.stats.report.build_report`` and ``app.stats.report.compute_bands``.
"""
from app.stats.report import GroupBand, MetricSpec, RunData, StudyReport, build_report, compute_bands

__all__ = ["GroupBand", "MetricSpec", "RunData", "StudyReport", "build_report", "compute_bands"]
