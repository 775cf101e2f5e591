"""The metric batch's short way past routing (app/web/fastpath.py, ``MetricsFastPath``) stores and answers
what the route stores and answers."""

from __future__ import annotations

import math
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from steady.server.models import MetricChunk
from steady.server.web import fastpath
from steady.worker.contract.protocol import FLOAT_DTYPES, MetricBatch, Series
from tests.api.helpers import error_of, lease, register, spec


class ShortWay:
    """Counts the batches the short way answered, and turns it off on demand (the route then answers all)."""

    def __init__(self, monkeypatch) -> None:
        self.answered = 0
        self.on = True
        real = fastpath.MetricsFastPath._answer

        async def answer(this, scope, run_id, body):
            if not self.on:
                return None
            out = await real(this, scope, run_id, body)
            self.answered += out is not None
            return out

        monkeypatch.setattr(fastpath.MetricsFastPath, "_answer", answer)


def _two_runs(api) -> list[dict]:
    api.post("/api/v1/studies", json=spec(seeds=[0, 1], repeats=1, determinism=["strict"]))
    return [lease(api, register(api, name=f"w{i}")) for i in range(2)]


def _chunks(api, run_id: int, seq: int) -> list[tuple]:
    t = MetricChunk.__table__
    with api.app.state.database.read() as session:
        return [tuple(r) for r in session.execute(
            select(t.c.key, t.c.n, t.c.step_min, t.c.step_max, t.c.steps, t.c["values"], t.c.dtype, t.c.resolution)
            .where(t.c.run_id == run_id, t.c.seq == seq).order_by(t.c.key)
        )]


def test_a_batch_answered_past_the_route_is_the_routes_answer(api, monkeypatch):
    way = ShortWay(monkeypatch)
    ours, theirs = _two_runs(api)
    values = [0.5, math.nan, math.inf, -math.inf, -0.0]
    body = {"lease_id": ours["lease_id"], "seq": 0,
            "series": [Series.packed("loss", [0, 2, 4, 6, 8], values).model_dump(exclude_none=True),
                       Series(key="acc", steps=[3, 1, 7], values=[1.0, 2.0, 3.0]).model_dump(mode="json")]}
    fast = api.post(f"/api/v1/runs/{ours['run_id']}/metrics", role="worker", json=body)
    assert fast.status_code == 200 and way.answered == 1
    again = api.post(f"/api/v1/runs/{ours['run_id']}/metrics", role="worker", json=body)
    assert again.json() == {**fast.json(), "duplicate": True} and way.answered == 2
    way.on = False
    routed = api.post(f"/api/v1/runs/{theirs['run_id']}/metrics", role="worker",
                      json={**body, "lease_id": theirs["lease_id"]})
    assert routed.status_code == 200 and way.answered == 2
    assert fast.json() == {**routed.json(), "run_id": ours["run_id"]}
    assert fast.headers["content-type"] == routed.headers["content-type"]
    for name in ("x-content-type-options", "x-frame-options", "content-security-policy"):
        assert fast.headers[name] == routed.headers[name]
    assert _chunks(api, ours["run_id"], 0) == _chunks(api, theirs["run_id"], 0)
    packed = api.get(f"/api/v1/runs/{ours['run_id']}/metrics/loss", params={"format": "packed"}).json()
    assert Series(key="loss", steps_b64=packed["steps_b64"], values_b64=packed["values_b64"]).packed_bytes() == \
        Series.packed("loss", [0, 2, 4, 6, 8], values).packed_bytes()


def test_refusals_past_the_short_way_are_the_routes(make_api, monkeypatch):
    api = make_api(max_batch_points=4)
    way = ShortWay(monkeypatch)
    ours, _ = _two_runs(api)
    url = f"/api/v1/runs/{ours['run_id']}/metrics"
    good = {"lease_id": ours["lease_id"], "seq": 0, "series": [{"key": "loss", "steps": [1], "values": [0.5]}]}
    # a field that does not validate: the route's 422 names it
    bad = api.post(url, role="worker", json={**good, "seq": -1})
    assert bad.status_code == 422 and "seq" in error_of(bad)["loc"]
    bad = api.post(url, role="worker", json={**good, "series": [{"key": "loss", "steps": [1], "values": ["one"]}]})
    assert bad.status_code == 422 and "values" in error_of(bad)["loc"]
    # not a worker's token, no token, a lease that is not this run's, over the points limit
    assert api.post(url, role="user", json=good).status_code == 403
    assert api.client.post(url, json=good).status_code == 401
    lost = api.post(url, role="worker", json={**good, "lease_id": "f" * 32})
    assert lost.status_code == 409 and error_of(lost)["type"] == "lease_lost"
    big = api.post(url, role="worker", json={**good, "series": [{"key": "loss", "steps": [1, 2, 3, 4, 5],
                                                                  "values": [0.0] * 5}]})
    assert big.status_code == 413
    assert way.answered == 0 and _chunks(api, ours["run_id"], 0) == []
    assert api.post(url, role="worker", json=good).status_code == 200 and way.answered == 1


