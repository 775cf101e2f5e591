"""Steady worker agent: leases runs, executes them in fresh subprocesses, reports results.

Installs and runs without the server's dependencies (no FastAPI, no SQLAlchemy).
"""
