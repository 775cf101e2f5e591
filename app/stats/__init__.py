"""Steady's pure numerical core: numpy/scipy only, arrays in, frozen dataclasses out.

Never import fastapi, sqlalchemy, pydantic or other ``app.*`` modules from here
(``tests/stats/test_report.py`` checks it). Entry points for services:
``steady.server.stats.report.build_report`` and ``steady.server.stats.report.compute_bands``.
"""
from steady.server.stats.report import GroupBand, MetricSpec, RunData, StudyReport, build_report, compute_bands

__all__ = ["GroupBand", "MetricSpec", "RunData", "StudyReport", "build_report", "compute_bands", "load_libraries"]


def load_libraries() -> None:
    """Import what the statistics reach through ``scipy``'s lazy attributes (``scipy.stats.t.ppf``...),
    whose first use would otherwise import it: about 0.7 s of CPU. A server calls this at start, off its
    request path. Each library is imported after the ones it imports itself (special, optimize, stats)."""
    import scipy.special
    import scipy.optimize
    import scipy.stats  # noqa: F401
