"""Steady server: REST API, stability statistics, dashboard and alerts."""

__version__ = "0.1.0"
