"""The distributed layer as a source: when repeats of a multi-process run differ, was it the reduction or
the ranks' own state?

Reads each run's ``distributed`` record (``steady.worker.contract.distributed.summarize``): per rank the
digests of the gradients it computed and of the gradients its optimizer stepped with, per optimizer step,
and the digests of its named state. Two findings, each from digests alone:

* **per-rank state** — within one run, a rank disagrees with rank 0 on what data parallelism keeps equal on
  every rank: the order in which it registers its parameters, the values it holds under a parameter name
  after the first synchronisation, or its final parameters. DDP synchronises by position, so a rank whose
  parameters are registered in another order (a per-rank ``PYTHONHASHSEED`` iterating a set) holds other
  tensors under the same names (huggingface/transformers #48162).
* **reduction** — between two repeats, at the first optimizer step where anything differs, every rank
  computed bitwise the same gradients in both runs, and the gradients after the all-reduce differ: the
  summation order across ranks (an order that varies, the bucket layout: pytorch#30509) made the
  difference, not the kernels of the forward and backward passes. A sum of two values is the same in
  either order (IEEE 754 addition is commutative), so with 2 ranks the order cannot change the bits; it
  can from 3 ranks on, where (a + b) + c and (a + c) + b may round differently.

Pure: plain Python on mappings.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DistributedCause", "distributed_cause", "rank_disagreement"]

PER_RANK_STATE, REDUCTION = "per_rank_state", "reduction"


@dataclass(frozen=True)
class DistributedCause:
    kind: str  # per_rank_state | reduction
    detail: str
    step: int | None = None  # the optimizer step (1 = the first update) where the reduction first differed


def _ranks(record: Any) -> list[Mapping[str, Any]]:
    ranks = record.get("ranks") if isinstance(record, Mapping) else None
    return [r for r in ranks if isinstance(r, Mapping)] if isinstance(ranks, list) else []


def rank_disagreement(record: Mapping[str, Any]) -> str | None:
    """Why a rank of one run disagrees with rank 0 on state that data parallelism keeps equal; None if none does."""
    ranks = _ranks(record)
    if len(ranks) < 2:
        return None
    ref = ranks[0]
    for r in ranks[1:]:
        k = r.get("rank")
        if ref.get("model") and r.get("model") and list(r["model"]) != list(ref["model"]):
            mine, theirs = list(r["model"]), list(ref["model"])
            i = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
            where = (f"{mine[i]!r} where rank 0 has {theirs[i]!r}" if i < min(len(mine), len(theirs))
                     else f"{len(mine)} names where rank 0 has {len(theirs)}")
            return (f"per-rank state: rank {k} registers its parameters in another order than rank 0 (position {i}: "
                    f"{where}), so DDP, which synchronises by position, gives it other values under those names")
        for field, what in (("named_state", "after the first synchronisation"), ("named_final", "at the end")):
            if ref.get(field) and r.get(field) and r[field] != ref[field]:
                return f"per-rank state: rank {k} holds other values than rank 0 under the same parameter names {what}"
        if ref.get("final_weights") and r.get("final_weights") and r["final_weights"] != ref["final_weights"]:
            return f"per-rank state: rank {k}'s final parameters differ from rank 0's (the replicas diverged)"
    return None


def _reduction_step(a: Mapping[str, Any], b: Mapping[str, Any]) -> int | None:
    """The first optimizer step (1-based) where two runs' ranks computed the same gradients and stepped with
    different ones; None when they never differ or the computed gradients differ first."""
    ra, rb = _ranks(a), _ranks(b)
    if len(ra) != len(rb) or len(ra) < 2:
        return None
    steps = [(list(x.get("steps") or []), list(y.get("steps") or [])) for x, y in zip(ra, rb)]
    n = min(min(len(x), len(y)) for x, y in steps)
    for s in range(n):
        if not all(x[s][0] and y[s][0] for x, y in steps):  # a rank recorded no computed gradients: no claim
            return None
        local_same = all(x[s][0] == y[s][0] for x, y in steps)
        reduced_same = all(x[s][1] == y[s][1] for x, y in steps)
        if local_same and reduced_same:
            continue
        return s + 1 if local_same else None
    return None


def distributed_cause(records: Sequence[Any]) -> DistributedCause | None:
    """The distributed layer's part in a difference between repeats (the first run is the reference), from
    their ``distributed`` records (None for a run without one); None when the records show none."""
    present = [r for r in records if _ranks(r)]
    if not present:
        return None
    for record in present:
        why = rank_disagreement(record)
        if why is not None:
            return DistributedCause(PER_RANK_STATE, why)
    if len(present) < len(records):
        return None
    ref = present[0]
    for other in present[1:]:
        step = _reduction_step(ref, other)
        if step is not None:
            n = len(_ranks(ref))
            return DistributedCause(REDUCTION, (
                f"reduction: at update {step} every one of the {n} ranks computed bitwise the same gradients in both "
                "runs and the all-reduced gradients differ (the summation order across ranks, or the bucket layout)"),
                step)
    return None
