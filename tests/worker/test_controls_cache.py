"""The cached NumPy environment of the planted controls is built once, also when two processes
(parallel test workers) ask for it at the same time."""

from __future__ import annotations

import threading
import time

from steady.server.cli.demo import controls


def test_concurrent_requests_build_the_environment_once(tmp_path, monkeypatch):
    builds: list[str] = []
    inside = threading.Event()
    overlap: list[bool] = []

    def build(version, root, python, done):
        overlap.append(inside.is_set())
        inside.set()
        builds.append(version)
        time.sleep(0.3)  # long enough for the other caller to reach the lock while this one holds it
        root.mkdir(parents=True, exist_ok=True)
        done.write_text(version + "\n")
        inside.clear()
        return str(python)

    monkeypatch.setattr(controls, "_build_numpy_env", build)
    got: list[str] = []
    callers = [threading.Thread(target=lambda: got.append(controls.numpy_env("2.0.2", tmp_path))) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=60)
    assert builds == ["2.0.2"] and overlap == [False]
    assert len(got) == 2 and got[0] == got[1]
    # a later call finds it ready without the lock
    assert controls.numpy_env("2.0.2", tmp_path) == got[0] and builds == ["2.0.2"]
