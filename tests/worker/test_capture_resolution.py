"""A value captured from stdout carries the precision it was printed with (the unit of its last digit),
through the event file and the metric batch to the server (``steady.worker.agent.capture``, ``loop``)."""

from __future__ import annotations

import json

import pytest

from steady.worker.agent.capture import Capture
from steady.worker.agent.presets import printed_resolution
from steady.worker.agent.client import NonRetryableError
from steady.worker.agent.loop import MetricStream
from steady.worker.contract.protocol import DEFAULT_CAPTURE_PATTERN


class _Lease:
    lease_id, run_id = "l", 7


LEASE = _Lease()


@pytest.mark.parametrize(("text", "unit"), [("0.1234", 1e-4), ("2.31e-1", 1e-3), ("12", 1.0), ("1.50", 1e-2),
                                            ("-3.0E+2", 10.0), ("nan", None), ("inf", None), ("x", None)])
def test_printed_resolution(text, unit):
    assert printed_resolution(text) == (pytest.approx(unit) if unit is not None else None)


def test_stdout_values_carry_their_printed_resolution_into_the_batch(tmp_path):
    out, events = tmp_path / "output.log", tmp_path / "events.jsonl"
    out.write_text("step 0 loss 0.1234\nstep 1 loss 0.12\n")
    cap = Capture(events_path=str(events), output_path=str(out), roots=[str(tmp_path)], tensorboard=False,
                  patterns=[DEFAULT_CAPTURE_PATTERN])
    cap.close()
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["r"] for e in lines] == [{"loss": pytest.approx(1e-4)}, {"loss": pytest.approx(1e-2)}]
    stream = MetricStream(client=None, lease=LEASE, interval_s=1.0, max_points=100)  # type: ignore[arg-type]
    for e in lines:
        stream.add(e["s"], e["v"], e.get("t"), e.get("r"))
    stream.add(2, {"acc": 0.5})  # an SDK value: binary
    batch = stream._next_batch()
    assert batch is not None
    by_key = {s.key: s for s in batch.series}
    assert by_key["loss"].resolution == pytest.approx(1e-2) and by_key["acc"].resolution is None


class _OlderServer:
    """A server from before ``Series.resolution``: it forbids the field, as its models forbid any unknown one."""

    def __init__(self) -> None:
        self.stored: list = []

    def send_metrics(self, run_id, batch, *, deadline_s=None):
        if any(s.resolution is not None for s in batch.series):
            raise NonRetryableError("body.series.0.resolution: Extra inputs are not permitted", 422)
        self.stored.append(batch)


def test_an_older_server_gets_the_values_without_their_resolution():
    server = _OlderServer()
    stream = MetricStream(client=server, lease=LEASE, interval_s=0.0, max_points=100)  # type: ignore[arg-type]
    stream.add(0, {"loss": 0.1234}, None, {"loss": 1e-4})
    stream.flush(everything=True)
    stream.add(1, {"loss": 0.1}, None, {"loss": 1e-1})
    stream.flush(everything=True)
    assert [[(s.key, s.unpacked(), s.resolution) for s in b.series] for b in server.stored] == [
        [("loss", ([0], [0.1234]), None)], [("loss", ([1], [0.1]), None)]]
    assert [b.seq for b in server.stored] == [0, 1]
