"""Which batch scheduler started this agent, read from the environment the scheduler sets.

Slurm sets ``SLURM_JOB_ID`` in every job, and ``SLURM_ARRAY_JOB_ID`` / ``SLURM_ARRAY_TASK_ID``
in an array task, whose own id for ``scontrol``, ``sacct`` and ``scancel`` is
``<array job>_<task>``. Kubernetes sets nothing by itself that names the pod reliably, so
the Job that ``steady launch k8s`` writes passes the pod name, namespace and node through
the downward API (``STEADY_POD_NAME``, ``STEADY_POD_NAMESPACE``, ``STEADY_NODE_NAME``);
``JOB_COMPLETION_INDEX`` is set by Kubernetes itself in an Indexed Job.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from steady.worker.contract.protocol import EngineJob

_SLURM_DETAIL = {
    "SLURM_JOB_ID": "job_id",
    "SLURM_ARRAY_JOB_ID": "array_job_id",
    "SLURM_ARRAY_TASK_ID": "array_task_id",
    "SLURM_JOB_PARTITION": "partition",
    "SLURM_STEP_GPUS": "step_gpus",
    "SLURM_JOB_GPUS": "job_gpus",
    "CUDA_VISIBLE_DEVICES": "cuda_visible_devices",
}
_K8S_DETAIL = {
    "STEADY_POD_NAMESPACE": "namespace",
    "JOB_COMPLETION_INDEX": "completion_index",
    "STEADY_JOB_NAME": "job_name",
}


def _pick(env: Mapping[str, str], names: Mapping[str, str]) -> dict[str, str]:
    return {key: env[name][:200] for name, key in names.items() if env.get(name)}


def detect(env: Mapping[str, str] | None = None) -> EngineJob | None:
    """The engine job this process runs in, or None when no scheduler started it."""
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_ID"):
        if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
            job_id = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
        else:
            job_id = env["SLURM_JOB_ID"]
        node = env.get("SLURMD_NODENAME") or socket.gethostname()
        return EngineJob(engine="slurm", job_id=job_id, node=node, detail=_pick(env, _SLURM_DETAIL))
    pod = env.get("STEADY_POD_NAME") or (env.get("HOSTNAME") if env.get("KUBERNETES_SERVICE_HOST") else None)
    if pod:
        return EngineJob(engine="kubernetes", job_id=pod, node=env.get("STEADY_NODE_NAME") or None,
                         detail=_pick(env, _K8S_DETAIL))
    return None

