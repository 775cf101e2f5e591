"""The data order of PyTorch ``DataLoader``\\ s, digested without any user code.

Attribution can only say "data order" when runs carry data-order digests; most training code never
calls ``sdk.log_data_order``. This hook watches the indices a loader's sampler hands out, the one
place where torch's data order is visible whatever the dataset, sampler or worker count:
``_BaseDataLoaderIter._next_index`` (private, but it is what the single-process and the
multi-worker iterators both call, in the main process, in the order the sampler yields).

* **Nothing is drawn.** The hook only reads what the sampler returns after torch asked for it: no
  extra ``iter()``, no RNG draw, no change of prefetching, so a seeded run's results are bitwise
  those of the same run without the hook.
* **Bounded memory.** Each epoch (one pass of a sampler iterator) is hashed as it goes, in the
  ``steady-order-v1`` bytes of :func:`steady.worker.contract.digests.order_digest`, so one loader's automatic
  digest equals the digest ``sdk.log_data_order`` would record for the same indices.
* **Which loader.** Loaders are told apart by their index sampler (alive at the time); the run's
  data order is the loader that handed out the most indices (the training loader, normally), ties
  to the first one used; each of its passes is one epoch. A sampler that yields something other
  than integers (an ``IterableDataset`` has no indices to see) is left out.

The digests are written when the run ends, and only when the code recorded no data order itself:
an explicit ``sdk.log_data_order`` always wins.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from steady.worker.contract.digests import ORDER_MAGIC


def _ref(obj: Any) -> Callable[[], Any]:
    """A weak reference when the object takes one (a generator holds its sampler and dataset
    alive), else a strong one (``range`` and list iterators hold no more than the indices)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class _Loader:
    """The epochs of one index sampler: a running SHA-256 per pass, and how many indices it gave."""

    def __init__(self) -> None:
        self.epochs: list[Any] = []  # hashlib objects, one per pass
        self.n_indices = 0
        self.unreadable = False  # yielded something that is not integers
        self._current: Callable[[], Any] = lambda: None  # the sampler iterator of the pass in progress

    def add(self, sampler_iter: Any, index: Any) -> None:
        if self.unreadable:
            return
        if sampler_iter is not self._current():  # torch made a fresh iterator: a new pass began
            self._current = _ref(sampler_iter)
            self.epochs.append(hashlib.sha256(ORDER_MAGIC))
        try:
            arr = np.asarray(index)
        except (TypeError, ValueError):  # ragged or odd: this loader's order cannot be told
            arr = np.asarray("unreadable")
        if arr.size == 0:  # an empty batch adds no index (np.asarray([]) is float)
            return
        if arr.dtype.kind not in "iu":
            self.unreadable = True
            return
        arr = np.ascontiguousarray(arr.reshape(-1), dtype="<i8")
        self.epochs[-1].update(arr.tobytes())
        self.n_indices += int(arr.size)


class DataOrderHook:
    """Installed on torch's DataLoader iterators; :meth:`digests` gives the run's data order."""

    def __init__(self) -> None:
        self.loaders: list[_Loader] = []
        self._by_sampler: weakref.WeakKeyDictionary[Any, _Loader] = weakref.WeakKeyDictionary()

    def observe(self, it: Any, index: Any) -> None:
        sampler = it._index_sampler
        try:
            loader = self._by_sampler.get(sampler)
            if loader is None:
                loader = self._by_sampler[sampler] = _Loader()
                self.loaders.append(loader)
        except TypeError:  # a sampler that cannot be weakly referenced or hashed: not followed
            return
        loader.add(it._sampler_iter, index)

    def digests(self) -> list[str]:
        """One digest per pass of the loader that handed out the most indices (ties: the first)."""
        readable = [ld for ld in self.loaders if not ld.unreadable and ld.n_indices > 0]
        if not readable:
            return []
        main = max(readable, key=lambda ld: ld.n_indices)  # max keeps the first of equals
        return [h.hexdigest() for h in main.epochs]


def install_torch(record: Callable[[list[str]], None]) -> Callable[[], None]:
    """Hook torch's DataLoader iterators; the returned function removes the hook and passes the
    digests (possibly none) to ``record``."""
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    original = base.__dict__["_next_index"]
    hook = DataOrderHook()

    def _next_index(self: Any) -> Any:
        index = original(self)  # StopIteration ends the pass, as before
        try:
            hook.observe(self, index)
        except Exception:  # noqa: BLE001 - never disturb the training for a digest
            pass
        return index

    base._next_index = _next_index  # type: ignore[method-assign]

    def finish() -> None:
        base._next_index = original  # type: ignore[method-assign]
        record(hook.digests())

    return finish
