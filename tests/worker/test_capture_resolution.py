"""A value captured from stdout carries the precision it was printed with (the unit of its last digit),
through the event file and the metric batch to the server (``steady.worker.agent.capture``, ``loop``)."""

from __future__ import annotations

import json

import pytest

from steady.worker.agent.capture import Capture, printed_resolution
from steady.worker.agent.loop import MetricStream
from steady.worker.contract.protocol import DEFAULT_CAPTURE_PATTERN


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
    stream = MetricStream(client=None, lease=None, interval_s=1.0, max_points=100)  # type: ignore[arg-type]
    stream.lease = type("L", (), {"lease_id": "l"})()  # type: ignore[assignment]
    for e in lines:
        stream.add(e["s"], e["v"], e.get("t"), e.get("r"))
    stream.add(2, {"acc": 0.5})  # an SDK value: binary
    batch = stream._next_batch()
    assert batch is not None
    by_key = {s.key: s for s in batch.series}
    assert by_key["loss"].resolution == pytest.approx(1e-2) and by_key["acc"].resolution is None
