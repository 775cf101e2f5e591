"""Memoised quantiles of the t, normal and chi-square distributions.

The decision rules ask for the same few quantiles over and over (one α, small integer degrees of
freedom), and each call through ``scipy.stats``' distribution objects costs far more than the
number itself: a calibration run or a report over many metrics spends much of its time there.
These return exactly ``float(scipy.stats.<dist>.<ppf|isf>(q, df))``, computed once per argument.
"""
from __future__ import annotations

from functools import lru_cache

import scipy

__all__ = ["t_ppf", "t_isf", "norm_ppf", "norm_isf", "chi2_ppf"]


@lru_cache(maxsize=4096)
def t_ppf(q: float, df: float) -> float:
    return float(scipy.stats.t.ppf(q, df))


@lru_cache(maxsize=4096)
def t_isf(q: float, df: float) -> float:
    return float(scipy.stats.t.isf(q, df))


@lru_cache(maxsize=1024)
def norm_ppf(q: float) -> float:
    return float(scipy.stats.norm.ppf(q))


@lru_cache(maxsize=1024)
def norm_isf(q: float) -> float:
    return float(scipy.stats.norm.isf(q))


@lru_cache(maxsize=4096)
def chi2_ppf(q: float, df: float) -> float:
    return float(scipy.stats.chi2.ppf(q, df))
