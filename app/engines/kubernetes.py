"""Kubernetes: an Indexed Job whose pods each run an agent until the study has nothing left.

Manifests are plain dicts (written as YAML); the official ``kubernetes`` client is imported
only by :func:`apply`, a thin call of ``BatchV1Api.create_namespaced_job``. The tests validate
every manifest this module writes against the schemas of :data:`K8S_VERSION`.

Every pod gets the worker token from a Secret (``--token-secret``, key ``token``), its own pod
name, namespace and node through the downward API (so each run records which pod ran it),
a GPU limit (``nvidia.com/gpu``) with the matching toleration, and the node selectors that
pin the stack (GPU model, driver pool). ``backoffLimit`` bounds pods that fail; an agent
that finds nothing left exits 0, which completes its index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

K8S_VERSION = "1.30.0"  # the Kubernetes API the manifests are validated against (tests)
GPU_RESOURCE = "nvidia.com/gpu"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class ManifestError(ValueError):
    pass


def parse_selector(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _LABEL_KEY.match(key) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ManifestError(f"--node-selector {pair!r}: expected label-key=label-value")
        out[key] = value
    return out


@dataclass(frozen=True)
class K8sLaunch:
    study_id: int
    server: str
    image: str
    parallelism: int
    gpu: int = 1
    namespace: str = "default"
    node_selector: dict[str, str] = field(default_factory=dict)
    token_secret: str = "steady-worker-token"
    backoff_limit: int = 6
    cpu: str = "2"
    memory: str = "8Gi"
    ttl_seconds_after_finished: int = 86_400
    worker_args: tuple[str, ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        if self.parallelism < 1:
            raise ManifestError("--parallelism must be at least 1")
        if self.gpu < 0 or self.backoff_limit < 0:
            raise ManifestError("--gpu and --backoff-limit must be >= 0")
        if not self.image:
            raise ManifestError("--image is required")
        for what, value in (("namespace", self.namespace), ("token secret", self.token_secret),
                            ("job name", self.job_name)):
            if not _NAME.match(value) or len(value) > 63:
                raise ManifestError(f"{what} {value!r} is not a valid Kubernetes name")

    @property
    def job_name(self) -> str:
        return self.name or f"steady-study-{self.study_id}"


def _labels(launch: K8sLaunch) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "steady-agent",
        "app.kubernetes.io/part-of": "steady",
        "steady/study": str(launch.study_id),
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def agent_job(launch: K8sLaunch) -> dict[str, Any]:
    """The Indexed Job (batch/v1) of ``parallelism`` agents for one study."""
    resources: dict[str, Any] = {
        "requests": {"cpu": launch.cpu, "memory": launch.memory},
        "limits": {"memory": launch.memory},
    }
    if launch.gpu:
        # Extended resources are requested through limits (requests default to them).
        resources["limits"][GPU_RESOURCE] = str(launch.gpu)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 60,
        "containers": [{
            "name": "agent",
            "image": launch.image,
            "command": ["steady", "worker", "--study", str(launch.study_id), "--exit-when-idle",
                        "--work-dir", "/scratch", "--health-file", "/scratch/health", *launch.worker_args],
            "env": [
                {"name": "STEADY_SERVER", "value": launch.server},
                {"name": "STEADY_TOKEN", "valueFrom": {"secretKeyRef": {"name": launch.token_secret, "key": "token"}}},
                {"name": "STEADY_JOB_NAME", "value": launch.job_name},
                _field_env("STEADY_POD_NAME", "metadata.name"),
                _field_env("STEADY_POD_NAMESPACE", "metadata.namespace"),
                _field_env("STEADY_NODE_NAME", "spec.nodeName"),
            ],
            "resources": resources,
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        }],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    if launch.node_selector:
        pod_spec["nodeSelector"] = dict(launch.node_selector)
    if launch.gpu:
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    labels = _labels(launch)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": launch.job_name, "namespace": launch.namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": launch.parallelism,
            "parallelism": launch.parallelism,
            "backoffLimit": launch.backoff_limit,
            "ttlSecondsAfterFinished": launch.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def token_secret(launch: K8sLaunch, token: str) -> dict[str, Any]:
    """The Secret the pods read their worker token from (written only when asked to)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": launch.token_secret, "namespace": launch.namespace,
                     "labels": {"app.kubernetes.io/part-of": "steady"}},
        "stringData": {"token": token},
    }


def to_yaml(documents: list[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)


def apply(launch: K8sLaunch, *, secret_token: str | None = None) -> str:
    """Create the Job (and, given a token, its Secret) with the official client; returns the Job's uid."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    if secret_token is not None:
        client.CoreV1Api().create_namespaced_secret(launch.namespace, token_secret(launch, secret_token))
    job = client.BatchV1Api().create_namespaced_job(launch.namespace, agent_job(launch))
    return str(job.metadata.uid)
