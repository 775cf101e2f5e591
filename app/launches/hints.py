"""How to find an engine job's own logs: for the run page and ``steady status`` (no dependencies)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def job_label(job: Mapping[str, Any] | None) -> str | None:
    if not job:
        return None
    node = f" on {job['node']}" if job.get("node") else ""
    return f"{job.get('engine')} {job.get('job_id')}{node}"


def log_hint(job: Mapping[str, Any] | None) -> str | None:
    """The command that shows the job's own logs."""
    if not job:
        return None
    detail = job.get("detail") or {}
    if job.get("engine") == "slurm":
        return f"sacct -j {job.get('job_id')}; log: the array's --output file (steady launch: steady-slurm-%A_%a.out)"
    if job.get("engine") == "kubernetes":
        ns = detail.get("namespace")
        return f"kubectl logs {'-n ' + str(ns) + ' ' if ns else ''}pod/{job.get('job_id')}"
    return None
