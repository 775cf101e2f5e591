"""A stack's pinned packages: validated at submit, given to the worker by the lease, and installed into a cached
overlay environment (``steady.worker.contract.pkgenv``) that is built once, keyed by the pins and the base
environment, checked after install, and never marked ready when it cannot be built. The versions a bisect over a
package resolves: between GOOD and BAD, in PEP 440 order."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from steady.worker.contract import pkgenv
from tests.api.helpers import lease, register
from tests.wheels import write_wheel


def _spec(**stack):
    return {"name": "pinned", "workload": {"framework": "python", "command": ["python", "-c", "print(1)"]},
            "seeds": [0], "metrics": ["loss"], "stacks": [{"name": "s", **stack}]}


@pytest.mark.parametrize(("packages", "field", "reason"), [
    ({"numpy": ">=2.0"}, "numpy", "not an exact PEP 440 version"),
    ({"numpy": "2.*"}, "numpy", "not an exact PEP 440 version"),
    ({"numpy": "2.0 "}, "numpy", "pattern"),
    ({"-numpy": "2.0.2"}, "packages", "pattern"),
    ({"Foo_Bar": "1.0", "foo-bar": "1.1"}, "packages", "'Foo_Bar' and 'foo-bar' name the same package"),
])
def test_a_stack_pins_exact_versions_only(api, packages, field, reason):
    r = api.post("/api/v1/studies", json=_spec(packages=packages))
    assert r.status_code == 422, r.text
    assert field in r.text and reason in r.text, r.text


def test_the_lease_gives_the_run_its_stack_pins(api):
    r = api.post("/api/v1/studies", json=_spec(packages={"numpy": "2.0.2", "plantedlib": "1.5.0rc1"}))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["stacks"][0]["packages"] == {"numpy": "2.0.2", "plantedlib": "1.5.0rc1"}
    got = lease(api, register(api, labels=("python", "cpu")))
    assert got["spec"]["stack"] == "s" and got["spec"]["packages"] == {"numpy": "2.0.2", "plantedlib": "1.5.0rc1"}


def test_the_overlay_is_built_once_and_pins_what_it_says(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    for v in ("1.0.0", "1.1.0"):
        write_wheel(wheels, "plantedlib", v, {"plantedlib/__init__.py": f"VERSION = {v!r}\n"})
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    python = pkgenv.overlay_python({"plantedlib": "1.1.0"}, tmp_path / "cache")
    got = subprocess.run([python, "-c", "import plantedlib, numpy; print(plantedlib.VERSION)"], capture_output=True,
                         text=True, check=True).stdout
    assert got.strip() == "1.1.0"  # the pinned version, and the base's packages (numpy) too
    assert pkgenv.overlay_python({"plantedlib": "1.1.0"}, tmp_path / "cache") == python
    # a version the index lacks: why, and nothing left marked ready
    with pytest.raises(pkgenv.EnvironmentBuildError, match="No matching distribution found for plantedlib==9.9.9"):
        pkgenv.overlay_python({"plantedlib": "9.9.9"}, tmp_path / "cache")
    root = pkgenv.env_root({"plantedlib": "9.9.9"}, tmp_path / "cache", "x")
    assert not list((tmp_path / "cache").glob("plantedlib-9.9.9-*/.ready")), root


def test_the_check_refuses_an_install_that_is_not_what_imports(tmp_path, monkeypatch):
    """The pinned version installed, but another copy of the package found first (here on the agent's PYTHONPATH,
    which a run inherits): the check refuses the environment rather than run on that copy."""
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "plantedlib", "1.4.0", {"plantedlib/__init__.py": ""})
    other = tmp_path / "elsewhere" / "plantedlib"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PYTHONPATH", str(other.parent))
    with pytest.raises(pkgenv.EnvironmentBuildError, match=r"plantedlib 1\.4\.0: plantedlib imports from .*elsewhere"):
        pkgenv.overlay_python({"plantedlib": "1.4.0"}, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*/.ready"))


def test_the_cache_is_keyed_by_the_pins_and_the_base_environment(tmp_path):
    """The overlay reaches the base's packages through a .pth line: one built over a virtual environment since
    deleted (a CI checkout of yesterday) must not be reused."""
    a, b = tmp_path / "a" / "site-packages", tmp_path / "b" / "site-packages"
    root = pkgenv.env_root
    assert root({"numpy": "2.0.2"}, tmp_path, str(a)) != root({"numpy": "2.0.2"}, tmp_path, str(b))
    assert root({"numpy": "2.0.2"}, tmp_path, str(a)) == root({"numpy": "2.0.2"}, tmp_path, str(a / ".." / "site-packages"))
    assert root({"numpy": "2.0.2"}, tmp_path, str(a)) != root({"numpy": "2.4.6"}, tmp_path, str(a))
    assert root({"Foo_Bar": "1", "x": "2"}, tmp_path, str(a)) == root({"x": "2", "foo-bar": "1"}, tmp_path, str(a))


def test_concurrent_requests_build_the_environment_once(tmp_path, monkeypatch):
    """Two runs (or two parallel test workers) asking at once: one builds, the other waits and finds it ready.
    The controls demo's NumPy environment is the same code (``numpy_env``)."""
    from steady.server.cli.demo import controls

    builds: list[dict] = []
    inside = threading.Event()
    overlap: list[bool] = []

    def build(packages, root, python, done):
        overlap.append(inside.is_set())
        inside.set()
        builds.append(packages)
        time.sleep(0.3)  # long enough for the other caller to reach the lock while this one holds it
        root.mkdir(parents=True, exist_ok=True)
        done.write_text("ready\n")
        inside.clear()
        return str(python)

    monkeypatch.setattr(pkgenv, "_build", build)
    got: list[str] = []
    callers = [threading.Thread(target=lambda: got.append(controls.numpy_env("2.0.2", tmp_path))) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=60)
    assert builds == [{"numpy": "2.0.2"}] and overlap == [False]
    assert len(got) == 2 and got[0] == got[1]
    # a later call finds it ready without the lock
    assert pkgenv.overlay_python({"numpy": "2.0.2"}, tmp_path) == got[0] and len(builds) == 1


