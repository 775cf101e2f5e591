"""docker-compose.yml is the documented scale-out topology: it must parse and keep its shape."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import REPO

ENV = {**os.environ, "POSTGRES_PASSWORD": "test", "STEADY_WORKER_TOKEN": "stdy_test"}


def _config() -> dict:
    """The resolved configuration: from the real validator when installed, else PyYAML."""
    binary = shutil.which("docker-compose")
    if binary:
        out = subprocess.run([binary, "-f", "docker-compose.yml", "config"], cwd=REPO, env=ENV,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return yaml.safe_load(out.stdout)
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_topology():
    services = _config()["services"]
    assert services["postgres"]["image"].startswith("postgres:")
    api = services["api"]
    assert api["deploy"]["replicas"] >= 2
    assert "postgresql" in api["environment"]["STEADY_DATABASE_URL"]
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    proxy = services["proxy"]
    assert len(proxy["ports"]) == 1, "the API replicas are reached through one port"
    assert (REPO / "deploy" / "nginx.conf").exists()
    workers = {name: s for name, s in services.items() if name.startswith("worker")}
    assert len(workers) >= 2
    gpus = set()
    for s in workers.values():
        assert "worker" in s["command"] and "--server" in s["command"] and s["environment"]["STEADY_TOKEN"]
        (device,) = s["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        gpus.update(device["device_ids"])
    assert len(gpus) == len(workers), "one agent per GPU"


def test_compose_refuses_a_missing_password():
    binary = shutil.which("docker-compose")
    if not binary:
        pytest.skip("docker-compose is not installed (make system-deps installs it)")
    env = {k: v for k, v in ENV.items() if k != "POSTGRES_PASSWORD"}
    out = subprocess.run([binary, "-f", "docker-compose.yml", "config"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "POSTGRES_PASSWORD" in out.stderr
