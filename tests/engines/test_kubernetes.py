"""Kubernetes manifests: every one ``steady launch k8s`` writes, and the server examples in
deploy/k8s/, validate against the schemas of a pinned Kubernetes version. No cluster runs
here; ``--apply`` is checked to hand the very same manifest to the official client.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from steady.server.engines import kubernetes as k8s
from tests.conftest import REPO

kubernetes_validate = pytest.importorskip("kubernetes_validate")


def validate(doc: dict) -> None:
    kubernetes_validate.validate(doc, k8s.K8S_VERSION, strict=True)


def launch_yaml(tmp_path: Path, *argv: str) -> list[dict]:
    from steady.server.cli import main

    out = tmp_path / "job.yaml"
    rc = main(["launch", "k8s", "7", "--server", "http://steady-api.steady.svc:8000", "--token", "unused",
               "--image", "registry.example.com/steady-worker:0.1.0", "-o", str(out), *argv])
    assert rc == 0
    return list(yaml.safe_load_all(out.read_text()))


@pytest.mark.parametrize("argv", [
    ["--parallelism", "4"],
    ["--parallelism", "1", "--gpu", "0", "--namespace", "ml-batch", "--backoff-limit", "0"],
    ["--parallelism", "8", "--gpu", "2", "--node-selector", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
     "--node-selector", "pool=a100", "--worker-arg=--labels=h100", "--cpu", "500m", "--memory", "16Gi"],
    ["--parallelism", "2", "--with-secret", "--worker-token", "st_worker_secret", "--token-secret", "agents-token"],
])
def test_generated_manifests_validate(tmp_path, argv):
    docs = launch_yaml(tmp_path, *argv)
    for doc in docs:
        validate(doc)
    job = docs[-1]
    spec = job["spec"]
    n = int(argv[argv.index("--parallelism") + 1])
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == n
    assert spec["backoffLimit"] >= 0
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][:5] == ["steady", "worker", "--study", "7", "--exit-when-idle"]
    env = {e["name"]: e for e in container["env"]}
    assert "value" not in env["STEADY_TOKEN"] and env["STEADY_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert env["STEADY_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["STEADY_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    gpus = int(argv[argv.index("--gpu") + 1]) if "--gpu" in argv else 1
    assert container["resources"]["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
    if "--node-selector" in argv:
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "a100"}
        assert "--labels=h100" in container["command"]
    if "--with-secret" in argv:
        secret = docs[0]
        assert secret["kind"] == "Secret" and secret["stringData"]["token"] == "st_worker_secret"
        assert env["STEADY_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"] == "agents-token"
    else:
        assert len(docs) == 1


@pytest.mark.parametrize("path", sorted((REPO / "deploy" / "k8s").glob("*.yaml")), ids=lambda p: p.name)
def test_server_example_manifests_validate(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        validate(doc)


def test_server_examples_cover_the_server_side():
    kinds = {(d["kind"], d["metadata"]["name"]) for p in (REPO / "deploy" / "k8s").glob("*.yaml")
             for d in yaml.safe_load_all(p.read_text()) if d}
    assert {("Deployment", "steady-api"), ("Service", "steady-api"), ("Job", "steady-migrate"),
            ("Secret", "steady-db"), ("Secret", "steady-worker-token")} <= kinds


def test_invalid_options_are_refused(tmp_path, capsys):
    from steady.server.cli import main

    base = ["launch", "k8s", "7", "--image", "img", "--parallelism", "2"]
    assert main([*base, "--node-selector", "no-equals-sign"]) == 2
    assert main([*base, "--namespace", "Bad_Name"]) == 2
    assert main(["launch", "k8s", "7", "--image", "img", "--parallelism", "0"]) == 2
    assert "not a valid Kubernetes name" in capsys.readouterr().err


def test_apply_hands_the_same_manifest_to_the_official_client(monkeypatch):
    kubernetes = pytest.importorskip("kubernetes")
    created: list[tuple[str, dict]] = []

    class Meta:
        uid = "0f6c-uid"

    class Job:
        metadata = Meta()

    monkeypatch.setattr(kubernetes.config, "load_incluster_config",
                        lambda: (_ for _ in ()).throw(kubernetes.config.ConfigException("not in a cluster")))
    monkeypatch.setattr(kubernetes.config, "load_kube_config", lambda: None)
    monkeypatch.setattr(kubernetes.client.BatchV1Api, "create_namespaced_job",
                        lambda self, namespace, body: created.append((namespace, body)) or Job())
    monkeypatch.setattr(kubernetes.client.CoreV1Api, "create_namespaced_secret",
                        lambda self, namespace, body: created.append((namespace, body)))
    launch = k8s.K8sLaunch(study_id=3, server="http://s:8000", image="img:1", parallelism=2, namespace="ml")
    assert k8s.apply(launch, secret_token="tok") == "0f6c-uid"
    assert created == [("ml", k8s.token_secret(launch, "tok")), ("ml", k8s.agent_job(launch))]


def test_the_official_client_is_imported_only_to_apply():
    code = "import sys, steady.server.engines.kubernetes, steady.server.cli.launch; assert 'kubernetes' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_validator_catches_a_broken_manifest():
    job = k8s.agent_job(k8s.K8sLaunch(study_id=1, server="http://s", image="img", parallelism=1))
    job["spec"]["completions"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)
    job = k8s.agent_job(k8s.K8sLaunch(study_id=1, server="http://s", image="img", parallelism=1))
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)
