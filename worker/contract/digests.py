"""SHA-256 digests of weights, optimizer state and data order, framework-free.

Byte serialisation (version 1), so a digest means the same thing on every stack:

* **state digest** (weights, optimizer state): ``b"steady-state-v1\\n"``, then for every
  entry in ascending order of its name (UTF-8 bytes): the name, ``b"\\0"``, the NumPy dtype
  string in little-endian form (``"<f4"``, ``"<i8"``, ``"|u1"``...), ``b"\\0"``, the shape as
  comma-separated decimal integers, ``b"\\0"``, the byte length as 8-byte little-endian,
  then the raw C-contiguous little-endian bytes. Entries that are not arrays
  (hyper-parameters, a vocabulary) are written with dtype ``"json"`` and shape ``""``; their
  bytes are canonical JSON (sorted keys, no whitespace, ``allow_nan``).
* **data-order digest**: ``b"steady-order-v1\\n"`` followed by the sample indices actually
  fed during the epoch, in order, as little-endian int64.
* **file digest**: plain SHA-256 of the file's bytes.

Framework adapters (``steady.worker.inrun.frameworks.torch`` / ``.tensorflow``) turn tensors into NumPy
arrays and call :func:`state_digest`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

STATE_MAGIC = b"steady-state-v1\n"
ORDER_MAGIC = b"steady-order-v1\n"


def _canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str).encode()


def state_digest(entries: Mapping[str, Any]) -> str:
    """Digest a mapping name -> array (anything ``np.asarray`` takes) or JSON-able value."""
    import numpy as np  # here, not at the top: a run whose code uses no NumPy does not import it for the SDK

    h = hashlib.sha256(STATE_MAGIC)
    for name in sorted(entries, key=lambda n: n.encode("utf-8")):
        value = entries[name]
        if isinstance(value, (np.ndarray, np.generic)):
            arr = np.asarray(value)
            if arr.dtype.kind not in "biufc":
                raise TypeError(f"cannot digest {name!r}: dtype {arr.dtype} is not numeric")
            arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
            dtype, shape, raw = arr.dtype.str, ",".join(str(d) for d in arr.shape), arr.tobytes(order="C")
        else:
            dtype, shape, raw = "json", "", _canonical_json(value)
        h.update(name.encode("utf-8") + b"\0" + dtype.encode() + b"\0" + shape.encode() + b"\0")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.hexdigest()


def order_digest(indices: Iterable[int] | np.ndarray) -> str:
    """Digest the order in which sample indices were fed during one epoch."""
    import numpy as np

    arr = np.ascontiguousarray(np.fromiter(indices, dtype="<i8") if not isinstance(indices, np.ndarray) else indices, dtype="<i8")
    return hashlib.sha256(ORDER_MAGIC + arr.tobytes()).hexdigest()


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