_BITS = st.integers(min_value=0, max_value=2**64 - 1).map(lambda b: struct.unpack("<d", struct.pack("<Q", b))[0])
_FLOATS = st.one_of(_BITS, st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324]),
                    st.floats(allow_nan=False, allow_infinity=False))
_STEPS = st.integers(min_value=-2**63, max_value=2**63 - 1)


@st.composite
def _series(draw, key: str) -> Series:
    n = draw(st.integers(min_value=1, max_value=40))
    if draw(st.booleans()):  # evenly spaced, the usual case (stored without a steps blob)
        first, stride = draw(st.integers(-10**6, 10**6)), draw(st.integers(1, 1000))
        steps = [first + stride * i for i in range(n)]
    else:
        steps = draw(st.lists(_STEPS, min_size=n, max_size=n))
    values = draw(st.lists(_FLOATS, min_size=n, max_size=n))
    dtype = draw(st.sampled_from((None, *FLOAT_DTYPES)))
    if draw(st.booleans()):
        return Series.packed(key, steps, values, dtype)
    resolution = draw(st.sampled_from((None, 1e-4)))
    return Series(key=key, steps=steps, values=values, dtype=dtype, resolution=resolution)


_BATCHES = st.lists(st.sampled_from(["loss", "acc", "train/lr"]), min_size=1, max_size=3, unique=True).flatmap(
    lambda keys: st.tuples(*(_series(k) for k in keys)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=_BATCHES)
def test_the_short_way_stores_the_routes_bits(api, monkeypatch, batch):
    """Any batch, packed or listed, NaN payloads and ±Inf included: the chunks the short way stores are the
    route's, byte for byte, and so are the answers."""
    if not hasattr(api, "runs"):
        api.runs, api.way, api.seq = _two_runs(api), ShortWay(monkeypatch), 0
    (ours, theirs), way = api.runs, api.way
    seq = api.seq = api.seq + 1
    body = MetricBatch(lease_id=ours["lease_id"], seq=seq, series=list(batch)).model_dump_json(exclude_none=True)
    answered = way.answered
    way.on = True
    headers = {**api.h("worker"), "Content-Type": "application/json"}
    fast = api.client.post(f"/api/v1/runs/{ours['run_id']}/metrics", content=body, headers=headers)
    assert way.answered == answered + 1, fast.text
    way.on = False
    routed = api.client.post(f"/api/v1/runs/{theirs['run_id']}/metrics", headers=headers,
                             content=body.replace(ours["lease_id"], theirs["lease_id"]))
    assert (fast.status_code, routed.status_code) == (200, 200), (fast.text, routed.text)
    assert fast.json() == {**routed.json(), "run_id": ours["run_id"]}
    assert _chunks(api, ours["run_id"], seq) == _chunks(api, theirs["run_id"], seq) != []


def test_a_body_over_the_limit_is_refused_by_the_application(make_api, monkeypatch):
    """A body whose declared length is over STEADY_MAX_BODY_BYTES goes straight on (not read first), and one
    that is longer than it declares is read no further than the limit: both are the application's 413."""
    api = make_api(max_body_bytes=2048)
    way = ShortWay(monkeypatch)
    ours, _ = _two_runs(api)
    url = f"/api/v1/runs/{ours['run_id']}/metrics"
    big = {"lease_id": ours["lease_id"], "seq": 0, "series": [{"key": "loss", "steps": list(range(400)),
                                                                "values": [0.5] * 400}]}
    refused = api.post(url, role="worker", json=big)
    assert refused.status_code == 413 and "STEADY_MAX_BODY_BYTES" in error_of(refused)["msg"]

    def chunks():
        yield b'{"lease_id": "' + ours["lease_id"].encode() + b'", "seq": 0, "series": ['
        yield b" " * 4096
        yield b"]}"

    streamed = api.client.post(url, content=chunks(), headers={**api.h("worker"), "Content-Type": "application/json"})
    assert streamed.status_code == 413 and way.answered == 0
