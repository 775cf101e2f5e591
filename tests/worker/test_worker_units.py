"""Unit tests of the worker pieces that need no training: digests, events, environment,
metric batching, the HTTP client's retries, labels, import hygiene."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from steady.worker.contract import determinism
from steady.worker.inrun import sdk
from steady.worker.agent.loop import MetricStream
from steady.worker.agent.client import LeaseLostError, NonRetryableError, RetryableError, SteadyClient
from steady.worker.contract.digests import ORDER_MAGIC, STATE_MAGIC, order_digest, state_digest
from steady.worker.contract.events import EventReader, EventWriter
from steady.worker.contract.protocol import BUILTIN_WORKLOADS, Heartbeat, Lease, MetricBatch, RunFailure, RunSpec
from steady.worker.agent.runner import RunProcess, device_env
from steady.worker.contract.placeholders import PlaceholderError
import steady.worker.inrun.workloads
from steady.worker.inrun.workloads import WORKLOADS

REPO = Path(__file__).resolve().parents[2]


def test_state_digest_is_the_documented_serialisation():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = w.astype("<f4").tobytes()
    expected = hashlib.sha256(
        STATE_MAGIC + b"b\0json\0\0" + (2).to_bytes(8, "little") + b"[]"
        + b"w\0<f4\x002,3\0" + len(raw).to_bytes(8, "little") + raw
    ).hexdigest()
    assert state_digest({"w": w, "b": []}) == expected
    # order of insertion does not matter, byte order does not matter, values do
    assert state_digest({"b": [], "w": w.astype(">f4")}) == expected
    assert state_digest({"w": w + 1, "b": []}) != expected


def test_order_digest():
    assert order_digest([2, 0, 1]) == hashlib.sha256(ORDER_MAGIC + np.array([2, 0, 1], "<i8").tobytes()).hexdigest()
    assert order_digest(np.array([2, 0, 1], dtype=np.int32)) == order_digest([2, 0, 1])
    assert order_digest([0, 1, 2]) != order_digest([2, 0, 1])


def test_event_reader_consumes_only_complete_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    reader = EventReader(str(path))
    assert reader.read_new() == []
    with open(path, "wb") as f:
        f.write(b'{"e":"m","s":0,"v":{"loss":NaN}}\n{"e":"m","s":1,')
    first = reader.read_new()
    assert len(first) == 1 and np.isnan(first[0]["v"]["loss"])
    with open(path, "ab") as f:
        f.write(b'"v":{"loss":0.1}}\n')
    assert reader.read_new() == [{"e": "m", "s": 1, "v": {"loss": 0.1}}]


def test_floats_survive_the_event_file_exactly(tmp_path):
    values = [0.1, 1 / 3, 2.0**-1074, 1e308, float("inf"), float("-inf"), np.nextafter(1.0, 2.0)]
    w = EventWriter(str(tmp_path / "e"))
    w.write({"e": "m", "s": 0, "v": {f"k{i}": v for i, v in enumerate(values)}})
    got = EventReader(str(tmp_path / "e")).read_new()[0]["v"]
    assert [got[f"k{i}"] for i in range(len(values))] == values


@pytest.mark.parametrize("level", ["none", "seeded", "strict"])
def test_subprocess_env(level):
    base = {"PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":16:8", "TF_DETERMINISTIC_OPS": "1", "PATH": "/bin",
            "MKL_CBWR": "COMPATIBLE", "MKL_DYNAMIC": "TRUE"}
    env = determinism.subprocess_env(level, 42, 3, base)
    assert env["PATH"] == "/bin"
    assert env["PYTHONHASHSEED"] == ("random" if level == "none" else "42")
    assert env.get("CUBLAS_WORKSPACE_CONFIG") == (":4096:8" if level == "strict" else None)
    assert env.get("TF_DETERMINISTIC_OPS") == ("1" if level == "strict" else None)
    assert all(env[v] == "3" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"))
    assert env.get("MKL_CBWR") == ("AUTO,STRICT" if level == "strict" else None)
    assert env["MKL_DYNAMIC"] == env["OMP_DYNAMIC"] == "FALSE"  # thread counts are fixed at every level


def test_device_env():
    assert device_env("cuda:3") == {"STEADY_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": "3"}
    assert device_env("cpu") == {"STEADY_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    assert device_env(None) == {"STEADY_DEVICE": "auto"}
    with pytest.raises(ValueError):
        device_env("tpu")


def test_builtin_workloads_match_the_protocol():
    # The server validates specs against the protocol's table; each module declares what it runs on.
    # Read the declaration without importing the module (that would import torch or TensorFlow).
    assert set(WORKLOADS) == set(BUILTIN_WORKLOADS)
    for name, module in WORKLOADS.items():
        path = Path(steady.worker.inrun.workloads.__file__).parent / f"{module.rsplit('.', 1)[1]}.py"
        declared = next(
            ast.literal_eval(node.value)
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "FRAMEWORKS" for t in node.targets)
        )
        assert BUILTIN_WORKLOADS[name] in declared, (name, declared)


def test_sdk_outside_a_run_is_harmless(capsys, monkeypatch):
    monkeypatch.setattr(sdk, "_warned", False)  # the notice is once per process: other tests may have had it
    sdk.log(step=0, loss=1.0)
    sdk.log(loss=2.0)
    sdk.set_digest("final_weights", "0" * 64)
    assert sdk.context() is None
    raw = np.zeros(3).tobytes()  # the documented serialisation, written out (test_state_digest_is_the_documented_serialisation)
    expected = hashlib.sha256(STATE_MAGIC + b"w\0<f8\x003\0" + len(raw).to_bytes(8, "little") + raw).hexdigest()
    assert sdk.digest_model({"w": np.zeros(3)}) == expected
    assert sdk.digest_model({"w": np.ones(3)}) != expected
    assert "not inside a Steady run" in capsys.readouterr().err


def test_agent_and_cli_import_no_framework_and_no_server():
    code = (
        "import sys, steady.worker.agent.loop, steady.worker.agent.cli, steady.worker.agent.local, steady.worker.inrun.sdk; "
        "from steady.worker.contract.fingerprint import auto_labels; auto_labels(); "
        "bad = [m for m in ('torch', 'tensorflow', 'keras', 'app', 'fastapi', 'sqlalchemy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_auto_labels_name_installed_frameworks_without_importing_them():
    from steady.worker.contract.fingerprint import auto_labels, framework_versions

    labels = auto_labels("cpu")
    for name, version in framework_versions().items():
        assert name in labels and f"{name}-{version.split('+')[0]}" in labels
    assert "cpu" in labels
    # every worker runs ``framework: python`` code, with or without torch or TensorFlow installed
    assert labels[0] == "python"


# --- metric batching ------------------------------------------------------------------------


class FakeClient:
    def __init__(self, fail_first: type[Exception] | None = None, too_large_over: int | None = None):
        self.batches: list[MetricBatch] = []
        self.fail_first = fail_first
        self.too_large_over = too_large_over

    def send_metrics(self, run_id, batch, deadline_s=None):
        from steady.worker.agent.client import PayloadTooLargeError

        if self.fail_first:
            exc, self.fail_first = self.fail_first, None
            raise exc("boom")
        points = sum(len(s) for s in batch.series)
        if self.too_large_over is not None and points > self.too_large_over:
            raise PayloadTooLargeError("413", 413)
        self.batches.append(batch)


def _lease() -> Lease:
    return Lease(run_id=1, study_id=1, attempt=1, lease_id="L", lease_expires_at="2030-01-01T00:00:00Z",
                 heartbeat_seconds=1, spec=RunSpec(framework="torch", workload="torch_mlp", seed=0, repeat=0, determinism="seeded"))


def _points(batches: list[MetricBatch]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for b in batches:
        for s in b.series:
            steps, values = s.unpacked()
            out.setdefault(s.key, []).extend(zip(steps, values))
    return out


def test_metric_stream_batches_with_increasing_seq_and_bounded_size():
    client = FakeClient()
    stream = MetricStream(client, _lease(), interval_s=0.0, max_points=1000)
    for step in range(1500):
        stream.add(step, {"loss": step * 0.5, "step_time": 0.01})
    stream.flush(everything=True)
    assert [b.seq for b in client.batches] == list(range(len(client.batches)))
    assert all(sum(len(s) for s in b.series) <= 1000 for b in client.batches)
    pts = _points(client.batches)
    assert pts["loss"] == [(s, s * 0.5) for s in range(1500)]
    assert len(pts["step_time"]) == 1500


def test_metric_stream_resends_the_same_seq_after_a_retryable_error():
    client = FakeClient(fail_first=RetryableError)
    stream = MetricStream(client, _lease(), interval_s=0.0, max_points=100)
    stream.add(0, {"loss": 1.0})
    with pytest.raises(RetryableError):
        stream.flush()
    stream.add(1, {"loss": 2.0})
    stream.flush(everything=True)
    assert [b.seq for b in client.batches] == [0, 1]
    assert _points(client.batches)["loss"] == [(0, 1.0), (1, 2.0)]


def test_metric_stream_splits_after_413():
    client = FakeClient(too_large_over=30)
    stream = MetricStream(client, _lease(), interval_s=0.0, max_points=100)
    for step in range(100):
        stream.add(step, {"loss": float(step)})
    stream.flush(everything=True)
    assert [b.seq for b in client.batches] == list(range(len(client.batches)))
    assert _points(client.batches)["loss"] == [(s, float(s)) for s in range(100)]


# --- client retries -------------------------------------------------------------------------


def test_client_retries_retryable_statuses_then_succeeds():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response([503, 429][len(calls) - 1], headers={"Retry-After": "0"})
        assert request.headers["Authorization"] == "Bearer tok"
        return httpx.Response(200, json={"lease_expires_at": "2030-01-01T00:00:00Z", "cancel": True})

    client = SteadyClient("http://x", "tok", transport=httpx.MockTransport(handler), backoff_base_s=0.01)
    ack = client.heartbeat(7, Heartbeat(lease_id="L", step=3))
    assert ack.cancel and len(calls) == 3
    assert json.loads(calls[-1].content) == {"lease_id": "L", "step": 3}


def test_client_gives_up_at_the_deadline():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = SteadyClient("http://x", "tok", transport=httpx.MockTransport(handler), backoff_base_s=0.01, backoff_max_s=0.05)
    with pytest.raises(RetryableError):
        client.lease(1, deadline_s=0.3)


def test_client_maps_409_and_4xx_without_retrying():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        status = 409 if "heartbeat" in request.url.path else 422
        return httpx.Response(status, json={"detail": [{"loc": ["body", "x"], "msg": "no", "type": "value_error"}]})

    client = SteadyClient("http://x", "tok", transport=httpx.MockTransport(handler))
    with pytest.raises(LeaseLostError):
        client.heartbeat(1, Heartbeat(lease_id="L"))
    with pytest.raises(NonRetryableError) as info:
        client.lease(1)
    assert info.value.status_code == 422 and len(calls) == 2
    assert str(info.value).endswith("HTTP 422: body.x: no")  # the field and the reason reach the agent's log


def test_client_lease_204_means_nothing_queued():
    client = SteadyClient("http://x", "tok", transport=httpx.MockTransport(lambda r: httpx.Response(204)))
    assert client.lease(1) is None


def test_gpu_check_exits_cleanly_without_cuda():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-check")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "no CUDA device" in out.stdout or "bitwise reproducible" in out.stdout


@pytest.mark.parametrize("arg", ["{seed:>99999}", "{seed:{foo}}", "{device!r}", "{seed.real}"])
def test_the_worker_refuses_a_placeholder_that_is_not_a_plain_name(tmp_path, arg):
    """Defence in depth: a spec that reached the worker unchecked is not padded, nested or converted."""
    spec = {"framework": "torch", "seed": 1, "determinism": "none", "command": ["python", "train.py", arg]}
    with pytest.raises(PlaceholderError, match="command argument"):
        RunProcess(spec, run_dir=str(tmp_path / "r"), device="cpu").argv()


def test_a_stopping_agents_calls_give_up_at_its_shutdown_deadline():
    """Against a server that is gone, a call retries for its whole deadline (120 s by default); once the
    agent stops, every call ends at the shutdown deadline instead, and none starts after it."""
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SteadyClient(f"http://127.0.0.1:{port}", "t", retry_deadline_s=120.0, backoff_base_s=0.05,
                          backoff_max_s=0.2)
    cutoff = time.monotonic() + 1.0
    client.stop_by(cutoff)
    t0 = time.monotonic()
    with pytest.raises(RetryableError):
        client.heartbeat(1, Heartbeat(lease_id="l", step=0))
    # retried until the cutoff (less than one backoff before it: a lower bound load cannot break), and gave up
    # there, not at the 120 s retry deadline (the upper bound leaves a loaded machine 29 s of slack)
    assert cutoff - 0.25 <= time.monotonic() < t0 + 30.0
    while time.monotonic() <= cutoff:  # a deadline to pass, not a race: nothing else happens meanwhile
        time.sleep(0.05)
    with pytest.raises(RetryableError, match="shutting down"):
        client.fail(1, RunFailure(lease_id="l", kind="error", error="x"))
    client.close()
