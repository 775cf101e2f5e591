"""Packed series on the wire: strict base64 both ways, and a series packed by this process is
not decoded back, nor decoded again as a batch's field."""

from __future__ import annotations

import base64
import struct

import pydantic
import pytest

from steady.worker.contract import protocol
from steady.worker.contract.protocol import MetricBatch, Series

BAD = ["AA==AA", "@@@@", "AAA", "==", "AA=A", "AA\nAA", " AAAA"]


@pytest.mark.parametrize("simd", [True, False], ids=["pybase64", "binascii"])
def test_strict_base64_decoding_on_either_path(simd, monkeypatch):
    if not simd:
        monkeypatch.setattr(protocol, "_pybase64_decode", None)
    raw = struct.pack("<3d", 1.5, float("nan"), -0.0)
    assert protocol.b64decode_strict(base64.b64encode(raw).decode()) == raw
    for bad in BAD:
        with pytest.raises(ValueError):
            protocol.b64decode_strict(bad)


def test_a_series_packed_here_is_not_decoded_back(monkeypatch):
    decoded = []
    real = protocol.b64decode_strict
    monkeypatch.setattr(protocol, "b64decode_strict", lambda text: decoded.append(text) or real(text))
    series = [Series.packed(k, [0, 1, 2], [0.5, 1.5, 2.5], dtype="float32") for k in ("a", "b")]
    batch = MetricBatch(lease_id="L", seq=0, series=series)
    assert decoded == []  # neither when packed nor when the batch took the series in
    assert batch.series[0].unpacked() == ([0, 1, 2], [0.5, 1.5, 2.5]) and batch.series[0].dtype == "float32"
    # what arrives over the wire is decoded (once) and checked
    wire = MetricBatch.model_validate_json(batch.model_dump_json(exclude_none=True))
    assert len(decoded) == 4 and wire.series[1].packed_bytes() == series[1].packed_bytes()
    with pytest.raises(pydantic.ValidationError, match="invalid base64"):
        Series(key="a", steps_b64="AAAAAAAAAAA=", values_b64="@@@@@@@@@@@=")
    with pytest.raises(pydantic.ValidationError):
        Series.packed("not a key!", [0], [1.0])  # packing here still validates everything but the base64
