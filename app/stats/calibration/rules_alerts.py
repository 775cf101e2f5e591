"""Calibration scenarios: alerts family (see app.stats.calibration.rules)."""
from __future__ import annotations

from app.stats.calibration import Rule

RULES: list[Rule] = []
