"""Bounded worker buffers: the incremental event reader, catch-up batch sizing, the step-time
summary, and (slow) a real agent against a real server that stalls mid-run."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from tests.worker.test_worker_units import FakeClient, _lease, _points
from steady.worker.inrun import steptimes
from steady.worker.agent.loop import MetricStream, batch_size
from steady.worker.contract.events import EventReader, EventWriter, control_events
from steady.worker.contract.protocol import MAX_BATCH_POINTS
from steady.worker.agent.runner import RunProcess

REPO = Path(__file__).resolve().parents[2]


def _write_steps(path: Path, n: int) -> None:
    w = EventWriter(str(path))
    for step in range(n):
        w.write({"e": "m", "s": step, "v": {"loss": step * 0.25}})
    w.close()


def test_reader_takes_a_bounded_window_and_resumes_from_its_offset(tmp_path):
    path = tmp_path / "events.jsonl"
    _write_steps(path, 1000)
    reader = EventReader(str(path))
    first = reader.read_new(max_bytes=4096)
    assert 0 < len(first) < 1000 and len(first) * 20 <= 4096  # a window, not the whole file
    assert [e["s"] for e in first] == list(range(len(first)))
    data = path.read_bytes()
    assert reader.offset == len(b"".join(data.splitlines(keepends=True)[: len(first)]))
    assert reader.unread_bytes() == len(data) - reader.offset
    # A new reader started at the offset (e.g. after a restart) continues exactly there.
    resumed = EventReader(str(path), offset=reader.offset)
    rest = []
    while batch := resumed.read_new(max_bytes=777):
        rest.extend(batch)
    assert [e["s"] for e in first + rest] == list(range(1000))
    assert resumed.unread_bytes() == 0


def test_reader_keeps_a_torn_last_line_until_it_is_complete(tmp_path):
    path = tmp_path / "events.jsonl"
    line = b'{"e":"m","s":7,"v":{"loss":0.5}}\n'
    path.write_bytes(line + line[:10])
    reader = EventReader(str(path))
    assert [e["s"] for e in reader.read_new(max_bytes=len(line) + 5)] == [7]
    assert reader.offset == len(line)  # the partial line is not consumed
    assert reader.read_new(max_bytes=100) == []
    assert reader.offset == len(line) and reader.unread_bytes() == 10
    with open(path, "ab") as f:
        f.write(line[10:])
    assert reader.read_new(max_bytes=3) == [] and reader.read_new(max_bytes=3) == []  # still torn
    assert [e["s"] for e in reader.read_new(max_bytes=1000)] == [7]
    assert reader.offset == 2 * len(line)


def test_control_events_skip_the_metric_backlog(tmp_path):
    path = tmp_path / "events.jsonl"
    w = EventWriter(str(path))
    w.write({"e": "fingerprint", "value": {"os": "x"}})
    for step in range(5000):
        w.write({"e": "m", "s": step, "v": {"loss": 1.0}})
    w.write({"e": "digest", "kind": "final_weights", "value": "ab", "epoch": None})
    w.write({"e": "result", "final_metrics": {"loss": 1.0}, "timings": {}})
    w.close()
    with open(path, "ab") as f:
        f.write(b'{"e":"error"')  # a torn line is not an event yet
    kinds = [e["e"] for e in control_events(str(path), 0, chunk_bytes=1000)]
    assert kinds == ["fingerprint", "digest", "result"]
    after_first = len(path.read_bytes().split(b"\n")[0]) + 1
    assert [e["e"] for e in control_events(str(path), after_first, chunk_bytes=333)] == ["digest", "result"]


def test_batch_size_steady_and_catching_up():
    assert batch_size(300, backlog=False, steady=5000, limit=MAX_BATCH_POINTS) == 300
    assert batch_size(5000, backlog=False, steady=5000, limit=MAX_BATCH_POINTS) == 5000
    # a backlog: unread events in the file, or more than one steady batch waiting
    assert batch_size(60_000, backlog=True, steady=5000, limit=MAX_BATCH_POINTS) == 60_000
    assert batch_size(7000, backlog=False, steady=5000, limit=MAX_BATCH_POINTS) == 7000
    assert batch_size(900_000, backlog=True, steady=5000, limit=MAX_BATCH_POINTS) == MAX_BATCH_POINTS
    assert batch_size(0, backlog=True, steady=5000, limit=MAX_BATCH_POINTS) == 0


def test_metric_stream_sends_steady_batches_then_catches_up_without_loss():
    client = FakeClient()
    stream = MetricStream(client, _lease(), interval_s=0.0, max_points=1000, steady_points=100)
    for step in range(80):
        stream.add(step, {"loss": float(step)})
    stream.flush()
    assert [sum(len(s) for s in b.series) for b in client.batches] == [80]  # steady: what waits
    for step in range(80, 3080):
        stream.add(step, {"loss": float(step), "step_time": 0.5})
    assert not stream.wants_more()  # the window (the limit) is full: the reader stops reading
    stream.backlog = True
    stream.flush(everything=True)
    sizes = [sum(len(s) for s in b.series) for b in client.batches[1:]]
    assert max(sizes) == 1000 and sum(sizes) == 6000  # catching up: batches of the limit
    assert [b.seq for b in client.batches] == list(range(len(client.batches)))
    pts = _points(client.batches)
    assert pts["loss"] == [(s, float(s)) for s in range(3080)]
    assert pts["step_time"] == [(s, 0.5) for s in range(80, 3080)]


def test_metric_stream_keeps_the_unconfirmed_batch_and_its_seq_while_catching_up():
    from steady.worker.agent.client import RetryableError

    client = FakeClient(fail_first=RetryableError)
    stream = MetricStream(client, _lease(), interval_s=0.0, max_points=500, steady_points=50)
    stream.backlog = True
    for step in range(1200):
        stream.add(step, {"loss": float(step)})
    with pytest.raises(RetryableError):
        stream.flush()
    assert stream.unsent is not None and stream.unsent.seq == 0 and stream.pending_points == 700
    stream.flush(everything=True)
    assert [b.seq for b in client.batches] == [0, 1, 2]
    assert _points(client.batches)["loss"] == [(s, float(s)) for s in range(1200)]


@pytest.mark.parametrize("n", [1, 2, 7, 20_001])
def test_step_time_summary_is_exact_in_bounded_memory(tmp_path, monkeypatch, n):
    monkeypatch.setattr(steptimes, "BUFFER_VALUES", 64)  # spill to the file early
    monkeypatch.setattr(steptimes, "CHUNK_VALUES", 333)
    monkeypatch.setattr(steptimes, "SMALL_BUCKET", 50)  # force several radix passes
    rng = np.random.default_rng(n)
    values = rng.lognormal(-9, 0.4, n)
    values[::5] = 1e-5  # ties
    values[1::11] = np.nan  # not a step time
    store = steptimes.StepTimes(str(tmp_path / "st.f64"))
    for v in values.tolist():
        store.add(v)
    finite = values[np.isfinite(values)]
    assert len(store._buffer) < 64
    summary = store.summary()
    assert summary["steps"] == len(finite)
    assert summary["step_time_median_s"] == statistics.median(finite.tolist()) == np.median(finite)
    assert summary["train_s"] == math.fsum(finite.tolist())
    assert summary["step_time_mean_s"] == math.fsum(finite.tolist()) / len(finite)
    ordered = np.sort(finite)
    for k in (0, len(finite) // 3, len(finite) - 1):
        assert store.kth(k) == ordered[k]


def test_step_time_selection_orders_negative_zero_and_positive_values(tmp_path, monkeypatch):
    monkeypatch.setattr(steptimes, "SMALL_BUCKET", 1)
    store = steptimes.StepTimes(str(tmp_path / "st.f64"))
    values = [3.0, -2.0, 0.0, -1e-300, 5e-324, float("inf"), 1.5, -7.25]
    for v in values:
        store.add(v)
    finite = sorted(v for v in values if math.isfinite(v))
    assert [store.kth(k) for k in range(len(finite))] == finite


def test_run_outcome_is_known_before_the_metric_backlog_is_read(tmp_path):
    script = tmp_path / "many.py"
    script.write_text("from steady import sdk\nfor i in range(20000):\n    sdk.log(step=i, loss=i * 0.5)\n")
    spec = {"framework": "python", "entrypoint": str(script), "seed": 0, "repeat": 0, "determinism": "none",
            "time_limit_s": 120}
    proc = RunProcess(spec, run_dir=str(tmp_path / "run"))
    proc.start()
    proc.wait(120)
    outcome = proc.outcome()  # reads what the run reported, not its 20 000 metric events
    assert outcome.ok, outcome.error
    assert proc.collected.result is not None and proc.reader.offset == 0
    steps = []
    while events := proc.poll(max_bytes=64 * 1024):
        assert len(events) < 2000
        steps.extend(e["s"] for e in events if e["e"] == "m")
    assert steps == list(range(20000))
    timings = proc.collected.result["timings"]
    assert timings["steps"] == 19999 and timings["step_time_median_s"] > 0


@pytest.mark.slow
def test_agent_memory_stays_flat_and_no_point_is_lost_when_the_server_stalls(tmp_path):
    from bench.worker_memory_bench import run_bench

    result = run_bench(200_000, 3.0, tmp_path, sample_s=0.2, timeout_s=600)
    detail = json.dumps({k: v for k, v in result.items() if k != "samples"}, default=str)[:3000]
    assert result["run_status"] == "completed", detail
    assert result["stall_began_s"] is not None and result["stall_ended_s"] is not None, detail
    for key in ("loss", "step_time"):
        assert result[key]["lost"] == 0 and result[key]["duplicates"] == 0, detail
        assert result[key]["points"] == result[key]["expected"], detail
    assert result["loss"]["values_exact"], detail
    assert result["agent_rss_mb"]["growth"] <= 50, detail
    assert result["run_rss_mb"]["growth"] <= 50, detail