def test_the_versions_between_good_and_bad_in_pep440_order():
    from steady.server.cli.bisect import package_pins, version_range
    from steady.server.cli.support import CliError

    assert package_pins("numpy==2.0.2", "numpy==2.2.6") == ("numpy", "2.0.2", "2.2.6")
    assert package_pins("v1.3", "main") is None
    for good, bad in (("numpy==2.2.6", "numpy==2.0.2"), ("numpy==2.0.2", "scipy==1.0"), ("numpy==2.0.2", "main")):
        with pytest.raises(CliError):
            package_pins(good, bad)
    offered = ["2.10.0", "2.2.6", "2.9.1", "2.1.0", "2.0.2", "1.26.4", "3.0.0"]
    points = version_range({"stacks": [{"name": "cpu", "labels": ["x86"], "packages": {"scipy": "1.14.1"}}]},
                           "numpy", "2.0.2", "2.10.0", versions=offered)
    assert [p.version[1] for p in points] == ["2.0.2", "2.1.0", "2.2.6", "2.9.1", "2.10.0"]
    assert points[2].stack == {"name": "numpy-2.2.6", "labels": ["x86"], "packages": {"scipy": "1.14.1", "numpy": "2.2.6"}}
    assert points[2].short == "numpy 2.2.6" and points[2].ident == "numpy==2.2.6" and points[2].what == "version"
    with pytest.raises(CliError, match="one stack"):
        version_range({"stacks": [{"name": "a"}, {"name": "b"}]}, "numpy", "2.0.2", "2.2.6", versions=offered)
